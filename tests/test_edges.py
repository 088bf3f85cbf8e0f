"""Every backend keeps the same rules on the edges (SPEC §2.3, §3.1): zero rows, zero kv
heads, and duplicate slots resolved by the reference lowering itself.

Seen failing before: every zero-row case of the reference (``ZeroDivisionError`` from a
``reshape(..., -1, 32)`` of an empty array), and the public API's too for the format functions;
zero kv heads gave ``ZeroDivisionError`` from validation (or were accepted by write_cache); the
reference's scatter targets repeated (its last-writer rule held on the CPU only because XLA's
CPU scatter happens to be sequential).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import oracle
import pytest
from conftest import SM_SCALE, call
from hypothesis import given, settings
from hypothesis import strategies as st

import jax_mxfp4 as jm
from jax_mxfp4._src.core.pages import last_writer_slots
from jax_mxfp4._src.ops.write_cache.reference import scatter_targets

BACKENDS = ["auto", "reference"]


def _zero_row_calls():
    pool, kv = jm.new_pool(3), jm.new_pool(3, 2)
    none32 = np.zeros(0, np.int32)
    q = np.zeros((0, 4, 128), jnp.bfloat16)
    return {
        "quantize_mxfp4": lambda m: m.quantize_mxfp4(np.zeros((0, 128), np.float32)),
        "quantize_mxfp8": lambda m: m.quantize_mxfp8(np.zeros((0, 2, 128), np.float32)),
        "dequantize_mxfp4": lambda m: m.dequantize_mxfp4(np.zeros((0, 64), np.uint8),
                                                         np.zeros((0, 4), np.uint8)),
        "dequantize_mxfp8": lambda m: m.dequantize_mxfp8(np.zeros((0, 128), jnp.float8_e4m3fn),
                                                         np.zeros((0, 4), np.uint8)),
        "write_cache": lambda m: m.write_cache(pool, np.zeros((0, 128), np.float32), none32),
        "write_cache_heads": lambda m: m.write_cache(kv, np.zeros((0, 2, 128)), none32),
        "index_scores": lambda m: m.index_scores(q[:, :1], pool, np.zeros((2, 3), np.int32),
                                                 none32, none32, num_blocks=3,
                                                 sm_scale=SM_SCALE),
        "select_blocks": lambda m: m.select_blocks(np.zeros((2, 0, 3), np.float32),
                                                   np.zeros((2, 3), np.int32), none32, none32),
        "sparse_attention": lambda m: m.sparse_attention(q, kv, kv, np.zeros((0, 2, 3), np.int32),
                                                         np.zeros((0, 2), np.int32),
                                                         sm_scale=SM_SCALE),
        "sparse_attention_mxfp8": lambda m: m.sparse_attention(
            q, kv, kv, np.zeros((0, 2, 3), np.int32), np.zeros((0, 2), np.int32),
            sm_scale=SM_SCALE, output="mxfp8"),
    }


ZERO_ROW_OPS = list(_zero_row_calls())


@pytest.mark.parametrize("op", ZERO_ROW_OPS)
@pytest.mark.parametrize("where", ["reference", "public", "public-reference-backend"])
def test_zero_rows(op, where):
    """T = 0: empty results of the right shapes (pools unchanged), on every implementation."""
    module = jm.reference if where == "reference" else jm
    backend = "reference" if where.endswith("backend") else "auto"
    with jm.backend_scope(backend):
        out = jax.tree.map(np.asarray, jax.jit(lambda: _zero_row_calls()[op](module))())
    leaves = jax.tree.leaves(out)
    if op.startswith("write_cache"):
        assert leaves[0].shape in ((3, 8704), (3, 2, 8704)) and not leaves[0].any()
    else:
        assert all(0 in leaf.shape for leaf in leaves), [leaf.shape for leaf in leaves]


@pytest.mark.parametrize("backend", BACKENDS)
def test_write_kv_cache_zero_rows(backend):
    kv, index = jm.new_pool(2, 1), jm.new_pool(2)
    with jm.backend_scope(backend):
        out = jm.write_kv_cache(kv, kv, index, np.zeros((0, 1, 128)), np.zeros((0, 1, 128)),
                                np.zeros((0, 128)), np.zeros(0, np.int64))
    assert [np.asarray(o).any() for o in out] == [False] * 3


def test_zero_kv_heads_are_refused_naming_the_pool():
    """A pool with zero kv heads: ValueError naming it at trace time, for every operation that
    takes one (before: ZeroDivisionError from the q-heads check, or accepted); one kv head is
    the accepted side of the boundary."""
    empty = np.zeros((2, 0, 8704), np.uint8)
    q = np.zeros((1, 2, 128), jnp.bfloat16)
    with pytest.raises(ValueError, match=r"\bk_pool must have at least one kv head"):
        jm.sparse_attention(q, empty, empty, np.zeros((1, 0, 1), np.int32),
                            np.zeros((1, 0), np.int32), sm_scale=SM_SCALE)
    with pytest.raises(ValueError, match=r"\bpool must have at least one kv head"):
        jm.write_cache(empty, np.zeros((1, 0, 128)), np.zeros(1, np.int32))
    with pytest.raises(ValueError, match=r"\bk_pool must have at least one kv head"):
        jm.write_kv_cache(empty, empty, None, np.zeros((1, 0, 128)), np.zeros((1, 0, 128)),
                          None, np.zeros(1, np.int32))
    one = jm.new_pool(2, 1)
    jm.sparse_attention(q, one, one, np.zeros((1, 1, 1), np.int32), np.zeros((1, 1), np.int32),
                        sm_scale=SM_SCALE)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(slots=st.lists(st.integers(-3, 2 * 128 + 3), min_size=0, max_size=40))
def test_reference_scatter_targets_are_the_last_writers(slots):
    """The reference resolves duplicates before its scatter: every in-pool target is unique
    and belongs to the last row naming that slot; every other row is dropped."""
    slots = np.array(slots, np.int32)
    page, offset = (np.asarray(a) for a in jax.jit(scatter_targets, static_argnums=1)(slots, 2))
    kept = page < 2
    targets = page[kept] * 128 + offset[kept]
    assert len(set(targets.tolist())) == len(targets)
    for n, s in enumerate(slots):
        last = 0 <= s < 2 * 128 and n == max(np.flatnonzero(slots == s))
        assert kept[n] == last and (not last or page[n] * 128 + offset[n] == s)
    np.testing.assert_array_equal(np.asarray(last_writer_slots(jnp.asarray(slots))) >= 0,
                                  [s >= 0 and n == max(np.flatnonzero(slots == s))
                                   for n, s in enumerate(slots)])


@pytest.mark.parametrize("impl", ["reference", "public"])
def test_duplicate_slots_keep_the_last_row(rng, impl):
    """SPEC §3.1 on the CPU backends (tests/gpu/test_gpu_rules.py checks the GPU ones)."""
    pool = rng.integers(0, 256, (3, 2, 8704), dtype=np.uint8)
    x = oracle.to_bf16(rng.standard_normal((12, 2, 128)))
    slots = np.array([5, 5, 130, 5, -1, 130, 383, 2, 383, 9, 5, 384], np.int32)
    got = call(impl, "write_cache", pool, x, slots)
    np.testing.assert_array_equal(got, oracle.write_cache(pool, x, slots))
