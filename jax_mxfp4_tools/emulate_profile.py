"""``python -m jax_mxfp4 emulate --profile``: the ROCm kernels' dynamic profile and an MI355X
time estimate, from the CDNA emulator.

Each cell of the GPU benchmark table (``bench_gpu.cells``; ``--cells`` filters them by
substring) runs once under the emulated backend (``emulated-gfx950`` by default), so every
launch is exactly the one the ROCm lowering would make: its code object, grid, block and
kernel arguments. Each launch executes ``--workgroups`` workgroups spread over its grid and
the emulator scales counts and bytes to the whole grid (the outputs are incomplete: this is a
profile, not a computation). The table gives, per launch, the waves, the instructions per wave
by class (VALU, SALU, MFMA, LDS, global loads and stores, waits), global and LDS bytes, and
the MI355X time of the calibrated timing model (``cdna_emulator.timing``: the waves each
CU runs under the CDNA issue rules, 128-byte lines, per-XCD L2, HBM, the busiest CU, a launch
cost; its README says what it leaves out), with its label. The seed's measured MI355X times
of the prefill scorer cells stand beside it. It is an estimate, not a measurement.

``--dump-launch DIR`` also writes each launch as a launch bundle (``emulated.dumped``), and
``--launch DIR`` runs one bundle instead of the cells (``emulate_launch``): our kernels and
aiter's calibration kernels go through the same tool.
"""

from __future__ import annotations

import contextlib
import json
import re
import sys
import time
from pathlib import Path

import jax
import numpy as np

from cdna_emulator.profiling import LABEL
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
    parser.add_argument("--versus-seed", action="store_true",
                        help="the gfx950 kernels at the issue-45 anchor cells against the "
                        "seed's and vLLM's measured MI355X times (and the decode scorer "
                        "against 70 %% of HBM peak), side by side")
    parser.add_argument("--json", action="store_true",
                        help="with --launch: end the output with one JSON object (estimate_us, "
                        "the estimate's terms, instruction counts per class, bytes); with "
                        "--versus-seed: {\"cells\": [...]} of the anchored rows")


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
    if args.versus_seed:
        text, record = versus_seed(args.workgroups or VERSUS_WORKGROUPS)
        print(text)
        if args.json:
            print(json.dumps(record))
        return 0
    if args.json:
        print(f"{emulate_launch.PROG}: --json: only with --launch or --versus-seed",
              file=sys.stderr)
        return 2
    print(profile_cells(args.arch, args.cells, args.workgroups or DEFAULT_WORKGROUPS,
                        args.profile, args.dump_launch))
    return 0


HBM_FRACTION = 0.7
"""The decode scorer's anchor: its bytes at this share of the MI355X's 8 TB/s."""
VLLM_SPARSE_DECODE_US = {8: 10.34, 32: 10.86, 128: 13.84, 192: 18.39}
"""vLLM's FlyDSL NVFP4 sparse decode on an MI355X, 16 q heads, top-16 pages, by rows
(seeds/004, measured; ../shared/calibration/mi355x_timings.csv, group seed-decode-vllm)."""
VERSUS_WORKGROUPS = 16
"""Workgroups sampled per launch for --versus-seed."""


def anchors() -> list[tuple]:
    """(group, label, anchor, anchor us or None) of the --versus-seed rows; None: no anchor
    (write_cache and select_blocks, whose bytes are small enough that the launch decides)."""
    rows = [("index_scores prefill", label, "seed MXFP4 scorer, bf16 query (measured)", us)
            for label, us in bench_gpu.SEED_PREFILL_US.items()]
    rows += [("index_scores decode", label, f"its bytes at {HBM_FRACTION:.0%} of 8 TB/s",
              "bytes") for label in ("b32 S1 H1 ctx 32K", "b32 S1 H1 ctx 128K",
                                     "b32 S1 H1 ctx 512K", "b8 S4 H1 ctx 128K")]
    rows += [("sparse_attention decode", f"{r} rows x 16 pages",
              "vLLM FlyDSL NVFP4 sparse decode (seed 004, measured)", us)
             for r, us in VLLM_SPARSE_DECODE_US.items()]
    rows += [("write_cache", "4096 tokens", "-", None),
             ("select_blocks", "32 rows ctx 128K", "-", None)]
    return rows


def versus_seed(workgroups: int) -> tuple[str, dict]:
    """The --versus-seed table (text) and its JSON record: per anchor cell, the sum of its
    launches' estimates (split and merge for attention) beside the anchor."""
    by_name = {(c.group, c.label): c for c in bench_gpu.cells()}
    rows, record = [], {"cells": [], "unanchored": [], "label": LABEL,
                        "workgroups": workgroups}
    for group, label, source, anchor in anchors():
        cell = by_name[(group, label)]
        launches = _profile_cell(cell, "gfx950", workgroups)
        estimate = sum(p.estimate.seconds for p in launches) * 1e6
        kernels = " + ".join(p.kernel.removeprefix("jax_mxfp4_") for p in launches)
        slowest = max(launches, key=lambda p: p.estimate.seconds)
        if anchor == "bytes":
            anchor = cell.bytes_moved / (HBM_FRACTION * 8e12) * 1e6
        entry = {"cell": f"{group} {label}", "kernel": kernels, "estimate_us": estimate,
                 "anchor_us": anchor, "anchor": source}
        record["cells" if anchor is not None else "unanchored"].append(entry)
        rows.append([f"{group} {label}", kernels, f"{estimate:.1f}",
                     "-" if anchor is None else f"{anchor:.1f}",
                     "-" if anchor is None else f"{estimate / anchor:.2f}",
                     slowest.estimate.bound, source])
    header = ["cell", "kernels", "est. us", "anchor us", "est / anchor", "binds", "anchor"]
    head = (f"gfx950 kernels at the anchor cells (a sample of about {workgroups} workgroups a "
            f"launch); 'est. us' is {LABEL}")
    return head + "\n" + format_table(header, rows, [2, 3, 4]), record


def _profile_cell(cell, arch: str, workgroups: int, dump: Path | None = None) -> list:
    """The profiles of every launch one call of ``cell`` makes under ``emulated-<arch>``;
    with ``dump`` (a folder), each launch is also written there as a launch bundle."""
    fn, varying, shared = cell.make(np.random.default_rng(0), 1)
    with contextlib.ExitStack() as stack:
        launches = stack.enter_context(emulated.profiled(workgroups))
        if dump is not None:
            stack.enter_context(emulated.dumped(dump, what=f"{cell.group} {cell.label}"))
        stack.enter_context(backend_scope(f"emulated-{arch}"))
        jax.block_until_ready(jax.jit(fn)(*varying[0], *shared))
    return launches


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
    rows = []
    cells = _selected(patterns)
    if not cells:
        raise SystemExit(f"no benchmark cell matches {patterns}")
    for number, cell in enumerate(cells, 1):
        start = time.perf_counter()
        launches = _profile_cell(cell, arch, workgroups,
                                 None if dump is None else Path(dump) / _cell_folder(cell))
        if sys.stderr.isatty():
            print(f"[{number}/{len(cells)}] {cell.group} {cell.label}: {len(launches)} "
                  f"launches emulated in {time.perf_counter() - start:.1f} s", file=sys.stderr)
        seed = bench_gpu.SEED_PREFILL_US.get(cell.label) if "prefill" in cell.group else None
        for launch in launches:
            rows.append(_row(cell, launch, seed, detail))
    head = (f"emulated {arch} launches (a sample of about {workgroups} workgroups each, counts "
            f"scaled to the grid); 'est. us' is {LABEL}")
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
