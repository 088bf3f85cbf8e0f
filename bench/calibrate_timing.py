"""Calibration of the MI355X timing model (cdna_emulator/timing.py) on launch bundles with
measured times: the table of bench/RESULTS.md ("Calibration"), and the fit of its five
parameters (``cdna_emulator.mi355x.Fitted``).

    python bench/calibrate_timing.py ../shared/calibration/bundles          # the table
    python bench/calibrate_timing.py ../shared/calibration/bundles --fit    # re-fit
    python bench/calibrate_timing.py DIR --fit --train b1_q4096_ctx8K,b4_q512_ctx8K,...

Each bundle (a folder with ``launch.json`` and its ``measured_us``) runs once in the emulator,
traced, on the model's sample of ``--workgroups`` workgroups; the model then re-times the
stored traces for each parameter set. The fit is a coordinate search over the sustained
clock and the three load latencies, each step with the launch cost that minimises the error;
the error is the geometric-mean error exp(mean |ln(estimate / measured)|) - 1 over the
``--train`` cells (all by default), and the table shows the held-out cells' separately.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import pickle
import sys
import time
from pathlib import Path

from cdna_emulator import cu_model, mi355x, timing
from cdna_emulator.bundle import read_bundle, run_bundle
from jax_mxfp4._src.core._table import format_table

LAUNCH_STEPS_US = [0.25 * i for i in range(61)]
BOUNDS = {"clock_ghz": (1.5, mi355x.CLOCK_HZ / 1e9), "l1_cycles": (40.0, 400.0),
          "l2_cycles": (100.0, 1500.0), "hbm_cycles": (300.0, 5000.0)}


@dataclasses.dataclass
class Cell:
    name: str
    measured_us: float
    report: object
    table: object


def load(directory: Path, workgroups: int, cache: Path | None) -> list[Cell]:
    """Each bundle of ``directory`` with a measured time, emulated (traced) on the model's
    sample, or read from ``cache`` where an earlier run left it."""
    cells = []
    for folder in sorted(p for p in directory.iterdir() if (p / "launch.json").exists()):
        bundle = read_bundle(folder)
        if not bundle.measured_us:
            continue
        stored = cache / f"{folder.name}_{workgroups}.pickle" if cache else None
        if stored is not None and stored.exists():
            cells.append(pickle.loads(stored.read_bytes()))
            continue
        started = time.perf_counter()
        report = run_bundle(bundle, workgroups=workgroups, trace=True).report
        if sys.stderr.isatty():
            print(f"{folder.name}: emulated in {time.perf_counter() - started:.0f} s",
                  file=sys.stderr)
        table = cu_model.instruction_table(report.code)
        report = dataclasses.replace(report, code=None, per_instruction=[])
        cells.append(Cell(folder.name, bundle.measured_us, report, table))
        if stored is not None:
            stored.parent.mkdir(parents=True, exist_ok=True)
            stored.write_bytes(pickle.dumps(cells[-1]))
    return cells


def error(ratios) -> tuple[float, float]:
    """(geometric-mean error, worst ratio or its inverse) of estimate / measured ratios."""
    logs = [abs(math.log(r)) for r in ratios]
    return math.exp(sum(logs) / len(logs)) - 1, math.exp(max(logs))


def timings(cells, fitted) -> dict:
    return {c.name: timing.estimate_traced(c.report, c.table, fitted) for c in cells}


def with_best_launch(cells, fitted, train) -> tuple:
    """``fitted`` with the launch cost that minimises the error on ``train``, its timings."""
    base = timings(cells, dataclasses.replace(fitted, launch_us=0.0))
    best = None
    for launch in LAUNCH_STEPS_US:
        ratios = [(base[c.name].seconds * 1e6 + launch) / c.measured_us for c in cells
                  if c.name in train]
        gm = error(ratios)[0]
        if best is None or gm < best[0]:
            best = (gm, launch)
    fitted = dataclasses.replace(fitted, launch_us=best[1])
    return best[0], fitted, timings(cells, fitted)


def fit(cells, train) -> mi355x.Fitted:
    """Coordinate search from the current parameters (see the module docstring)."""
    current = mi355x.FITTED
    score, current, _ = with_best_launch(cells, current, train)
    for steps in ([0.8, 0.9, 1.1, 1.25], [0.8, 0.9, 1.1, 1.25], [0.95, 1.05]):
        for name in BOUNDS:
            for step in steps:
                low, high = BOUNDS[name]
                trial = dataclasses.replace(
                    current, **{name: min(max(getattr(current, name) * step, low), high)})
                trial_score, trial, _ = with_best_launch(cells, trial, train)
                if trial_score < score - 1e-4:
                    score, current = trial_score, trial
                    print(f"  {score:.3f}  {current}", file=sys.stderr)
    return current


def table(cells, fitted, train) -> str:
    rows, ratios = [], {}
    for c, est in zip(cells, timings(cells, fitted).values(), strict=True):
        ratio = est.seconds * 1e6 / c.measured_us
        ratios[c.name] = ratio
        busy = ", ".join(f"{k} {v:.0%}" for k, v in est.busy.items())
        rows.append([c.name, "fit" if c.name in train else "held out",
                     f"{c.measured_us:.1f}", f"{est.seconds * 1e6:.1f}", f"{ratio:.2f}",
                     est.bound, f"{est.busiest_cu * 1e6:.1f} / {est.hbm * 1e6:.1f} / "
                     f"{est.launch * 1e6:.2f}", busy])
    header = ["cell", "role", "measured us", "estimate us", "est / meas", "binds",
              "busiest CU / HBM / launch us", "busy on the sampled CUs"]
    text = format_table(header, rows, [2, 3, 4])
    for label, names in (("fit cells", train), ("held-out cells", set(ratios) - set(train))):
        if names:
            gm, worst = error([ratios[n] for n in names])
            text += f"\n{label}: geometric-mean error {gm:.1%}, worst ratio {worst:.2f}x"
    return text + f"\nparameters: {fitted}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("bundles", type=Path, help="a folder of launch bundles")
    parser.add_argument("--workgroups", type=int, default=16,
                        help="the model's sample per launch (default 16)")
    parser.add_argument("--fit", action="store_true", help="re-fit the parameters")
    parser.add_argument("--cache", type=Path, default=None,
                        help="keep the traced runs in this folder and reuse them")
    parser.add_argument("--train", default=None,
                        help="comma-separated cells to fit on (default: all)")
    args = parser.parse_args(argv)
    cells = load(args.bundles, args.workgroups, args.cache)
    train = set(args.train.split(",")) if args.train else {c.name for c in cells}
    fitted = fit(cells, train) if args.fit else mi355x.FITTED
    print(table(cells, fitted, train))
    return 0


if __name__ == "__main__":
    sys.exit(main())
