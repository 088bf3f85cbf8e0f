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

``--dump-launch DIR`` also writes each launch as a launch bundle (``emulated.dumped``), and
``--launch DIR`` runs one bundle instead of the cells (``emulate_launch``): our kernels and
aiter's calibration kernels go through the same tool.
"""

from __future__ import annotations

import contextlib
import re
import sys
import time
from pathlib import Path

import jax
import numpy as np

from jax_mxfp4._src.core._table import format_table
from jax_mxfp4._src.dispatch import emulated
from jax_mxfp4._src.dispatch.backend import backend_scope
from jax_mxfp4_tools import bench_gpu, emulate_launch

DEFAULT_CELLS = ("prefill", "b32 S1 H1 ctx 8K", "8 rows x 16 pages", "4096 tokens",
                 "32 rows ctx 128K")
"""The cells profiled without ``--cells``: every prefill scorer cell (the seed's MI355X times)
and one decode cell of each other operation."""

DEFAULT_WORKGROUPS = 8
"""Workgroups run per launch of a benchmark cell, without --workgroups."""

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
    parser.add_argument("--workgroups", type=int, default=None,
                        help="workgroups executed per launch, spread over the grid (default: "
                        f"{DEFAULT_WORKGROUPS} for the benchmark cells, all of them for "
                        "--launch)")
    parser.add_argument("--dump-launch", metavar="DIR", default=None,
                        help="also write each launch of the cells as a launch bundle into "
                        "DIR/<cell>/<nn>_<kernel>/ (code object, assembly, launch.json), to "
                        "run again with --launch")
    parser.add_argument("--launch", metavar="DIR", default=None,
                        help="run the launch bundle in DIR instead of the benchmark cells (the "
                        "format of the calibration bundles: launch.json, the kernel's "
                        "assembly and code object) and print its profile and estimate")
    parser.add_argument("--json", action="store_true",
                        help="with --launch: end the output with one JSON object (estimate_us, "
                        "the estimate's terms, instruction counts per class, bytes)")


def run_from_args(args) -> int:
    if args.workgroups is not None and args.workgroups < 1:
        print(f"{emulate_launch.PROG}: --workgroups {args.workgroups}: must be at least 1",
              file=sys.stderr)
        return 2
    if args.launch is not None:
        if args.dump_launch is not None:
            print(f"{emulate_launch.PROG}: --dump-launch: writes the benchmark cells' "
                  "launches, not with --launch", file=sys.stderr)
            return 2
        return emulate_launch.run_launch(args)
    if args.json:
        print(f"{emulate_launch.PROG}: --json: only with --launch", file=sys.stderr)
        return 2
    print(profile_cells(args.arch, args.cells, args.workgroups or DEFAULT_WORKGROUPS,
                        args.profile, args.dump_launch))
    return 0


def _selected(patterns) -> list:
    return [c for c in bench_gpu.cells()
            if any(p in f"{c.group} {c.label}" for p in patterns)]


def _cell_folder(cell) -> str:
    """A folder name for a cell: its group and label, with runs of other characters as one
    '_'."""
    return re.sub(r"[^A-Za-z0-9]+", "_", f"{cell.group} {cell.label}").strip("_")


def profile_cells(arch: str, patterns, workgroups: int, detail: bool,
                  dump: str | None = None) -> str:
    """The table (text) of every launch of the selected cells; with ``dump`` (a folder),
    each launch is also written there as a launch bundle (``emulated.dumped``)."""
    rng = np.random.default_rng(0)
    rows = []
    cells = _selected(patterns)
    if not cells:
        raise SystemExit(f"no benchmark cell matches {patterns}")
    for number, cell in enumerate(cells, 1):
        fn, varying, shared = cell.make(rng, 1)
        start = time.perf_counter()
        with contextlib.ExitStack() as stack:
            launches = stack.enter_context(emulated.profiled(workgroups))
            if dump is not None:
                stack.enter_context(emulated.dumped(Path(dump) / _cell_folder(cell),
                                                    what=f"{cell.group} {cell.label}"))
            stack.enter_context(backend_scope(f"emulated-{arch}"))
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
