"""``python -m jax_mxfp4 emulate --profile``: the ROCm kernels' dynamic profile and an MI355X
time estimate, from the CDNA emulator.

Each cell of the GPU benchmark table (``bench_gpu.cells``; ``--cells`` filters them by
substring) runs once under the emulated backend (``emulated-gfx950`` by default), so every
launch is exactly the one the ROCm lowering would make: its code object, grid, block and
kernel arguments. Each launch executes ``--workgroups`` workgroups spread over its grid and
the emulator scales counts and bytes to the whole grid (the outputs are incomplete: this is a
profile, not a computation). The table gives, per launch, the waves, the instructions per wave
by class (VALU, SALU, MFMA, LDS, global loads and stores, waits), global and LDS bytes, and
the estimate of ``cdna_emulator.profiling`` (a roofline with a latency floor at the
MI355X's peaks: 8 TB/s, the MFMA rates, 256 CUs at 2.4 GHz; what it leaves out is listed
there). The seed's measured MI355X times of the prefill scorer cells stand beside it. It is
an estimate, not a measurement.
"""

from __future__ import annotations

import sys
import time

import jax
import numpy as np

from jax_mxfp4._src.core._table import format_table
from jax_mxfp4._src.dispatch import emulated
from jax_mxfp4._src.dispatch.backend import backend_scope
from jax_mxfp4_tools import bench_gpu

DEFAULT_CELLS = ("prefill", "b32 S1 H1 ctx 8K", "8 rows x 16 pages", "4096 tokens",
                 "32 rows ctx 128K")
"""The cells profiled without ``--cells``: every prefill scorer cell (the seed's MI355X times)
and one decode cell of each other operation."""

CLASSES = ("valu", "salu", "mfma", "lds", "global_load", "global_store", "wait")


def add_arguments(parser) -> None:
    parser.add_argument("--profile", action="store_true",
                        help="print the per-launch profile (instructions per wave by class, "
                        "bytes) beside the estimate")
    parser.add_argument("--arch", choices=("gfx950", "gfx942"), default="gfx950",
                        help="the lowering to emulate (default gfx950: MI355X)")
    parser.add_argument("--cells", nargs="*", default=list(DEFAULT_CELLS),
                        help="profile the cells whose 'group label' contains one of these "
                        "substrings (default: the prefill scorer cells and one decode cell "
                        "per operation)")
    parser.add_argument("--workgroups", type=int, default=8,
                        help="workgroups executed per launch (spread over the grid; default 8)")


def run_from_args(args) -> int:
    if args.workgroups < 1:
        raise SystemExit("--workgroups must be at least 1")
    print(profile_cells(args.arch, args.cells, args.workgroups, args.profile))
    return 0


def _selected(patterns) -> list:
    return [c for c in bench_gpu.cells()
            if any(p in f"{c.group} {c.label}" for p in patterns)]


def profile_cells(arch: str, patterns, workgroups: int, detail: bool) -> str:
    """The table (text) of every launch of the selected cells."""
    rng = np.random.default_rng(0)
    rows = []
    cells = _selected(patterns)
    if not cells:
        raise SystemExit(f"no benchmark cell matches {patterns}")
    for number, cell in enumerate(cells, 1):
        fn, varying, shared = cell.make(rng, 1)
        start = time.perf_counter()
        with emulated.profiled(workgroups) as launches, backend_scope(f"emulated-{arch}"):
            jax.block_until_ready(jax.jit(fn)(*varying[0], *shared))
        if sys.stderr.isatty():
            print(f"[{number}/{len(cells)}] {cell.group} {cell.label}: {len(launches)} "
                  f"launches emulated in {time.perf_counter() - start:.1f} s", file=sys.stderr)
        seed = bench_gpu.SEED_PREFILL_US.get(cell.label) if "prefill" in cell.group else None
        for launch in launches:
            rows.append(_row(cell, launch, seed, detail))
    head = (f"emulated {arch} launches ({workgroups} workgroups each, counts scaled to the "
            f"grid); 'est. us' is the MI355X model of cdna_emulator/profiling.py, an "
            f"estimate, not a measurement")
    header = list(rows[0])
    numeric = [i for i, name in enumerate(header) if name not in ("cell", "kernel", "bound")]
    return head + "\n" + format_table(header, [list(r.values()) for r in rows], numeric)


def _row(cell, launch, seed, detail: bool) -> dict:
    est = launch.estimate
    row = {"cell": f"{cell.group} {cell.label}", "kernel": launch.kernel,
           "grid": "x".join(map(str, launch.grid)), "waves": str(launch.waves)}
    if detail:
        row.update({f"{c}/wave": f"{launch.per_wave.get(c, 0):.0f}" for c in CLASSES})
        row["global MB"] = f"{(launch.global_bytes_read + launch.global_bytes_written) / 1e6:.1f}"
        row["LDS MB"] = f"{launch.lds_bytes / 1e6:.1f}"
    row.update({"est. us": f"{est.seconds * 1e6:.1f}", "bound": est.bound,
                "seed MI355X us": f"{seed}" if seed else "-"})
    return row
