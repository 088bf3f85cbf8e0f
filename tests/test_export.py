"""``jm.export``, ``jm.EXPORT_CHECKS`` and ``jm.deserialize``: a whole decode step exported,
serialized, deserialized (here and in a fresh process) and called gives the jitted step's bits.

Mutation checks: EXPORT_CHECKS without the last CPU target (``SPARSE_ATTENTION_MXFP8``) fails
test_decode_step_round_trip (JAX refuses the custom call); without the GPU launcher's target,
test_checks_name_every_registered_target fails; without the SparseSelection registration,
test_decode_step_round_trip fails at serialize; ``jm.deserialize`` without its target
registration (plain ``jax.export.deserialize``) fails test_deserialized_in_a_fresh_process
("No FFI handler registered for jax_mxfp4_write_cache").

Symbolic row counts (``jax.export.symbolic_shape``): every operation that takes rows exports
on the CPU handlers and the reference backend and runs at any size with the jitted bits;
backends whose kernels need static sizes refuse, naming the operand and its dimension.
Mutation checks: the reference's ``map_row_chunks`` / ``rows_per_chunk`` as before (comparing
the symbolic row count with the chunk) fails test_symbolic_rows_export_and_run for
index_scores and both sparse_attention outputs (JAX's InconclusiveDimensionOperation); without
``operation.check_static_shapes``'s check every test_symbolic_rows_refused_by_the_emulated_backends
case fails (nothing refuses while tracing); without the check in the kernel primitive's
lowering rule (``operation._platform_rule``) every test_symbolic_rows_refused_for_gpu_kernels
case fails (an InconclusiveDimensionOperation from a launch plan, naming no operand).
"""

from __future__ import annotations

import functools
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import SM_SCALE, random_pages

import jax_mxfp4 as jm
from jax_mxfp4._src import exporting, ffi_targets
from jax_mxfp4._src.gpu import launch

PAGES, BLOCKS, REQUESTS = 12, 4, 3


def decode_step(q, q_index, k, v, k_index, k_pool, v_pool, index_pool, block_table, seq_lens):
    """One decode token per request: write its K/V/index key, score, select, attend."""
    positions, requests = jm.decode_rows(seq_lens, tokens_per_request=1)
    slots = jm.slot_mapping(block_table, positions, requests)
    k_pool, v_pool, index_pool = jm.write_kv_cache(k_pool, v_pool, index_pool, k, v, k_index,
                                                   slots)
    scores = jm.index_scores(q_index, index_pool, block_table, positions, requests,
                             num_blocks=BLOCKS, sm_scale=SM_SCALE)
    sel = jm.select_blocks(scores, block_table, positions, requests, topk=2)
    out = jm.sparse_attention(q, k_pool, v_pool, sel.page_table, sel.context_lens,
                              sm_scale=SM_SCALE)
    mxfp8 = jm.sparse_attention(q, k_pool, v_pool, sel.page_table, sel.context_lens,
                                sm_scale=SM_SCALE, output="mxfp8")
    return out, mxfp8, sel, k_pool, v_pool, index_pool


def step_args(rng):
    bf16 = lambda *shape: jnp.asarray(rng.standard_normal(shape), jnp.bfloat16)  # noqa: E731
    table = jnp.asarray(rng.permutation(PAGES)[: REQUESTS * BLOCKS].reshape(REQUESTS, BLOCKS),
                        jnp.int32)
    return (bf16(REQUESTS, 8, 128), bf16(REQUESTS, 1, 128), bf16(REQUESTS, 1, 128),
            bf16(REQUESTS, 1, 128), bf16(REQUESTS, 128),
            jnp.asarray(random_pages(rng, (PAGES, 1))), jnp.asarray(random_pages(rng, (PAGES, 1))),
            jnp.asarray(random_pages(rng, (PAGES,))), table,
            jnp.asarray([300, 1, 512], jnp.int32))


def assert_same_bits(a, b):
    a_leaves, b_leaves = jax.tree.leaves(a), jax.tree.leaves(b)
    assert len(a_leaves) == len(b_leaves)
    for x, y in zip(a_leaves, b_leaves, strict=True):
        x, y = np.asarray(x), np.asarray(y)
        assert x.dtype == y.dtype and x.shape == y.shape
        np.testing.assert_array_equal(x.view(f"u{x.dtype.itemsize}"),
                                      y.view(f"u{y.dtype.itemsize}"))


def test_plain_jax_export_refuses_our_custom_calls(rng):
    """Why jm.export exists: without the checks JAX refuses every jax_mxfp4 custom call."""
    with pytest.raises(ValueError, match="custom calls"):
        jax.export.export(jax.jit(decode_step))(*step_args(rng))


def test_decode_step_round_trip(rng):
    args = step_args(rng)
    exported = jm.export(decode_step)(*args)
    assert isinstance(exported, jax.export.Exported)
    restored = jm.deserialize(exported.serialize())
    expected = jax.jit(decode_step)(*args)
    assert isinstance(expected[2], jm.SparseSelection)
    got = restored.call(*args)
    assert isinstance(got[2], jm.SparseSelection)
    assert_same_bits(got, expected)


def test_checks_name_every_registered_target(rng):
    registered = ffi_targets.register_cpu_targets()
    assert registered and registered <= set(exporting.CUSTOM_CALL_TARGETS)
    assert launch.TARGET in exporting.CUSTOM_CALL_TARGETS
    assert {str(c) for c in jm.EXPORT_CHECKS} == {
        str(jax.export.DisabledSafetyCheck.custom_call(t)) for t in exporting.CUSTOM_CALL_TARGETS}
    text = jm.export(decode_step)(*step_args(rng)).mlir_module()
    called = set(re.findall(r"stablehlo.custom_call @(\w+)", text))
    assert called == set(ffi_targets.cpu_target_names())  # every CPU target is exercised above


def test_export_checks_work_with_jax_export_directly(rng):
    args = step_args(rng)[:5]
    fn = jax.jit(lambda q, *_: jm.quantize_mxfp8(q))
    exported = jax.export.export(fn, disabled_checks=jm.EXPORT_CHECKS)(*args)
    assert_same_bits(exported.call(*args), fn(*args))


def test_export_takes_shapes_a_jitted_function_and_jit_options(rng):
    args = step_args(rng)
    shapes = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in args]
    exported = jm.export(jax.jit(decode_step))(*shapes)
    assert_same_bits(exported.call(*args), jax.jit(decode_step)(*args))
    donated = jm.export(decode_step, donate_argnums=(5, 6, 7))(*shapes)
    assert donated.in_avals == exported.in_avals
    with pytest.raises(ValueError, match="donate_argnums"):
        jm.export(jax.jit(decode_step), donate_argnums=(5,))


DESERIALIZE_ELSEWHERE = """
import sys
import jax
import numpy as np
import jax_mxfp4
exported = jax_mxfp4.deserialize(open(sys.argv[1], "rb").read())
raw = np.load(sys.argv[2])  # the arguments' bytes, viewed back through the exported avals
args = [raw[f"a{i}"].view(a.dtype).reshape(a.shape) for i, a in enumerate(exported.in_avals)]
out = exported.call(*args)
assert isinstance(out[2], jax_mxfp4.SparseSelection)
np.savez(sys.argv[3], *[np.asarray(x).view(np.uint8) for x in jax.tree.leaves(out)])
"""


def test_deserialized_in_a_fresh_process(rng, tmp_path):
    args = step_args(rng)
    (tmp_path / "step.bin").write_bytes(jm.export(decode_step)(*args).serialize())
    np.savez(tmp_path / "args.npz",
             **{f"a{i}": np.asarray(a).view(np.uint8) for i, a in enumerate(args)})
    done = subprocess.run([sys.executable, "-c", DESERIALIZE_ELSEWHERE, str(tmp_path / "step.bin"),
                           str(tmp_path / "args.npz"), str(tmp_path / "out.npz")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    got = np.load(tmp_path / "out.npz")
    want = [np.asarray(x).view(np.uint8) for x in jax.tree.leaves(jax.jit(decode_step)(*args))]
    assert len(got) == len(want)
    for i, w in enumerate(want):
        np.testing.assert_array_equal(got[f"arr_{i}"], w)


# ---------------------------------------------------------------------------------------------
# Symbolic row counts (jax.export.symbolic_shape)
# ---------------------------------------------------------------------------------------------

HQ, HKV, H_INDEX, TABLE_W = 8, 2, 8, 4  # 3 requests x 8 index heads: the gathered scorer


def _rows_args(rng, t):
    """Each operation's arguments with ``t`` rows, and where the rows are: ``(fn, args, row
    axes as (argument, axis) pairs, the operand a refusal names)``."""
    bf16 = lambda *shape: jnp.asarray(rng.standard_normal(shape), jnp.bfloat16)  # noqa: E731
    ints = lambda lo, hi, *shape: jnp.asarray(rng.integers(lo, hi, shape), jnp.int32)  # noqa: E731
    kv_pool, index_pool = jnp.asarray(random_pages(rng, (PAGES, HKV))), jnp.asarray(
        random_pages(rng, (PAGES,)))
    table = ints(-1, PAGES + 1, REQUESTS, TABLE_W)
    positions, requests = ints(-1, 4 * 128, t), ints(0, REQUESTS, t)
    slots = ints(-2, PAGES * 128 + 2, t)
    return {
        "write_cache": (jm.write_cache, (kv_pool, bf16(t, HKV, 128), slots), [(1, 0), (2, 0)],
                        "x"),
        "write_kv_cache": (jm.write_kv_cache, (kv_pool, kv_pool, index_pool, bf16(t, HKV, 128),
                                               bf16(t, HKV, 128), bf16(t, 128), slots),
                           [(3, 0), (4, 0), (5, 0), (6, 0)], "k"),
        "index_scores": (functools.partial(jm.index_scores, num_blocks=TABLE_W, sm_scale=SM_SCALE),
                         (bf16(t, H_INDEX, 128), index_pool, table, positions, requests),
                         [(0, 0), (3, 0), (4, 0)], "q"),
        "select_blocks": (functools.partial(jm.select_blocks, topk=2),
                          (jnp.asarray(rng.standard_normal((HKV, t, TABLE_W)), jnp.float32),
                           table, positions, requests), [(0, 1), (2, 0), (3, 0)], "scores"),
        "sparse_attention": (functools.partial(jm.sparse_attention, sm_scale=SM_SCALE),
                             (bf16(t, HQ, 128), kv_pool, kv_pool, ints(-1, PAGES + 1, t, HKV, 3),
                              ints(0, 3 * 128 + 1, t, HKV)), [(0, 0), (3, 0), (4, 0)], "q"),
        "sparse_attention_mxfp8": (
            functools.partial(jm.sparse_attention, sm_scale=SM_SCALE, output="mxfp8"),
            (bf16(t, HQ, 128), kv_pool, kv_pool, ints(-1, PAGES + 1, t, HKV, 3),
             ints(0, 3 * 128 + 1, t, HKV)), [(0, 0), (3, 0), (4, 0)], "q"),
    }


SYMBOLIC_OPS = list(_rows_args(np.random.default_rng(0), 1))


def _symbolic_specs(args, row_axes):
    """``args`` as ``jax.ShapeDtypeStruct``s whose row axes are the symbolic dimension T."""
    (rows,) = jax.export.symbolic_shape("T")
    shapes = [list(a.shape) for a in args]
    for i, axis in row_axes:
        shapes[i][axis] = rows
    return [jax.ShapeDtypeStruct(tuple(s), a.dtype) for s, a in zip(shapes, args, strict=True)]


@pytest.mark.parametrize("op", SYMBOLIC_OPS)
@pytest.mark.parametrize("backend", ["auto", "reference"])
def test_symbolic_rows_export_and_run(rng, backend, op):
    """One export with a symbolic row count, called at two sizes: the bits of the function
    jitted at each size (the C++ handlers take any size; the reference chunks its rows in a
    loop of symbolic length)."""
    fn, args, row_axes, _ = _rows_args(rng, 1)[op]
    with jm.backend_scope(backend):
        exported = jm.export(fn)(*_symbolic_specs(args, row_axes))
        for t in (1, 5):
            args = _rows_args(rng, t)[op][1]
            assert_same_bits(exported.call(*args), jax.jit(fn)(*args))


@pytest.mark.parametrize("op", SYMBOLIC_OPS)
@pytest.mark.parametrize("backend", ["emulated-gfx950", "emulated-gfx942"])
def test_symbolic_rows_refused_by_the_emulated_backends(rng, backend, op):
    """Their kernels launch grids sized from the shapes: refused while tracing (so no kernel
    is needed here), naming the operand and its dimension."""
    fn, args, row_axes, name = _rows_args(rng, 1)[op]
    want = rf"^{name}: dimension {row_axes[0][1]} \('T'\) must be static for backend '{backend}':"
    with jm.backend_scope(backend), pytest.raises(ValueError, match=want):
        jax.jit(fn).trace(*_symbolic_specs(args, row_axes))  # traced only, never lowered


@pytest.mark.parametrize("op", SYMBOLIC_OPS)
@pytest.mark.parametrize(("platform", "arch"), [("cuda", "90"), ("rocm", "gfx942"),
                                                ("rocm", "gfx950")])
def test_symbolic_rows_refused_for_gpu_kernels(rng, platform, arch, op):
    """Exported for a GPU under backend "auto": refused when the call is lowered, before any
    kernel is compiled or planned (so no GPU, Triton or FlyDSL is needed here). The kernel
    primitive names its own operands (``write_kv_cache``'s ``k`` is ``write_cache``'s ``x``)."""
    fn, args, row_axes, name = _rows_args(rng, 1)[op]
    name = "x" if op == "write_kv_cache" else name
    want = (rf"^{name}: dimension {row_axes[0][1]} \('T'\) must be static for backend 'auto' "
            rf"on {platform} {arch}:")
    with jm.lowering_options(gpu_arch=arch), pytest.raises(ValueError, match=want):
        jm.export(fn, platforms=[platform])(*_symbolic_specs(args, row_axes))


def test_cpu_targets_are_the_operations_own():
    """The C++ side writes each target name once (``JAX_MXFP4_CPU_TARGET`` in ffi/cpu); each
    operation's CPU lowering derives its target from the operation's primitive name
    (``ffi_targets.cpu_target``). The two sets must be one: a renamed primitive or handler
    fails here, not at a user's first call."""
    from jax_mxfp4._src.dispatch.lowering import CpuHandler
    from jax_mxfp4._src.dispatch.operation import OPERATIONS

    wanted = {lowering.target for op in OPERATIONS for lowering in op.lowerings
              if isinstance(lowering, CpuHandler)}
    assert len(wanted) == len(OPERATIONS) == 5
    assert wanted == ffi_targets.cpu_target_names()
