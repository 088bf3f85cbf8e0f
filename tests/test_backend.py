"""Choosing the lowering: backends, lowering options, `info`, `explain`, and loud failures.

* The backend and every lowering option are part of jit's cache key: *calling* a jitted
  function inside ``backend_scope`` / ``lowering_options`` retraces it and runs what the
  scope asks for, and calling it again outside runs the original choice.
* Adding a backend is one ``register_backend``: the tests register one that cannot lower on
  the CPU and see jitted calls obey it.
* A missing or broken C++ extension is never papered over by the reference lowering: the
  first call that needs it fails naming the file, the reason and the fix; ``info`` says so.

Mutation checks (performed by hand): dropping ``include_in_jit_key=True`` from the backend
state makes test_a_call_inside_backend_scope_runs_the_scoped_backend fail (the second call
reuses the first executable: one trace); making ``CpuHandler.covers`` ignore
``cpu_handlers_problem`` makes test_a_missing_extension_fails_loudly fail (the call lowers to
an unregistered target and dies in XLA without the reason).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import pytest

import jax_mxfp4 as jm
from jax_mxfp4._src import info
from jax_mxfp4._src.dispatch import backend
from jax_mxfp4._src.dispatch.lowering import NoLoweringError


def _write_case():
    return (jm.new_pool(4), jnp.ones((2, 128)), jnp.arange(2, dtype=jnp.int32))


def _traced_write():
    """A jitted write_cache that records the backend of every trace."""
    traces: list[str] = []

    @jax.jit
    def write(pool, x, slots):
        traces.append(jm.get_backend())
        return jm.write_cache(pool, x, slots)

    return write, traces


def test_a_call_inside_backend_scope_runs_the_scoped_backend():
    write, traces = _traced_write()
    args = _write_case()
    first = write(*args)
    with jm.backend_scope("reference"):
        assert jm.get_backend() == "reference"
        second = write(*args)
        assert "custom_call" not in write.lower(*args).as_text()
    third = write(*args)
    assert traces == ["auto", "reference"]  # the third call reuses the first executable
    assert "jax_mxfp4_write_cache" in write.lower(*args).as_text()
    for out in (second, third):
        assert (jnp.asarray(out) == jnp.asarray(first)).all()


def test_set_backend_reaches_jitted_functions_that_already_ran():
    write, traces = _traced_write()
    args = _write_case()
    write(*args)
    jm.set_backend("reference")
    try:
        write(*args)
    finally:
        jm.set_backend("auto")
    write(*args)
    assert traces == ["auto", "reference"]


def test_a_registered_backend_is_obeyed_by_jitted_calls():
    """One registration adds a backend; a jitted function called under it runs (here: fails
    with the backend's own reason), and outside it runs as before."""
    def nowhere(platform, ctx, config):
        raise NotImplementedError(f"the test backend lowers nothing on {platform}")

    backend.register_backend(backend.Backend("test-nowhere", "lowers nothing", nowhere))
    assert "test-nowhere" in jm.backends()
    write, _ = _traced_write()
    args = _write_case()
    write(*args)
    with jm.backend_scope("test-nowhere"), pytest.raises(NotImplementedError, match="test"):
        write(*args)
    write(*args)


def test_lowering_options_are_part_of_the_jit_key():
    write, traces = _traced_write()
    args = _write_case()
    write(*args)
    with jm.lowering_options(gpu_arch="gfx950", gfx950_kernels="triton", gpu_units=64):
        write(*args)
        config = backend.current_config()
        assert (config.gpu_arch, config.gfx950_kernels, config.gpu_units) == \
            ("gfx950", "triton", 64)
    write(*args)
    assert len(traces) == 2
    with jm.lowering_options(cuda_kernels="triton"):
        write(*args)
        assert backend.current_config().cuda_kernels == "triton"
    assert len(traces) == 3
    with pytest.raises(ValueError, match="gfx950_kernels"):
        with jm.lowering_options(gfx950_kernels="cuda"):
            pass
    # "gluon": the experiment, deleted (bench/RESULTS.md, "Experiments deleted (2026-12-07)")
    for removed in ("cutlass", "gluon"):
        with pytest.raises(ValueError, match="cuda_kernels"):
            with jm.lowering_options(cuda_kernels=removed):
                pass
    with pytest.raises(TypeError, match="fp8_dots"):  # the e4m3-dots experiment, deleted
        with jm.lowering_options(fp8_dots=True):
            pass


def test_bad_backend_names_are_refused():
    with pytest.raises(ValueError, match="backend"):
        jm.set_backend("triton")
    with pytest.raises(ValueError, match="backend"), jm.backend_scope("fast"):
        pass
    env = dict(os.environ, JAX_MXFP4_BACKEND="fast")
    run = subprocess.run([sys.executable, "-c", "import jax_mxfp4"], env=env,
                         capture_output=True, text=True)
    assert run.returncode != 0 and "JAX_MXFP4_BACKEND" in run.stderr


def test_info_reports_the_lowering_per_operation():
    rows = info.lowering_table()
    assert {op for _, op, _ in rows} >= {"mxfp4_write_cache", "mxfp4_index_scores",
                                         "mxfp4_select_blocks", "mxfp4_sparse_attention"}
    assert all(what.startswith("C++ handler jax_mxfp4_") for platform, _, what in rows
               if platform == "cpu")
    with jm.backend_scope("reference"):
        assert all(what.startswith("reference lowering") for _, _, what in info.lowering_table())
    env = dict(os.environ, JAX_MXFP4_BACKEND="reference")
    out = subprocess.run([sys.executable, "-m", "jax_mxfp4", "info"], env=env,
                         capture_output=True, text=True, check=True).stdout
    assert "reference lowering" in out and "C++" not in out


def test_explain_lists_each_operation_of_a_function():
    def step(pool, x, slots, q, table, positions, requests):
        pool = jm.write_cache(pool, x, slots)
        return jm.index_scores(q, pool, table, positions, requests, num_blocks=2,
                               sm_scale=0.125)

    s = jax.ShapeDtypeStruct
    args = (s((4, 8704), jnp.uint8), s((2, 128), jnp.bfloat16), s((2,), jnp.int32),
            s((2, 1, 128), jnp.bfloat16), s((1, 2), jnp.int32), s((2,), jnp.int32),
            s((2,), jnp.int32))
    found = jm.explain(jax.jit(step), *args)
    assert [(e.operation, e.lowering) for e in found] == [
        ("mxfp4_write_cache", "ffi:jax_mxfp4_write_cache"),
        ("mxfp4_index_scores", "ffi:jax_mxfp4_index_scores")]
    assert "mxfp4_index_scores" in str(found)
    with jm.backend_scope("reference"):
        assert {e.lowering for e in jm.explain(step, *args)} == {"reference"}
    scanned = jm.explain(lambda *a: jax.lax.scan(lambda c, _: (c, step(*a)), 0, None,
                                                 length=2)[1], *args)
    assert [e.operation for e in scanned] == ["mxfp4_write_cache", "mxfp4_index_scores"]


_BROKEN = textwrap.dedent("""
    import importlib.abc, importlib.util, sys
    class Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name != "jax_mxfp4._ffi_cpu":
                return None
            if {corrupt!r} is None:
                raise ImportError("No module named 'jax_mxfp4._ffi_cpu'")
            return importlib.util.spec_from_file_location(name, {corrupt!r})
    sys.meta_path.insert(0, Finder())
    import jax.numpy as jnp
    import jax_mxfp4 as jm
    from jax_mxfp4._src import info
    print("INFO", dict((op, what) for p, op, what in info.lowering_table())["mxfp4_write_cache"])
    try:
        jm.write_cache(jm.new_pool(2), jnp.ones((1, 128)), jnp.zeros(1, jnp.int32))
    except Exception as error:
        print("ERROR", type(error).__name__, error)
    with jm.backend_scope("reference"):
        jm.write_cache(jm.new_pool(2), jnp.ones((1, 128)), jnp.zeros(1, jnp.int32))
        print("REFERENCE OK")
""")


@pytest.mark.parametrize("corrupt", [False, True], ids=["missing", "corrupt"])
def test_a_missing_extension_fails_loudly(tmp_path, corrupt):
    """No silent fallback: without loadable handlers a call raises naming the .so, why and
    the fix; ``info`` shows the reason; the reference runs when asked for."""
    path = None
    if corrupt:
        path = str(tmp_path / "_ffi_cpu.cpython-311-x86_64-linux-gnu.so")
        with open(path, "wb") as f:
            f.write(b"\x7fELF truncated")
    run = subprocess.run([sys.executable, "-c", _BROKEN.format(corrupt=path)],
                         capture_output=True, text=True)
    out = run.stdout
    assert run.returncode == 0, run.stderr
    assert "INFO nothing (fails)" in out and "_ffi_cpu" in out
    error = next(line for line in out.splitlines() if line.startswith("ERROR"))
    assert NoLoweringError.__name__ in error and "_ffi_cpu" in error
    assert "reinstall" in error and "JAX_MXFP4_BACKEND=reference" in error
    if corrupt:
        assert "ELF" in error or "invalid" in error or "too short" in error
    assert "REFERENCE OK" in out
