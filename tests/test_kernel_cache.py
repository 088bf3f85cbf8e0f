"""bench/kernel_cache.py, the kernels compiled ahead for a device call, checked without a GPU:
a bench cell filled into a cache is lowered again from that cache alone (Triton's compile
made to fail). Mutation: ``fill`` not pointing the compiler at ``cache`` leaves it empty and
fails the first assertion."""

from __future__ import annotations

import bench_scripts
import pytest

pytest.importorskip("triton")


def test_a_filled_cache_lowers_the_cell_without_compiling(tmp_path, monkeypatch):
    from jax_mxfp4._src.triton import compiler

    kernel_cache = bench_scripts.load("kernel_cache")
    monkeypatch.setenv("JAX_MXFP4_CACHE_DIR", str(tmp_path / "elsewhere"))
    assert kernel_cache.fill(["this"], ["32 tokens"], cache=tmp_path / "cache") == 1
    assert list((tmp_path / "cache").glob("*.bin"))

    def no_compile(spec, target):
        raise AssertionError(f"{spec.fn.__name__} compiled instead of loaded from the cache")

    compiler.compile_kernel.cache_clear()
    monkeypatch.setattr(compiler, "_compile_here_or_isolated", no_compile)
    assert kernel_cache.fill(["this"], ["32 tokens"], cache=tmp_path / "cache") == 1
