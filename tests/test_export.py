"""``jm.export``, ``jm.EXPORT_CHECKS`` and ``jm.deserialize``: a whole decode step exported,
serialized, deserialized (here and in a fresh process) and called gives the jitted step's bits.

Mutation checks: EXPORT_CHECKS without the last CPU target (``SPARSE_ATTENTION_MXFP8``) fails
test_decode_step_round_trip (JAX refuses the custom call); without the GPU launcher's target,
test_checks_name_every_registered_target fails; without the SparseSelection registration,
test_decode_step_round_trip fails at serialize; ``jm.deserialize`` without its target
registration (plain ``jax.export.deserialize``) fails test_deserialized_in_a_fresh_process
("No FFI handler registered for jax_mxfp4_write_cache").
"""

from __future__ import annotations

import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import SM_SCALE, random_pages

import jax_mxfp4 as jm
from jax_mxfp4 import exporting, ffi_targets
from jax_mxfp4.gpu import launch

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
    assert called == set(ffi_targets.CPU_TARGETS)  # every CPU target is exercised above


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
