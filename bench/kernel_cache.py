"""Compile the bench cells' GPU kernels here (no GPU needed) into a kernel cache that a device
call carries, so the device spends its time timing instead of compiling.

The lowering compiles every Triton kernel at lowering time and keeps it on disk by content hash
(``jax_mxfp4._src.triton.compiler``: the kernel's source, constants, target and Triton
version). This
exports each named cell for CUDA sm_90 (``jax.export`` under ``lowering_options(gpu_arch=90)``,
as ``tests/test_gpu_compile.py`` does), with this tree's kernels and with each prepared tree's
(``bench/ab_trees.py``), into ``bench/kernel_cache/`` (ignored by git). On the device, point
``JAX_MXFP4_CACHE_DIR`` at it (``bench/gpu_session.sh`` does when it exists) and carry it::

    python bench/kernel_cache.py --trees 7bfb418,36c296c --cells "1 rows x 16 pages"

A device whose Triton version differs from this machine's misses the cache and compiles as
before: the cache can only save time, never change what runs.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
CACHE = HERE / "kernel_cache"


def fill(trees: list[str], labels: list[str], cache: Path = CACHE) -> int:
    """Lower the cells ``labels`` with each tree's kernels (``"this"``: this tree's) for
    sm_90, their kernels compiled into ``cache``; returns the (tree, cell) pairs done."""
    os.environ["JAX_MXFP4_CACHE_DIR"] = str(cache)
    import jax
    import numpy as np

    import jax_mxfp4 as jm
    from jax_mxfp4._src.gpu import launch
    from jax_mxfp4._src.triton import compiler

    sys.path.insert(0, str(HERE))
    import ab_trees

    cells = ab_trees.named_cells(labels)
    # kernels this process compiled before are in memory, which would skip the disk store
    compiler.compile_kernel.cache_clear()
    checks = [jax.export.DisabledSafetyCheck.custom_call(launch.TARGET)]
    done = 0
    for tree in trees:
        modules = None if tree == "this" else ab_trees.tree_modules(tree)
        for cell in cells:
            fn, varying, shared = cell.make(np.random.default_rng(0), 1)
            args = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in (*varying[0], *shared)]
            with ab_trees.lowering_from(modules), jm.lowering_options(gpu_arch=90):
                jax.export.export(jax.jit(fn), platforms=["cuda"],
                                  disabled_checks=checks)(*args)
            done += 1
            print(f"{tree}: {cell.label}", flush=True)
    return done


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trees", default="", help="prepared revisions, comma-separated "
                        "(this tree's kernels are always compiled)")
    parser.add_argument("--cells", required=True, help="bench cell labels, comma-separated")
    args = parser.parse_args(argv)
    trees = ["this", *filter(None, args.trees.split(","))]
    fill(trees, args.cells.split(","))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
