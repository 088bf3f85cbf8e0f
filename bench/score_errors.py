"""How far inexact index scores fall from the float64 oracle, over many random pools.

The evidence for docs/spec.md §10.1 (the index score tolerance): one prefill case
(three requests, a 1403-token context, per-32-group scale bytes 110..140: ``tests/gpu``'s
``prefill-9-blocks`` case) drawn with seeds ``0 .. N-1``, scored by each backend of this
machine (``auto``: the C++ handlers on the CPU, the Triton kernels on a GPU; ``reference``:
the plain-jnp lowering) with bf16 queries kept (``q_round="none"``) and rounded to e4m3. For
each, the table gives the worst error of a seed in ulp of the score's magnitude (median and
maximum over the seeds), the seeds whose worst error passes 2 ulp (SPEC §10's old bound), and
the worst error as a fraction of ``oracle.index_score_tolerance`` (at most 1 by the bound)::

    python bench/score_errors.py --seeds 400
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import jax
import oracle
from conftest import SM_SCALE, prefill_index_case

import jax_mxfp4 as jm
from jax_mxfp4._src.dispatch.backend import backend_scope

BACKENDS = ("auto", "reference")
Q_ROUNDS = ("none", "e4m3")


def seed_errors(seed: int, q_round: str, scorers: dict) -> dict[str, tuple[float, float]]:
    """Per backend, the worst error of one seed's scores: (in ulp of the magnitude, as a
    fraction of the tolerance)."""
    rng = np.random.default_rng(seed)
    case = prefill_index_case(rng, [100, 3, 60], [64, 1400, 0], num_rows=200, num_heads=1,
                              num_blocks=12, table_width=12, num_pages=40, scale_lo=110,
                              scale_hi=140)
    static = dict(num_blocks=case.num_blocks, sm_scale=SM_SCALE, q_round=q_round)
    truth = oracle.index_scores(*case.args(), **static).astype(np.float64)
    live = np.isfinite(truth)
    magnitude = oracle.index_score_magnitudes(*case.args(), **static)[live]
    out = {}
    for name, scorer in scorers.items():
        got = np.asarray(scorer(*case.args(), num_blocks=case.num_blocks, q_round=q_round))
        err = np.abs(got[live] - truth[live])
        out[name] = ((err / oracle.ulp_f32(magnitude)).max(),
                     oracle.index_score_errors(got[live], truth[live], magnitude).max())
    return out


def scorer(backend: str):
    """``index_scores`` under ``backend`` (static options as keywords), jitted once per
    option set: every seed's case has the same shapes, so it compiles once, not per seed."""
    @functools.cache
    def jitted(num_blocks, q_round):
        return jax.jit(lambda *a: jm.index_scores(*a, num_blocks=num_blocks, sm_scale=SM_SCALE,
                                                  q_round=q_round))

    def score(*args, num_blocks, q_round):
        with backend_scope(backend):
            return jitted(num_blocks, q_round)(*args)
    return score


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=100)
    args = parser.parse_args()
    scorers = {name: scorer(name) for name in BACKENDS}
    rows = []
    for q_round in Q_ROUNDS:
        worst = {name: [] for name in BACKENDS}
        for seed in range(args.seeds):
            if sys.stderr.isatty():
                print(f"\rq_round={q_round} seed {seed + 1}/{args.seeds}", end="",
                      file=sys.stderr, flush=True)
            for name, errors in seed_errors(seed, q_round, scorers).items():
                worst[name].append(errors)
        for name in BACKENDS:
            ulps, fractions = np.array(worst[name]).T
            rows.append((name, q_round, np.median(ulps), ulps.max(), (ulps > 2).sum(),
                         fractions.max()))
    if sys.stderr.isatty():
        print(file=sys.stderr)
    print(f"{jax.devices()[0].device_kind}, {args.seeds} seeds")
    print("backend | q_round | worst ulp of magnitude: median | max | seeds over 2 ulp "
          "| max / tolerance")
    print("--- | --- | --- | --- | --- | ---")
    for name, q_round, median, most, over, fraction in rows:
        print(f"{name} | {q_round} | {median:.2f} | {most:.2f} | {over} | {fraction:.4f}")


if __name__ == "__main__":
    main()
