"""Build every gfx950 kernel the API reaches for the MiniMax-M3.1 shapes, on any machine.

``python -m jax_mxfp4 build --arch gfx950 --out DIR`` compiles (or takes from the cache) each
specialization of :func:`jax_mxfp4._src.flydsl.abi.minimax_specializations`, writes per kernel
``<symbol>.hsaco``, ``<symbol>.s`` and ``<symbol>.json`` plus one ``manifest.json`` into DIR
(usable as ``JAX_MXFP4_KERNEL_DIR``), and prints the manifest as a table.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path

from jax_mxfp4._src.flydsl import abi
from jax_mxfp4._src.flydsl.code_object import ARCHES, CodeObject, code_object, write_files
from jax_mxfp4._src.flydsl.metadata import waves_per_simd


def build_all(arch: str, out_dir: Path | None, specs: Sequence[abi.Specialization] | None = None,
              *, progress: bool = True) -> list[CodeObject]:
    """Code objects of ``specs`` (default: the MiniMax-M3.1 set), written to ``out_dir``."""
    specs = list(specs if specs is not None else abi.minimax_specializations())
    out: list[CodeObject] = []
    for i, spec in enumerate(specs):
        if progress:
            progress(i, len(specs), spec.symbol, what="kernel")
        co = code_object(spec, arch=arch)
        if out_dir is not None:
            write_files(co, out_dir)
        out.append(co)
    if progress:
        progress(len(specs), len(specs), "done", what="kernel")
    if out_dir is not None:
        manifest = {"arch": arch, "kernels": [co.manifest_entry() for co in out]}
        (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return out


def manifest_rows(objects: Sequence[CodeObject]) -> list[tuple[str, ...]]:
    rows = []
    for co in objects:
        i = co.info
        rows.append((co.symbol, "x".join(map(str, co.block)), str(i.lds_bytes), str(i.vgpr_count),
                     str(i.agpr_count), str(i.sgpr_count), str(i.scratch_bytes),
                     str(waves_per_simd(i)), str(co.kernarg_size),
                     " ".join(f"{s.name}@{s.offset}" for s in co.kernarg_layout)))
    return rows


def format_manifest(objects: Sequence[CodeObject]) -> str:
    from jax_mxfp4._src.core._table import format_table

    header = ("kernel", "block", "LDS B", "VGPR", "AGPR", "SGPR", "scratch B", "waves/SIMD",
              "kernarg B", "kernarg layout (name@offset)")
    return format_table(header, manifest_rows(objects), right_aligned=range(2, 9))


def add_arguments(parser) -> None:
    parser.add_argument("--arch", default="gfx950", choices=ARCHES, help="target (gfx950)")
    parser.add_argument("--out", type=Path, default=Path("build/gfx950-kernels"),
                        help="folder for the .hsaco, .s and manifest files")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def run_from_args(args) -> int:
    start = time.perf_counter()
    objects = build_all(args.arch, args.out, progress=not args.no_progress)
    print(format_manifest(objects))
    print(f"{len(objects)} kernels for {args.arch} in {args.out} "
          f"({time.perf_counter() - start:.1f} s)")
    return 0
