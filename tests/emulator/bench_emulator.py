"""Emulator speed: wall time and wave-instructions per second of every FlyDSL gfx950 kernel at
a small MiniMax-M3.1 decode shape (and the profile/MI355X estimate of each launch).

    .venv/bin/python tests/emulator/bench_emulator.py [--checks none]

Not collected by pytest (performance is measured here, never by timed unit tests). Shapes:
2 requests of ~300 tokens, 1 decode token each, 4 kv heads (= index heads, TP1), G = 16,
16 page slots per attention row; the split path with 4 partitions.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

import conftest as C  # noqa: E402
import harness  # noqa: E402
import test_emulator_flydsl as F  # noqa: E402

from cdna_emulator import ALL_CHECKS, format_profiles, profile  # noqa: E402
from jax_mxfp4._src.flydsl import abi  # noqa: E402
from jax_mxfp4._src.flydsl.code_object import code_object  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--checks", choices=["all", "none"], default="all")
    args = parser.parse_args()
    built = (None, {s.symbol: code_object(s.op, **{k: v for k, v in s.params().items()
                                                   if k != "op"})
                    for s in abi.minimax_specializations()})
    reports = []
    original = harness.run

    def recording(*a, **k):
        k["checks"] = ALL_CHECKS if args.checks == "all" else frozenset()
        report = original(*a, **k)
        reports.append(report)
        return report

    harness.run = recording
    rng = np.random.default_rng(0)
    contexts = np.array([[300, 300, 204, 204], [301, 301, 205, 205]], np.int32)
    cases = []
    for q in ("bf16", "e4m3"):
        attention = C.attention_case(rng, contexts, group=16, q_dtype=q, n_pages=16)
        for output in ("bf16", "mxfp8"):
            cases.append((f"attention direct q{q} {output}",
                          lambda a=attention, q=q, o=output: F.run_direct(built, a, q, o)))
        cases.append((f"attention split4+merge q{q}",
                      lambda a=attention, q=q: F.run_split(built, a, q, 4, "mxfp8")))
        for heads in (1, 4):
            spec = abi.Specialization("index_scores", q=q, heads=heads, tiling="decode")
            case = C.decode_index_case(rng, [301, 205], 1, num_heads=heads, num_blocks=3,
                                       num_pages=8, table_width=4, q_dtype=q)
            cases.append((f"index decode q{q} h{heads}",
                          lambda s=spec, c=case: F.run_index_scores(built, s, c)))
    for name, fn in cases:
        fn()  # parse and compile once
        reports.clear()
        started = time.perf_counter()
        fn()
        seconds = time.perf_counter() - started
        instructions = sum(r.instructions for r in reports)
        issues = sum(r.issues for r in reports)
        print(f"{name:36s} {seconds:6.2f} s  {instructions:8d} wave-instructions "
              f"{instructions / seconds:10,.0f}/s  {issues / seconds:8,.0f} issues/s")
    print()
    print(format_profiles([profile(r) for r in reports]))


if __name__ == "__main__":
    main()
