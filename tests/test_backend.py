"""Choosing the lowering: set_backend / backend_scope / JAX_MXFP4_BACKEND, and `info`.

Mutation check: dropping ``include_in_trace_context=True`` from the backend state makes
test_set_backend_retraces_a_jitted_function fail (the cached trace keeps the old lowering).
"""

from __future__ import annotations

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

import jax_mxfp4 as jm
from jax_mxfp4 import info
from jax_mxfp4.ffi_targets import register_cpu_targets

needs_ffi = pytest.mark.skipif(not register_cpu_targets(), reason="C++ handlers not built")


def _lowered(fn, *args) -> str:
    return fn.lower(*args).as_text()


@needs_ffi
def test_set_backend_retraces_a_jitted_function():
    f = jax.jit(lambda p, x, s: jm.write_cache(p, x, s))
    args = (jm.new_pool(4), jnp.ones((2, 128)), jnp.arange(2, dtype=jnp.int32))
    assert "jax_mxfp4_write_cache" in _lowered(f, *args)
    jm.set_backend("reference")
    try:
        assert jm.get_backend() == "reference"
        assert "custom_call" not in _lowered(f, *args)
    finally:
        jm.set_backend("auto")
    assert "jax_mxfp4_write_cache" in _lowered(f, *args)


@needs_ffi
def test_backend_scope_is_local_to_the_block():
    f = jax.jit(lambda p, x, s: jm.write_cache(p, x, s))
    args = (jm.new_pool(4), jnp.ones((2, 128)), jnp.arange(2, dtype=jnp.int32))
    with jm.backend_scope("reference"):
        assert "custom_call" not in _lowered(f, *args)
    assert jm.get_backend() == "auto"
    assert "jax_mxfp4_write_cache" in _lowered(f, *args)


def test_bad_backend_names_are_refused():
    with pytest.raises(ValueError, match="backend"):
        jm.set_backend("triton")
    env = dict(os.environ, JAX_MXFP4_BACKEND="fast")
    run = subprocess.run([sys.executable, "-c", "import jax_mxfp4"], env=env,
                         capture_output=True, text=True)
    assert run.returncode != 0 and "JAX_MXFP4_BACKEND" in run.stderr


@needs_ffi
def test_info_reports_the_lowering_per_operation():
    rows = info.lowering_table()
    assert {op for _, op, _ in rows} >= {"mxfp4_write_cache", "mxfp4_index_scores",
                                         "mxfp4_select_blocks", "mxfp4_sparse_attention"}
    assert all(impl.startswith("ffi:") for platform, _, impl in rows if platform == "cpu")
    with jm.backend_scope("reference"):
        assert all(impl == "reference" for _, _, impl in info.lowering_table())
    env = dict(os.environ, JAX_MXFP4_BACKEND="reference")
    out = subprocess.run([sys.executable, "-m", "jax_mxfp4", "info"], env=env,
                         capture_output=True, text=True, check=True).stdout
    assert "reference lowering" in out and "C++" not in out
