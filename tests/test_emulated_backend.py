"""The emulated ROCm backends' plumbing: each operation lowers on the CPU exactly as on the GPU,
and the launcher's CPU form hands the emulator the launch the GPU launcher would perform.

These tests swap the emulator for a recorder (``emulated.emulate``), so they check the launch
itself: the code object and symbol the ROCm lowering chose, its grid, block and LDS bytes, the
parameters packed by the launcher's own code (buffer addresses, scalars) and the buffers (an
aliased pool arrives as one buffer; what the emulator writes into a result is the call's
output). The emulator's own tests and the kernels checked in it live in ``tests/emulator/``.

Mutation check (performed by hand): packing i32 parameters into the high half of their slot in
``ffi/gpu/launch.cc`` (``PackParams``) makes test_the_emulator_receives_the_gpu_launch fail.
"""

from __future__ import annotations

import ctypes

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_mxfp4 as jm
from jax_mxfp4._src.dispatch import emulated
from jax_mxfp4._src.gpu import launch

pytest.importorskip("triton")


@pytest.fixture
def recorder(monkeypatch, built):
    """Launches reach a recorder that writes a marker into the first bytes of the last
    buffer (the call's result), with the session's prebuilt FlyDSL code objects."""
    monkeypatch.setenv("JAX_MXFP4_KERNEL_DIR", str(built[0]))
    seen = []

    def record(image, symbol, grid, block, shared, params, buffers):
        seen.append(dict(image=image, symbol=symbol, grid=grid, block=block, shared=shared,
                         params=params, buffers=buffers))
        address, size, _ = buffers[-1]
        np.ctypeslib.as_array((ctypes.c_uint8 * size).from_address(address))[:4] = 7

    monkeypatch.setattr(emulated, "emulate", record)
    yield seen
    emulated.install()  # the real emulator again


def _write(pool, x, slots):
    return jm.write_cache(pool, x, slots, round_mode="even")


def _write_args():
    return (jm.new_pool(4, num_heads=1), jnp.ones((3, 1, 128)), jnp.array([1, 2, 300],
                                                                          jnp.int32))


@pytest.mark.parametrize("backend,kernel", [("emulated-gfx950", "jax_mxfp4_write_cache"),
                                            ("emulated-gfx942", "write_cache_kernel")])
def test_the_emulator_receives_the_gpu_launch(recorder, backend, kernel):
    args = _write_args()
    with jm.backend_scope(backend):
        (entry,) = jm.explain(_write, *args)
        out = jax.jit(_write)(*args)
    assert entry.target.endswith("(emulated on the CPU)") and kernel in entry.lowering
    call = recorder[-1]
    assert [c["symbol"] for c in recorder] == [kernel]  # a short write: no slot table
    assert call["block"][0] in (256, 64 * 4)
    assert launch.assembly_of(call["image"]) is not None
    kinds = [k for k, _ in call["params"]]
    addresses = [a for a, _, _ in call["buffers"]]
    sizes = [n for _, n, _ in call["buffers"]]
    assert sizes[:3] == [4 * 8704, 3 * 128 * 2, 3 * 4] and sizes[-1] == 4 * 8704
    assert addresses[0] == addresses[-1]  # the pool operand aliases the pool result
    pointers = [v for k, v in call["params"] if k == launch.BUFFER]
    assert set(pointers) <= set(addresses) and addresses[-1] in pointers
    scalars = [v for k, v in call["params"] if k == launch.I32]
    assert 3 in scalars and 4 in scalars and 1 in scalars  # tokens, pages, heads / round code
    assert kinds.count(launch.BUFFER) == (3 if backend == "emulated-gfx950" else 4)
    assert np.asarray(out).reshape(-1)[:4].tolist() == [7] * 4  # what the emulator wrote


def test_every_operation_has_a_gfx950_and_gfx942_lowering(built, monkeypatch):
    """``jm.explain`` names FlyDSL for every operation a gfx950 FlyDSL kernel covers (under
    ``make test`` the package and its kernels are the installed wheel's: issue 43)."""
    monkeypatch.setenv("JAX_MXFP4_KERNEL_DIR", str(built[0]))
    s = jax.ShapeDtypeStruct

    def step(k_pool, index_pool, q, q_index, table, positions, requests, index_k, slots):
        index_pool = jm.write_cache(index_pool, index_k, slots)
        scores = jm.index_scores(q_index, index_pool, table, positions, requests,
                                 num_blocks=4, sm_scale=0.125)
        sel = jm.select_blocks(scores, table, positions, requests, topk=2)
        return jm.sparse_attention(q, k_pool, k_pool, sel.page_table, sel.context_lens,
                                   sm_scale=0.125)

    args = (s((8, 1, 8704), jnp.uint8), s((8, 8704), jnp.uint8), s((2, 16, 128), jnp.bfloat16),
            s((2, 1, 128), jnp.bfloat16), s((2, 4), jnp.int32), s((2,), jnp.int32),
            s((2,), jnp.int32), s((2, 128), jnp.bfloat16), s((2,), jnp.int32))
    with jm.backend_scope("emulated-gfx950"):
        gfx950 = [e.lowering.split(":")[0] for e in jm.explain(step, *args)]
    with jm.backend_scope("emulated-gfx942"):
        gfx942 = [e.lowering.split(":")[0] for e in jm.explain(step, *args)]
    assert gfx950 == ["flydsl", "flydsl", "triton", "flydsl"]  # no FlyDSL select_blocks
    assert gfx942 == ["triton"] * 4
    with jm.backend_scope("emulated-gfx950"):
        (entry,) = jm.explain(lambda x: jm.write_cache(*x), (s((4, 8704), jnp.uint8),
                                                           s((1, 128), jnp.bfloat16),
                                                           s((1,), jnp.int32)),
                              platform="cuda")
    assert entry.lowering == "none" and "CPU" in entry.skipped[0][1]


def test_kernarg_bytes_place_explicit_and_hidden_arguments():
    """What a HIP runtime builds from the launcher's packed parameters and the metadata."""
    args = [(0, 8, "global_buffer"), (8, 4, "by_value"), (12, 4, "by_value"),
            (16, 4, "hidden_block_count_x"), (20, 4, "hidden_block_count_y"),
            (24, 2, "hidden_group_size_x"), (26, 2, "hidden_grid_dims"),
            (28, 8, "hidden_global_offset_x")]
    params = [(launch.BUFFER, 0x1122334455667788), (launch.I32, 0xFFFFFFFF),
              (launch.F32, 0x3F800000)]
    segment = emulated.kernarg_bytes(args, 40, (5, 2, 1), (256, 1, 1), params)
    words = np.frombuffer(segment, np.uint8)
    assert segment[:8] == (0x1122334455667788).to_bytes(8, "little")
    assert segment[8:12] == b"\xff\xff\xff\xff" and segment[12:16] == b"\x00\x00\x80\x3f"
    assert int.from_bytes(segment[16:20], "little") == 5
    assert int.from_bytes(segment[20:24], "little") == 2
    assert int.from_bytes(segment[24:26], "little") == 256
    assert int.from_bytes(segment[26:28], "little") == 2
    assert not words[28:].any()
    with pytest.raises(ValueError, match="parameters"):
        emulated.kernarg_bytes(args, 40, (1, 1, 1), (64, 1, 1), params[:2])


def test_the_emulated_target_takes_the_units_the_lowering_is_told():
    """``lowering_options(gpu_units=...)`` sizes the emulated backends' launch plans as it does
    a GPU's (a test can then reach the plans a large device takes with a few rows); without it
    the emulated device keeps its own count."""
    from jax_mxfp4._src.core.targets import CPU
    from jax_mxfp4._src.dispatch.backend import LoweringConfig

    for name, (arch, units) in emulated.EMULATED.items():
        target = emulated._target(arch, units)
        assert target(CPU, None, LoweringConfig(gpu_units=8)).units == 8, name
        assert target(CPU, None, LoweringConfig()).units == units, name
