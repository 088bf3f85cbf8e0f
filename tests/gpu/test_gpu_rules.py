"""The rules every backend keeps (SPEC §6, §2.3, §3.1, §2.4, §9.2), on the GPU: the
Triton kernels and the reference lowering agree bit for bit where SPEC says bit for bit, and
the reference lowering is deterministic there too.

Seen failing before (on the H200, 2026-11-30): the reference lowering of ``write_cache`` gave
20 different results in 20 calls when slots repeat (XLA's GPU scatter applies conflicting
updates in any order); it now resolves duplicates before its scatter.
"""

from __future__ import annotations

import gpu_env
import jax
import numpy as np
import oracle
import pytest
from conftest import SM_SCALE, attention_case, decode_index_case, prefill_index_case, random_pages

import jax_mxfp4 as jm
from jax_mxfp4._src.dispatch.backend import backend_scope

pytestmark = gpu_env.required()


def run(backend, fn, *args, **static):
    with backend_scope(backend):
        return jax.tree.map(np.asarray, jax.jit(lambda *a: fn(*a, **static))(*args))


def duplicate_slots_case(rng, rows):
    pool = random_pages(rng, (8, 2))
    x = oracle.to_bf16(rng.standard_normal((rows, 2, 128)) * 4)
    slots = rng.integers(-5, 8 * 128 + 5, rows).astype(np.int32)
    slots[rows // 2:] = slots[: rows - rows // 2]  # every slot of the first half recurs
    slots[::7] = slots[0]  # and one slot many times
    return pool, x, slots


@pytest.mark.parametrize("rows", [40, 5000], ids=["kernel_scan", "sorted_slots"])
def test_reference_and_triton_write_cache_agree_on_repeated_slots(rng, rows):
    pool, x, slots = duplicate_slots_case(rng, rows)
    kernel = run("auto", jm.write_cache, pool, x, slots)
    reference = run("reference", jm.write_cache, pool, x, slots)
    np.testing.assert_array_equal(kernel, reference)
    np.testing.assert_array_equal(reference, oracle.write_cache(pool, x, slots))


def test_reference_write_cache_gives_the_same_bits_every_call(rng):
    pool, x, slots = duplicate_slots_case(rng, 3000)
    with backend_scope("reference"):
        step = jax.jit(jm.write_cache)
        first = np.asarray(step(pool, x, slots))
        for _ in range(20):
            np.testing.assert_array_equal(np.asarray(step(pool, x, slots)), first)
    np.testing.assert_array_equal(first, oracle.write_cache(pool, x, slots))


@pytest.mark.parametrize("poison", [1e30, np.inf, np.nan])
@pytest.mark.parametrize("params", [(2, 1, 1), (16, 0, 1), (3, 2, 2)], ids=str)
def test_select_blocks_forced_blocks_cannot_be_outranked(rng, poison, params):
    """Scores of 1e30, +inf or NaN in other blocks: every row keeps its init and local blocks,
    Triton bit for bit with the reference and the oracle (SPEC §6)."""
    topk, init_blocks, local_blocks = params
    num_blocks, rows = 30, 40
    scores = rng.standard_normal((2, rows, num_blocks)).astype(np.float32)
    scores[rng.random(scores.shape) < 0.5] = poison
    table = rng.integers(0, 500, (4, 32)).astype(np.int32)
    positions = rng.integers(-1, num_blocks * 128 + 100, rows).astype(np.int32)
    positions[:2] = [2**31 - 1, 0]
    requests = rng.integers(0, 4, rows).astype(np.int32)
    static = dict(topk=topk, init_blocks=init_blocks, local_blocks=local_blocks)
    kernel = run("auto", jm.select_blocks, scores, table, positions, requests, **static)
    reference = run("reference", jm.select_blocks, scores, table, positions, requests, **static)
    want = oracle.select_blocks(scores, table, positions, requests, **static)
    for k, r, w in zip(kernel, reference, want, strict=True):
        np.testing.assert_array_equal(k, r)
        np.testing.assert_array_equal(k, w)


@pytest.mark.parametrize("backend", ["auto", "reference"])
def test_int64_metadata_on_the_gpu(rng, backend):
    """SPEC §2.4 in the graph on the GPU: traced int64 slots outside int32 are skipped."""
    pool = random_pages(rng, (4,))
    x = oracle.to_bf16(rng.standard_normal((3, 128)))
    with jax.enable_x64(True):
        wide = jax.numpy.asarray(np.array([2**32 + 5, 7, -(2**32) + 9], np.int64))
        got = run(backend, jm.write_cache, pool, x, wide)
    np.testing.assert_array_equal(got, oracle.write_cache(pool, x, np.array([-1, 7, -1])))


def assert_classes(got, want):
    """NaN and infinities exactly where ``want`` has them (with their signs)."""
    got, want = np.asarray(got).astype(np.float64), np.asarray(want).astype(np.float64)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(got[np.isinf(want)], want[np.isinf(want)])
    assert np.isfinite(got[np.isfinite(want)]).all()


@pytest.mark.parametrize("q_round", ["e4m3", "none"])
@pytest.mark.parametrize("shape", ["decode", "decode1", "prefill"])
def test_index_scores_nonfinite(rng, shape, q_round):
    """SPEC §9.2 in every tiling: a live NaN key scale, a NaN bf16 query element (through
    the in-kernel e4m3 rounding, which must keep it NaN), an infinite one (NaN with
    ``q_round="none"``, 448 with e4m3), keys at byte 254 (an overflow, NaN whatever the
    summation order): classes equal to the oracle and to the reference lowering; the rest
    within twice the index score tolerance of each other as usual."""
    kw = dict(num_blocks=5, table_width=6, num_pages=40, scale_lo=118, scale_hi=128)
    if shape == "decode":
        case = decode_index_case(rng, [600, 140, 300, 257], 4, num_heads=2, **kw)
    elif shape == "decode1":
        case = decode_index_case(rng, [600, 140, 300, 257, 0], 1, num_heads=1, **kw)
    else:
        case = prefill_index_case(rng, [100, 60], [200, 0], num_rows=200, num_heads=1, **kw)
    live = np.flatnonzero(case.positions >= 140)
    case.pool[case.block_table[case.requests[live[0]], 1], 8192 + 4 * 2 + 3] = 255
    case.q[live[1], 0, 9] = np.nan
    case.q[live[2], 0, 3] = np.inf
    case.pool[case.block_table[case.requests[live[-1]], 0], 8192:] = 254
    static = dict(num_blocks=case.num_blocks, sm_scale=SM_SCALE, q_round=q_round)
    kernel = run("auto", jm.index_scores, *case.args(), **static)
    reference = run("reference", jm.index_scores, *case.args(), **static)
    want = oracle.index_scores(*case.args(), **static)
    assert np.isnan(want).sum() >= 3
    assert_classes(kernel, want)
    assert_classes(reference, want)
    magnitude = oracle.index_score_magnitudes(*case.args(), **static)
    finite = np.isfinite(want) & np.isfinite(magnitude)
    assert finite.sum() >= 4  # decode1: 5 rows x 5 blocks, 6-8 of them finite (CPU check)
    assert oracle.index_score_errors(kernel[finite], reference[finite],
                                     magnitude[finite]).max() <= 2


@pytest.mark.parametrize("rows", [1, 600], ids=["split", "direct"])
@pytest.mark.parametrize("output", ["bf16", "mxfp8"])
def test_sparse_attention_nonfinite(rng, rows, output):
    """SPEC §9.2 through the split-K merge (1 row: several splits) and the direct path: a
    live NaN key scale, NaN / infinite bf16 query elements and an overflowing logit make their
    q heads NaN (whole rows), a live V byte 255 its 32 dims NaN; classes equal to the oracle
    and the reference lowering; the MXFP8 output of NaN rows is quantize_mxfp8 of the bf16."""
    ctx = rng.integers(1, 16 * 128 + 1, (rows, 1)).astype(np.int32)
    ctx[0, 0] = 16 * 128
    case = attention_case(rng, ctx, group=16, n_pages=16)
    case.q[0, 2, 5] = np.nan
    case.q[0, 4, 6] = np.inf
    case.v_pool[case.page_table[0, 0, 5], 0, 8192 + 4 * 9 + 2] = 255
    if rows > 1:  # whole rows (every q head of the kv head)
        case.q[1] = oracle.to_bf16(case.q[1].astype(np.float64) * 2.0**125)
        case.k_pool[case.page_table[1, 0, 0], 0, 8192:] = 250
        case.k_pool[case.page_table[2, 0, 0], 0, 8192 + 4 * 0 + 1] = 255
    static = dict(sm_scale=SM_SCALE)
    kernel = run("auto", jm.sparse_attention, *case.args(), **static)
    reference = run("reference", jm.sparse_attention, *case.args(), **static)
    want = oracle.sparse_attention(*case.args(), **static)
    assert np.isnan(want.astype(np.float64)).all(axis=-1).sum() >= 2
    assert_classes(kernel, want)
    assert_classes(reference, want)
    if output == "mxfp8":
        values, scales = run("auto", jm.sparse_attention, *case.args(), output="mxfp8",
                             **static)
        want_values, want_scales = jax.tree.map(
            np.asarray, jm.quantize_mxfp8(kernel.reshape(rows, -1)))
        np.testing.assert_array_equal(scales, want_scales)
        assert oracle.bits_equal(values, want_values).all()
