"""The C++ CPU FFI handlers (``ffi/cpu``), called directly through ``jax.ffi.ffi_call``.

Each target is compared with ``jax_mxfp4.reference`` (the plain-jnp definition of SPEC) and
with the float64 oracle (``tests/oracle.py``): bit for bit for ``write_cache``,
``select_blocks`` and the MXFP8 epilogue, bit for bit for ``index_scores`` where every product
and partial sum is exact (e4m3 queries, one scale byte per token) and within
``oracle.index_score_tolerance`` of the score's magnitude elsewhere, and within the SPEC §10
attention tolerance for ``sparse_attention``. Every case runs on both kernel flavours: the
AVX-512 BF16 kernels (where the CPU has them) and the portable ones
(``JAX_MXFP4_CPU_ISA=generic``).

The oracle takes SPEC-valid rows; a row whose request is outside the block table is a padding
row by the package's convention (``reference._common.row_is_live``), so such rows are handed to
the oracle as padding (:func:`spec_rows`).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import oracle
import pytest
from conftest import (
    BF16,
    SM_SCALE,
    AttentionCase,
    IndexCase,
    attention_case,
    call,
    decode_index_case,
    prefill_index_case,
    random_pages,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jax_mxfp4._src import ffi_targets as ft
from jax_mxfp4._src.core import formats

pytestmark = [
    pytest.mark.skipif(ft.cpu_target("mxfp4_select_blocks") not in ft.register_cpu_targets(),
                       reason="the C++ extension jax_mxfp4._ffi_cpu is not built"),
    pytest.mark.usefixtures("isa"),  # every test with the SIMD kernels and the portable ones
]


# ---------------------------------------------------------------------------------------------
# One helper per target: the exact operand order and attributes of the FFI contract
# ---------------------------------------------------------------------------------------------


def _sds(shape, dtype):
    return jax.ShapeDtypeStruct(tuple(int(s) for s in shape), dtype)


@functools.partial(jax.jit, static_argnames=("round_mode", "aliased"))
def ffi_write_cache(pool, x, slots, *, round_mode="up", aliased=True):
    aliases = {0: 0} if aliased else {}
    call = jax.ffi.ffi_call(ft.cpu_target("mxfp4_write_cache"), _sds(pool.shape, jnp.uint8),
                            input_output_aliases=aliases)
    return call(pool, x.astype(jnp.bfloat16), slots.astype(jnp.int32),
                round_mode=np.int32(ft.ROUND_MODE_CODES[round_mode]))


@functools.partial(jax.jit, static_argnames=("num_blocks", "sm_scale", "q_round"))
def ffi_index_scores(q, pool, table, positions, requests, *, num_blocks, sm_scale,
                     q_round="e4m3"):
    out = _sds((q.shape[1], q.shape[0], num_blocks), jnp.float32)
    return jax.ffi.ffi_call(ft.cpu_target("mxfp4_index_scores"), out)(
        q, pool, table, positions, requests, score_scale=oracle.score_scale(sm_scale),
        round_q=q_round == "e4m3")


@functools.partial(jax.jit, static_argnames=("topk", "init_blocks", "local_blocks"))
def ffi_select_blocks(scores, table, positions, requests, *, topk=16, init_blocks=0,
                      local_blocks=1):
    h, t, _ = scores.shape
    outs = (_sds((h, t, topk), jnp.int32), _sds((t, h, topk), jnp.int32),
            _sds((t, h), jnp.int32))
    return jax.ffi.ffi_call(ft.cpu_target("mxfp4_select_blocks"), outs)(
        scores, table, positions, requests, init_blocks=np.int64(init_blocks),
        local_blocks=np.int64(local_blocks))


@functools.partial(jax.jit, static_argnames=("sm_scale", "output"))
def ffi_sparse_attention(q, k_pool, v_pool, page_table, context_lens, *, sm_scale,
                         output="bf16"):
    t, hq, d = q.shape
    if output == "mxfp8":
        outs = (_sds((t, hq * d), jnp.float8_e4m3fn), _sds((t, hq * d // 32), jnp.uint8))
        target = ft.cpu_target("mxfp4_sparse_attention_mxfp8")
    else:
        outs = _sds((t, hq, d), jnp.bfloat16)
        target = ft.cpu_target("mxfp4_sparse_attention")
    return jax.ffi.ffi_call(target, outs)(
        q, k_pool, v_pool, page_table, context_lens, sm_scale=np.float32(sm_scale))


# ---------------------------------------------------------------------------------------------
# Comparisons
# ---------------------------------------------------------------------------------------------


def assert_bits_equal(got, want):
    """Same dtype, shape and bit patterns (``oracle.bits_equal``: any NaN matches any NaN)."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, (got.dtype, got.shape, want.dtype, want.shape)
    same = oracle.bits_equal(got, want)
    bad = np.argwhere(~same)
    assert len(bad) == 0, (f"{len(bad)} of {same.size} differ, e.g. at {bad[:3].tolist()}: "
                           f"{got[~same][:3]} vs {want[~same][:3]}")


def spec_rows(positions, requests, num_requests):
    """(positions, requests) for the oracle: a row whose request is outside the block table
    becomes a padding row (position -1, request 0)."""
    requests = np.asarray(requests)
    live = (requests >= 0) & (requests < num_requests)
    return (np.where(live, positions, -1).astype(np.int32),
            np.where(live, requests, 0).astype(np.int32))


def assert_scores_close(got, want, magnitude, tolerances=1):
    """NaN and inf where ``want`` has them; elsewhere within ``tolerances`` times
    ``oracle.index_score_tolerance`` (1 against the oracle, 2 against another backend)."""
    got, want = np.asarray(got), np.asarray(want)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    fin = np.isfinite(want)
    np.testing.assert_array_equal(got[~fin & ~np.isnan(want)], want[~fin & ~np.isnan(want)])
    err = oracle.index_score_errors(got[fin], want[fin], magnitude[fin])
    assert np.all(err <= tolerances), f"max err / tol {err.max()}"


def assert_attention_close(got, want, *, unit=1.0):
    """SPEC §10 (``oracle.attention_close``: finite output, rtol = atol = 1e-2 with <= 1%
    outside, relative L2 <= 5e-3) after dividing both sides by ``unit`` (for outputs far from
    magnitude 1); an all-zero expectation is matched exactly."""
    g = np.asarray(got).astype(np.float64) / unit
    w = np.asarray(want).astype(np.float64) / unit
    assert g.shape == w.shape, (g.shape, w.shape)
    assert not np.isnan(w).any(), "the expectation has NaNs"
    if not w.any():
        assert not g.any(), "non-zero output where every expected value is zero"
    ok, msg = oracle.attention_close(g, w)
    assert ok, msg


# ---------------------------------------------------------------------------------------------
# write_cache
# ---------------------------------------------------------------------------------------------


def special_rows(rng, n, heads):
    """bf16 rows mixing normal values, exact e2m1 ties, zero blocks, subnormals, inf/NaN."""
    x = rng.standard_normal((n, heads, 128)) * np.exp2(rng.integers(-20, 20, (n, heads, 1)))
    ties = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, -0.25, -2.5, 0.0, -0.0])
    x[0, :, :32] = rng.choice(ties, (heads, 32)) * 2.0**3
    x[0, :, 32:64] = 0.0
    x[1 % n, :, :32] = rng.standard_normal((heads, 32)) * 2.0**-130  # bf16 subnormals
    x[2 % n, :, 64:96] = rng.standard_normal((heads, 32)) * 2.0**126
    x[3 % n, :, 96] = np.inf
    x[4 % n, :, 100] = np.nan
    x[5 % n, :, :32] = -0.0
    return x.astype(BF16)


def check_write_cache(pool, x, slots, round_mode="up", **kw):
    """The handler against the reference, bit for bit, and against the oracle too where ``x``
    is finite (SPEC leaves the scale byte of a block holding inf/NaN open)."""
    got = np.asarray(ffi_write_cache(pool, x, slots, round_mode=round_mode, **kw))
    assert_bits_equal(got, call("reference", "write_cache", pool, x, slots,
                                round_mode=round_mode))
    if np.isfinite(x.astype(np.float32)).all():
        assert_bits_equal(got, oracle.write_cache(np.asarray(pool), x, slots, round_mode))


@pytest.mark.parametrize("round_mode", ["up", "even", "down"])
@pytest.mark.parametrize("heads", [1, 3])
def test_write_cache_matches_reference(rng, round_mode, heads):
    num_pages, n = 5, 40
    pool = rng.integers(0, 256, (num_pages, heads, 8704), dtype=np.uint8)
    x = special_rows(rng, n, heads)
    slots = rng.permutation(num_pages * 128)[:n].astype(np.int32)
    slots[:6] = [-1, num_pages * 128, 2**31 - 1, -(2**31), 0, num_pages * 128 - 1]
    for aliased in (True, False):
        check_write_cache(pool, x, slots, round_mode, aliased=aliased)


def test_write_cache_index_pool_without_head_axis(rng):
    pool = rng.integers(0, 256, (4, 8704), dtype=np.uint8)
    x = special_rows(rng, 20, 1)[:, 0]
    slots = rng.permutation(4 * 128)[:20].astype(np.int32)
    slots[:2] = [-3, 4 * 128]
    check_write_cache(pool, x, slots)


def test_write_cache_last_row_wins_and_empty(rng):
    pool = rng.integers(0, 256, (2, 1, 8704), dtype=np.uint8)
    x = oracle.to_bf16(rng.standard_normal((4, 1, 128)))
    slots = np.array([7, 7, 200, 7], np.int32)
    check_write_cache(pool, x, slots)
    empty = ffi_write_cache(pool, x[:0], slots[:0])
    assert_bits_equal(empty, pool)


def test_write_cache_in_place_under_donation(rng):
    pool = jnp.asarray(rng.integers(0, 256, (3, 2, 8704), dtype=np.uint8))
    x = oracle.to_bf16(rng.standard_normal((5, 2, 128)))
    slots = np.array([3, 130, -1, 300, 383], np.int32)
    want = call("reference", "write_cache", pool, x, slots)
    assert_bits_equal(want, oracle.write_cache(np.asarray(pool), x, slots))
    step = jax.jit(lambda p, x, s: ffi_write_cache(p, x, s), donate_argnums=0)
    assert_bits_equal(step(pool, x, slots), want)


# ---------------------------------------------------------------------------------------------
# index_scores
# ---------------------------------------------------------------------------------------------


def far_ids(num_pages):
    """Block-table ids for entries past a request's blocks: out of range, or pages 0 and 1."""
    return [-1, -5, num_pages, num_pages + 7, 2**31 - 1, 0, 1]


def run_index(case, q_round="e4m3", magnitudes=False):
    """Scores of an ``IndexCase``: (handler, reference, oracle[, oracle magnitudes])."""
    kw = dict(num_blocks=case.num_blocks, sm_scale=SM_SCALE, q_round=q_round)
    got = np.asarray(ffi_index_scores(*case.args(), **kw))
    want = call("reference", "index_scores", *case.args(), **kw)
    spec_args = (case.q, case.pool, case.block_table,
                 *spec_rows(case.positions, case.requests, len(case.block_table)))
    spec = oracle.index_scores(*spec_args, **kw)
    if magnitudes:
        return got, want, spec, oracle.index_score_magnitudes(*spec_args, **kw)
    return got, want, spec


def assert_index_exact(case):
    got, want, spec = run_index(case)
    assert_bits_equal(got, want)
    assert_bits_equal(got, spec)
    return got, want


@pytest.mark.parametrize("q_dtype", ["bf16", "e4m3"])
def test_index_scores_exact_per_token_scales(rng, q_dtype):
    """Scale bytes 100..150 per token, e4m3 queries: every sum is exact -> bit for bit."""
    case = prefill_index_case(rng, [37, 0, 300, 5], [0, 50, 130, 700], num_rows=360,
                              num_blocks=6, table_width=7, num_pages=16, q_dtype=q_dtype,
                              per_token=True, scale_lo=100, scale_hi=150,
                              unused_ids=far_ids(16))
    _, want = assert_index_exact(case)
    assert np.isfinite(want).any() and np.isneginf(want).any()


@pytest.mark.parametrize("q_config", [("bf16", "e4m3"), ("bf16", "none"), ("e4m3", "e4m3")])
def test_index_scores_per_block_scales(rng, q_config):
    """Per-32-block bytes: fp32 sums may round; within the index score tolerance of the
    oracle (docs/spec.md §10), and twice that of the reference lowering."""
    q_dtype, q_round = q_config
    case = decode_index_case(rng, [1, 128, 129, 300, 513], 3, num_heads=3, num_blocks=5,
                             table_width=6, num_pages=12, q_dtype=q_dtype, scale_lo=119,
                             scale_hi=133, unused_ids=far_ids(12))
    got, want, spec, mag = run_index(case, q_round, magnitudes=True)
    assert_scores_close(got, want, mag, tolerances=2)
    assert_scores_close(got, spec, mag)


def test_index_scores_decode_many_requests(rng):
    """Decode shape (one row per request, several heads), exact data, padding rows."""
    seq = rng.integers(0, 900, 20)
    seq[:3] = [0, 1, 128]
    case = decode_index_case(rng, seq, 1, num_heads=4, num_blocks=8, table_width=8,
                             num_pages=160, q_dtype="e4m3", per_token=True, scale_lo=110,
                             scale_hi=140, unused_ids=far_ids(160))
    assert_index_exact(case)


def test_index_scores_nan_and_extreme_scales(rng):
    """Byte 255 on a live token gives NaN; bytes 1 and 254 stay exact; garbage never leaks."""
    case = decode_index_case(rng, [200, 256], 2, num_blocks=3, table_width=3, num_pages=6,
                             q_dtype="e4m3", per_token=True, scale_lo=1, scale_hi=254,
                             unused_ids=far_ids(6))
    pool, table = case.pool, case.block_table
    pool[table[0, 1], 8192 + 4 * 3 + 2] = 255  # live token 3 of block 1 of request 0
    pool[table[1, 0], 8192:8192 + 64] = 254
    pool[table[1, 0], 8192 + 64:8192 + 128] = 1
    _, want = assert_index_exact(case)
    assert np.isnan(want).any()


def test_index_scores_all_padding_and_bad_requests(rng):
    case = decode_index_case(rng, [300], 5, num_blocks=3, table_width=4, num_pages=4,
                             q_dtype="e4m3", per_token=True, unused_ids=far_ids(4))
    case.positions = np.array([-1, 5, 140, -7, 299], np.int32)
    case.requests = np.array([0, 1, -1, 0, 0], np.int32)
    got, _ = assert_index_exact(case)
    assert np.isneginf(got[:, :4]).all()


# ---------------------------------------------------------------------------------------------
# select_blocks
# ---------------------------------------------------------------------------------------------


def tie_scores(rng, shape):
    """Scores with many ties, NaNs, +-0 and infinities."""
    s = rng.integers(-3, 4, shape).astype(np.float32)
    s[rng.random(shape) < 0.1] = np.nan
    s[rng.random(shape) < 0.05] = -0.0
    s[rng.random(shape) < 0.03] = np.inf
    s[rng.random(shape) < 0.03] = -np.inf
    return s


def check_select(scores, table, positions, requests, **kw):
    """The handler against the reference, bit for bit, and against the oracle, bit for bit, on
    the SPEC-valid version of the operands (out-of-table requests as padding rows)."""
    def ffi(*args):
        return jax.tree.map(np.asarray, ffi_select_blocks(*args, **kw))

    want = call("reference", "select_blocks", scores, table, positions, requests, **kw)
    for g, w in zip(ffi(scores, table, positions, requests), want, strict=True):
        assert_bits_equal(g, w)
    rows = spec_rows(positions, requests, len(table))
    spec = oracle.select_blocks(scores, table, *rows, **kw)
    for g, s in zip(ffi(scores, table, *rows), spec, strict=True):
        assert_bits_equal(g, s)


@pytest.mark.parametrize("params", [(16, 0, 1), (4, 1, 1), (3, 2, 0), (40, 0, 2), (1, 0, 0)])
def test_select_blocks_matches_reference(rng, params):
    topk, init_blocks, local_blocks = params
    heads, rows, num_blocks, num_requests = 2, 30, 24, 3
    scores = tie_scores(rng, (heads, rows, num_blocks))
    table = rng.integers(-3, 100, (num_requests, 26)).astype(np.int32)
    positions = rng.integers(-2, 3500, rows).astype(np.int32)
    positions[:6] = [0, 127, 128, 2**31 - 1, -1, 24 * 128 - 1]
    requests = rng.integers(-1, num_requests + 1, rows).astype(np.int32)
    check_select(scores, table, positions, requests, topk=topk, init_blocks=init_blocks,
                 local_blocks=local_blocks)


# ---------------------------------------------------------------------------------------------
# sparse_attention
# ---------------------------------------------------------------------------------------------


def ffi_attention_case(rng, context_lens, **kw):
    """``conftest.attention_case`` over 4 pages a row, K scale bytes 122..130, unused table
    slots pointing at the NaN-scaled page, -1, P + 3 or INT32_MAX."""
    kw = dict(dict(n_pages=4, k_scales=(122, 130), unused="extreme"), **kw)
    return attention_case(rng, context_lens, **kw)


def check_attention(case, sm_scale=SM_SCALE, unit=1.0):
    """The handler against the float64 oracle and against the reference (SPEC §10)."""
    got = np.asarray(ffi_sparse_attention(*case.args(), sm_scale=sm_scale)).astype(np.float32)
    want = call("reference", "sparse_attention", *case.args(), sm_scale=sm_scale)
    assert_attention_close(got, oracle.sparse_attention_f64(*case.args(), sm_scale=sm_scale),
                           unit=unit)
    assert_attention_close(got, want, unit=unit)
    return got


@pytest.mark.parametrize("q_dtype", ["bf16", "e4m3"])
@pytest.mark.parametrize("shape", [(1, 16), (2, 4), (3, 1)])
def test_sparse_attention_matches_reference(rng, q_dtype, shape):
    kv, group = shape
    ctx = rng.integers(0, 4 * 128 + 1, (9, kv)).astype(np.int32)
    ctx[0, 0], ctx[1, 0], ctx[2, 0] = 0, 1, 512
    case = ffi_attention_case(rng, ctx, group=group, q_dtype=q_dtype)
    got = check_attention(case)
    assert np.all(got[0, :group] == 0)


def test_sparse_attention_context_clipping_and_masked_pages(rng):
    ctx = np.array([[700], [-5], [300], [129]], np.int32)
    case = ffi_attention_case(rng, np.clip(ctx, 0, 512), group=2)
    case.context_lens = ctx
    case.page_table[2, 0, 1] = -1  # a masked page in the middle of a row
    case.page_table[3, 0, :] = [-2, 10**6, -3, -4]  # nothing live
    got = check_attention(case)
    assert np.all(got[1] == 0) and np.all(got[3] == 0)


@pytest.mark.parametrize("scales", [
    (-80, 80, 0), (-80, 120, 0), (0, 120, 0), (-133, 127, 0), (0, 0, 100), (0, -100, -100)])
def test_sparse_attention_extreme_scales(rng, scales):
    """SPEC §11 extremes: q 2**a, |k| 2**b, |v| 2**c (bytes clipped to 1..254)."""
    qa, kb, vc = scales
    case = ffi_attention_case(rng, np.array([[200], [64], [384]], np.int32), group=4,
                              q_scale=2.0**qa)
    case.k_pool[..., 8192:] = np.clip(127 + kb, 1, 254)
    case.v_pool[..., 8192:] = np.clip(127 + vc, 1, 254)
    got = check_attention(case, unit=2.0**vc)
    assert np.isfinite(got).all()


@pytest.mark.parametrize("q_dtype", ["bf16", "e4m3"])
def test_sparse_attention_mxfp8_epilogue_is_bitwise(rng, q_dtype):
    ctx = rng.integers(0, 513, (7, 2)).astype(np.int32)
    case = ffi_attention_case(rng, ctx, group=3, q_dtype=q_dtype, q_scale=40.0,
                              v_scales=(100, 150))
    bf16 = ffi_sparse_attention(*case.args(), sm_scale=SM_SCALE)
    values, scales = ffi_sparse_attention(*case.args(), sm_scale=SM_SCALE, output="mxfp8")
    flat = np.asarray(bf16).reshape(bf16.shape[0], -1)
    for want_values, want_scales in (formats.quantize_mxfp8(flat), oracle.quantize_mxfp8(flat)):
        assert_bits_equal(values, want_values)
        assert_bits_equal(scales, want_scales)
    ref_values, _ = call("reference", "sparse_attention", *case.args(), sm_scale=SM_SCALE,
                         output="mxfp8")
    assert_attention_close(np.asarray(values).astype(np.float32), ref_values.astype(np.float32))


# ---------------------------------------------------------------------------------------------
# Errors: bad operands come back as errors, not crashes
# ---------------------------------------------------------------------------------------------


def test_bad_operands_are_reported():
    q = jnp.zeros((2, 1, 64), jnp.bfloat16)  # head dim 64: refused
    pool = jnp.zeros((2, 8704), jnp.uint8)
    table = jnp.zeros((1, 2), jnp.int32)
    rows = jnp.zeros((2,), jnp.int32)
    call = jax.ffi.ffi_call(ft.cpu_target("mxfp4_index_scores"), _sds((1, 2, 2), jnp.float32))
    with pytest.raises(Exception, match="q must be"):
        jax.block_until_ready(call(q, pool, table, rows, rows, score_scale=np.float32(1.0),
                                   round_q=True))
    call = jax.ffi.ffi_call(ft.cpu_target("mxfp4_index_scores"),
                            _sds((1, 2, 3), jnp.float32))  # NB > W
    with pytest.raises(Exception, match="NB <= W"):
        jax.block_until_ready(call(q.reshape(2, 1, 64).repeat(2, -1), pool, table, rows, rows,
                                   score_scale=np.float32(1.0), round_q=True))
    wc = jax.ffi.ffi_call(ft.cpu_target("mxfp4_write_cache"), _sds((2, 1, 8704), jnp.uint8))
    with pytest.raises(Exception, match="round_mode"):
        jax.block_until_ready(wc(jnp.zeros((2, 1, 8704), jnp.uint8),
                                 jnp.zeros((1, 1, 128), jnp.bfloat16), jnp.zeros((1,), jnp.int32),
                                 round_mode=np.int32(7)))
    sel = jax.ffi.ffi_call(ft.cpu_target("mxfp4_select_blocks"), (_sds((1, 2, 4), jnp.int32),
                                              _sds((2, 1, 4), jnp.int32),
                                              _sds((2, 1), jnp.int32)))
    with pytest.raises(Exception, match="W >= NB"):
        jax.block_until_ready(sel(jnp.zeros((1, 2, 5), jnp.float32), table, rows, rows,
                                  init_blocks=np.int64(0), local_blocks=np.int64(1)))


# ---------------------------------------------------------------------------------------------
# Fuzzing the metadata: equality with the reference and the oracle, and no crash
# ---------------------------------------------------------------------------------------------

FUZZ_PAGES, FUZZ_REQUESTS, FUZZ_WIDTH, FUZZ_ROWS, FUZZ_BLOCKS = 6, 3, 5, 8, 4
_FUZZ = np.random.default_rng(1234)
FUZZ_POOL = random_pages(_FUZZ, (FUZZ_PAGES,), 1, 254, per_token=True)
FUZZ_POOL[0, 8192 + 40] = 255
FUZZ_Q = oracle.to_e4m3(_FUZZ.standard_normal((FUZZ_ROWS, 2, 128)))
FUZZ_KV = random_pages(_FUZZ, (FUZZ_PAGES, 2), 110, 135)
FUZZ_X = oracle.to_bf16(_FUZZ.standard_normal((FUZZ_ROWS, 2, 128)))

page_ids = st.one_of(st.integers(-3, FUZZ_PAGES + 2), st.sampled_from([-(2**31), 2**31 - 1]))
fuzz_settings = settings(max_examples=60, deadline=None,
                         suppress_health_check=[HealthCheck.function_scoped_fixture])


@fuzz_settings
@given(
    positions=st.lists(st.one_of(st.integers(-3, 700), st.just(2**31 - 1)),
                       min_size=FUZZ_ROWS, max_size=FUZZ_ROWS),
    requests=st.lists(st.integers(-2, FUZZ_REQUESTS + 1), min_size=FUZZ_ROWS,
                      max_size=FUZZ_ROWS),
    table=st.lists(page_ids, min_size=FUZZ_REQUESTS * FUZZ_WIDTH,
                   max_size=FUZZ_REQUESTS * FUZZ_WIDTH),
    topk=st.sampled_from([1, 3, 6]),
    init_blocks=st.integers(0, 2),
    local_blocks=st.integers(0, 2),
)
def test_fuzz_index_and_select(positions, requests, table, topk, init_blocks, local_blocks):
    pos = np.array(positions, np.int32)
    req = np.array(requests, np.int32)
    bt = np.array(table, np.int32).reshape(FUZZ_REQUESTS, FUZZ_WIDTH)
    _, want = assert_index_exact(IndexCase(FUZZ_Q, FUZZ_POOL, bt, pos, req, FUZZ_BLOCKS, None))
    check_select(want, bt, pos, req, topk=topk, init_blocks=init_blocks,
                 local_blocks=local_blocks)


@fuzz_settings
@given(
    pages=st.lists(page_ids, min_size=FUZZ_ROWS * 2 * 3, max_size=FUZZ_ROWS * 2 * 3),
    context=st.lists(st.one_of(st.integers(-5, 400), st.sampled_from([-(2**31), 2**31 - 1])),
                     min_size=FUZZ_ROWS * 2, max_size=FUZZ_ROWS * 2),
    slots=st.lists(st.one_of(st.integers(-3, FUZZ_PAGES * 128 + 3),
                             st.sampled_from([-(2**31), 2**31 - 1])),
                   min_size=FUZZ_ROWS, max_size=FUZZ_ROWS, unique=True),
)
def test_fuzz_attention_and_write(pages, context, slots):
    table = np.array(pages, np.int32).reshape(FUZZ_ROWS, 2, 3)
    ctx = np.array(context, np.int32).reshape(FUZZ_ROWS, 2)
    q = FUZZ_X[:, :2].repeat(2, axis=1)  # Hq = 4, G = 2
    check_attention(AttentionCase(q, FUZZ_KV, FUZZ_KV, table, ctx))
    check_write_cache(FUZZ_KV, FUZZ_X, np.array(slots, np.int32))
