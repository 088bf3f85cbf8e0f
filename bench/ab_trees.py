"""The GPU kernels of other trees against this tree's, side by side in one device call.

An A/B of a kernel change: the bench's cells lowered with each tree's Triton lowerings in turn
(``jax_mxfp4/_src/ops/<op>/triton.py``: its ``lower``, plan and kernels), interleaved for a
few rounds, timed as ``python -m jax_mxfp4 bench`` times them (CUPTI device time per call,
``bench_gpu._measure``). The device machine has no git history, so the other trees' kernel
modules are written here first, into ``bench/ab_trees/`` (ignored by git: pass it to the
device tool's ``carry``)::

    python bench/ab_trees.py prepare 7bfb418 36c296c          # here
    python bench/ab_trees.py run --trees 7bfb418,36c296c \\
        --cells "b1 q4096 ctx 8K,b8 S4 H1 ctx 128K" --rounds 2  # on the device

``prepare`` extracts each revision's Triton modules (``SOURCES``: each operation's lowering
and kernel modules, and the shared device helpers of ``jax_mxfp4/_src/triton``) as a package
``ab_<rev>`` of the same shape, whose modules import each other instead of this tree's;
everything else (the launcher, the compiler, the bench) is this tree's. ``run`` puts a tree's
lowerings in place of this tree's in ``sys.modules`` while its cells are lowered (the lowering
imports its module by name at every lowering: ``dispatch.lowering.KernelModule``), prints one
line per round, tree and cell, then a table of the medians. A tree whose lowering no longer
fits this tree's launcher fails its cells, reported and skipped. Revisions from before the
per-operation folders (``jax_mxfp4/_src/ops/``) are refused: prepare them with their own
``bench/ab_trees.py``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import re
import statistics
import subprocess
import sys
import tarfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
TREES = HERE / "ab_trees"
SRC = "jax_mxfp4._src"
OPS = ("index_scores", "sparse_attention", "select_blocks", "write_cache")
SOURCES = re.compile(
    r"jax_mxfp4/_src/(ops/\w+/(triton|triton_kernel|gluon_\w+)|triton/(mxfp4|row_dot))\.py")
"""The files of a revision that make its Triton lowerings (paths inside the repository)."""
THIS_TREES = ("from jax_mxfp4._src.triton import compile_worker, compiler, triton_call, "
              "triton_compile\n")
"""A prepared tree's ``triton/__init__.py``: the toolchain modules stay this tree's, beside the
tree's own device helpers (``from <tree>.triton import mxfp4, triton_call`` takes one of each)."""


def package_name(rev: str) -> str:
    return "ab_" + re.sub(r"\W", "_", rev)


def _own_imports(text: str, package: str) -> str:
    """``text`` with its imports of ``jax_mxfp4._src.ops`` and ``.triton`` pointed at
    ``package``."""
    return re.sub(rf"\b{re.escape(SRC)}\.(ops|triton)\b", rf"{package}.\1", text)


def prepare(revs: list[str], out: Path = TREES, repo: Path = HERE.parent) -> list[Path]:
    """Write each revision's Triton modules (``SOURCES``) to ``out/ab_<rev>/`` in the tree's
    own folders, their imports of each other pointed at that package. Returns the folders."""
    folders = []
    for rev in revs:
        archive = subprocess.run(["git", "archive", rev, "jax_mxfp4/_src"], cwd=repo,
                                 capture_output=True).stdout
        package, folder = package_name(rev), out / package_name(rev)
        written = 0
        with tarfile.open(fileobj=io.BytesIO(archive)) if archive else contextlib.nullcontext() \
                as tar:
            for member in tar.getmembers() if tar else ():
                if member.isfile() and SOURCES.fullmatch(member.name):
                    target = folder / Path(member.name).relative_to("jax_mxfp4/_src")
                    target.parent.mkdir(parents=True, exist_ok=True)
                    text = tar.extractfile(member).read().decode()
                    target.write_text(_own_imports(text, package))
                    written += 1
        if not written:
            raise SystemExit(f"{rev} has no jax_mxfp4/_src/ops/<op>/triton.py: it predates the "
                             f"per-operation folders; prepare it with its own bench/ab_trees.py")
        for sub in [folder, *(p for p in folder.rglob("*") if p.is_dir())]:
            (sub / "__init__.py").touch()
        (folder / "triton" / "__init__.py").write_text(THIS_TREES)
        folders.append(folder)
    return folders


def tree_modules(rev: str, trees: Path = TREES) -> dict[str, object]:
    """The Triton lowering modules (one per ``OPS``) of a prepared tree, imported."""
    if str(trees) not in sys.path:
        sys.path.insert(0, str(trees))
    return {op: importlib.import_module(f"{package_name(rev)}.ops.{op}.triton") for op in OPS}


@contextlib.contextmanager
def lowering_from(modules: dict[str, object] | None):
    """Inside the block, the lowerings of ``modules`` (:func:`tree_modules`) stand in for this
    tree's; ``None`` leaves this tree's."""
    names = {op: f"{SRC}.ops.{op}.triton" for op in OPS}
    saved = {name: importlib.import_module(name) for name in names.values()}
    try:
        if modules is not None:
            for op, module in modules.items():
                sys.modules[names[op]] = module
        yield
    finally:
        sys.modules.update(saved)


def named_cells(labels: list[str]) -> list:
    """The bench cells (``bench_gpu.cells()``) labelled ``labels``; exits naming any label
    that is not one."""
    from jax_mxfp4_tools import bench_gpu

    cells = [c for c in bench_gpu.cells() if c.label in labels]
    missing = set(labels) - {c.label for c in cells}
    if missing:
        raise SystemExit(f"unknown cells {sorted(missing)}")
    return cells


def run(revs: list[str], labels: list[str], rounds: int) -> None:
    import numpy as np

    from jax_mxfp4_tools import bench_gpu

    cells = named_cells(labels)
    trees = {rev: tree_modules(rev) for rev in revs} | {"this tree": None}
    times: dict[tuple[str, str], list[float]] = {}
    for r in range(rounds):
        for name, modules in trees.items():
            for cell in cells:
                with lowering_from(modules):
                    try:
                        t = bench_gpu._measure(cell, np.random.default_rng(0), 5, 5, "auto")
                    except Exception as error:  # a tree whose lowering no longer fits
                        print(f"round {r} {name} {cell.group} {cell.label}: failed "
                              f"({type(error).__name__}: {str(error)[:200]})", flush=True)
                        continue
                times.setdefault((name, cell.label), []).append(t.device * 1e6)
                print(f"round {r} {name} {cell.group} {cell.label}: {t.device * 1e6:.1f} us",
                      flush=True)
    print("\ncell | " + " | ".join(trees))
    for cell in cells:
        row = [f"{statistics.median(times[(n, cell.label)]):.1f}"
               if (n, cell.label) in times else "-" for n in trees]
        print(f"{cell.group} {cell.label} | " + " | ".join(row))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prepare", help="write the kernel modules of these revisions (here)")
    p.add_argument("revs", nargs="+")
    q = sub.add_parser("run", help="time the cells with each tree's lowerings (on the device)")
    q.add_argument("--trees", required=True, help="prepared revisions, comma-separated")
    q.add_argument("--cells", required=True, help="bench cell labels, comma-separated")
    q.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    if args.command == "prepare":
        for folder in prepare(args.revs):
            print(folder)
    else:
        run(args.trees.split(","), args.cells.split(","), args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
