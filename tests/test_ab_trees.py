"""bench/ab_trees.py, the device A/B of another tree's kernels, checked without a GPU: a
prepared tree's modules import each other, and inside ``lowering_from`` the lowering compiles
that tree's kernel (recorded at the compiler while an index scorer is exported for sm_90),
this tree's again after. Mutation: ``lowering_from`` not swapping the modules fails the first
assertion on the compiled kernel's module."""

from __future__ import annotations

import importlib
import shutil
from pathlib import Path

import bench_scripts
import pytest

pytest.importorskip("triton")
ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(),
                    reason="needs the git history of the checkout")
def test_a_prepared_tree_lowers_with_its_own_kernels(tmp_path, monkeypatch):
    from jax_mxfp4._src.triton import compiler

    ab_trees, sass_stats = bench_scripts.load("ab_trees"), bench_scripts.load("sass_stats")
    (folder,) = ab_trees.prepare(["HEAD"], out=tmp_path)
    lowering = (folder / "ops" / "index_scores" / "triton.py").read_text()
    assert "jax_mxfp4._src.ops" not in lowering and "ab_HEAD.ops.index_scores" in lowering
    modules = ab_trees.tree_modules("HEAD", trees=tmp_path)
    kernel = modules["index_scores"].index_scores_kernel  # the lowering's Triton kernel
    assert kernel.fn.__module__ == "ab_HEAD.ops.index_scores.triton_kernel"

    compiled_from = []
    compile_kernel = compiler.compile_kernel

    def recording(spec, target):
        compiled_from.append(spec.fn.fn.__module__)
        return compile_kernel(spec, target)

    monkeypatch.setattr(compiler, "compile_kernel", recording)
    fn, args = sass_stats.CASES["index decode b32 S1 ctx 128K"]
    with ab_trees.lowering_from(modules):  # a new function each time: jit caches a lowering
        sass_stats.kernels_of(lambda *a: fn(*a), args)
    sass_stats.kernels_of(lambda *a: fn(*a), args)
    assert compiled_from == ["ab_HEAD.ops.index_scores.triton_kernel",
                             "jax_mxfp4._src.ops.index_scores.triton_kernel"]
    assert importlib.import_module("jax_mxfp4._src.ops.index_scores.triton").__name__ == \
        "jax_mxfp4._src.ops.index_scores.triton"
