"""GPU kernel functions run by Triton's interpreter on the CPU, against the float64 oracle.

Run as a script by ``test_triton_interpreter.py`` (``TRITON_INTERPRET=1`` must be set before
the kernels are decorated, so it needs a process of its own). Values are checked bit for bit
only for kernels without ``tl.dot`` and with in-kernel e4m3 rounding only of values exact in
e4m3: the interpreter's fp16 dots are not exact and its fp32 -> e4m3 conversion rounds 1.96
down to 1.0 (triton 3.6.0); kernels with dots are checked for the class of each result (NaN,
-inf, finite: SPEC §9.2). Prints one ``ok <name>`` line per check; raises on a mismatch.

Arrays go to the kernels as :class:`HostArray`, a numpy array with the few tensor methods the
interpreter calls (``data_ptr``, storage and view bookkeeping), so no torch is needed.
"""

from __future__ import annotations

import dataclasses
import os
import sys

os.environ["TRITON_INTERPRET"] = "1"

import ml_dtypes
import numpy as np
import oracle
import triton
import triton.language as tl
from conftest import SM_SCALE, attention_case, decode_index_case, prefill_index_case, widen_index_q
from host_array import HostArray

from jax_mxfp4._src.core.scaling import folded_score_scale
from jax_mxfp4._src.ops.index_scores import triton as index_scores
from jax_mxfp4._src.ops.index_scores import triton_kernel as index_scores_triton
from jax_mxfp4._src.ops.select_blocks import triton as select_blocks
from jax_mxfp4._src.ops.sparse_attention import triton as sparse_attention
from jax_mxfp4._src.triton import mxfp4


@triton.jit
def _page_values_kernel(page_ptr, out_ptr, n_live):
    codes, scales = mxfp4.page_bytes(page_ptr, True)
    tok = tl.arange(0, 128)
    even, odd = mxfp4.page_values(codes, scales, tok < n_live, tl.float32, False)
    base = out_ptr + tok[:, None] * 128 + 2 * tl.arange(0, 64)[None, :]
    tl.store(base, even)
    tl.store(base + 1, odd)


def check_page_values(rng) -> None:
    """Every element of a random page (scale bytes 1..255, so some values overflow to inf and
    a few groups are NaN) dequantized bit for bit (any NaN for a NaN); tokens past the live
    count are zeros, their NaN scales included."""
    page = rng.integers(0, 256, 8704).astype(np.uint8)
    page[8192:] = rng.integers(1, 256, 512)
    page[8192 + 4 * 110:] = 255  # dead tokens with NaN scales
    out = HostArray(np.zeros(128 * 128, np.float32))
    _page_values_kernel[(1,)](HostArray(page), out, 100)
    got = out.array.reshape(128, 128)
    with np.errstate(over="ignore"):
        want = oracle.dequant_pool(page[None])[0].astype(np.float32)
    want[100:] = 0.0
    assert np.isnan(want).any()
    assert oracle.bits_equal(got, want).all()
    print("ok page_values")


def one_row_scores(case, q_round: str, blocks: int | None = None) -> np.ndarray:
    """index_scores_kernel with the plan's one-row (CUDA-core) tiling, or with ``blocks``
    blocks per program (the pipelined walk of a large grid); ``f32 [1, T, NB]``."""
    q, pool, table, positions, requests = (np.asarray(a) for a in case.args()[:5])
    rows, requests_n = len(positions), table.shape[0]
    plan = index_scores.plan(rows, 1, requests_n, case.num_blocks, num_sms=132)
    assert plan.one_row, plan
    if blocks is not None:
        plan = plan.with_blocks(blocks, case.num_blocks)
    out = HostArray(np.full((1, rows, case.num_blocks), 7.0, np.float32))
    q_fp8 = str(q.dtype) == "float8_e4m3fn"
    index_scores_triton.index_scores_kernel[plan.grid](
        *map(HostArray, (q, pool, table, positions, requests)), out, rows,
        requests_n, table.shape[1], pool.shape[0], case.num_blocks,
        float(folded_score_scale(SM_SCALE)), H=1, ROWS=plan.rows, M=plan.m,
        BLOCKS=plan.blocks, Q_IS_FP8=q_fp8, ROUND_Q=False, PTX=False,
        DOT_DTYPE=tl.bfloat16 if q_round == "none" else tl.float16, ONE_ROW=True, FOLD=False,
        INT_DOTS=q_fp8, num_warps=plan.num_warps)
    return out.array


@triton.jit
def _scale_pow2_kernel(e_ptr, x_ptr, out_ptr, N: tl.constexpr, OFFSET: tl.constexpr):
    i = tl.arange(0, N)
    e, x = tl.load(e_ptr + i), tl.load(x_ptr + i)
    tl.store(out_ptr + i, mxfp4.pow2(e))
    tl.store(out_ptr + N + i, mxfp4.pow2_to_128(e))
    smax = e & 0xFF
    nan_keys = tl.where(smax == mxfp4.NAN_BYTE, float("nan"), x)
    tl.store(out_ptr + 2 * N + i, mxfp4.mul_pow2(nan_keys, smax + OFFSET))
    tl.store(out_ptr + 3 * N + i, mxfp4.mul_scale_pow2(x, smax, OFFSET))


def check_scale_pow2(rng) -> None:
    """The clamp-free powers of two the index epilogues take are :func:`mxfp4.pow2` and
    :func:`mxfp4.mul_pow2` (NaN at the e8m0 NaN byte) bit for bit over their whole input
    range: every exponent in [-300, 128], every scale byte at both offsets the kernels use,
    on values from subnormal to near overflow (NaN and infinities among them)."""
    n = 1024
    e = np.arange(-300, -300 + n, dtype=np.int32)
    e[e > 128] = rng.integers(-300, 129, int((e > 128).sum()))
    e[:256] = np.arange(256)  # as scale bytes: every one of them
    x = (rng.standard_normal(n) * np.exp2(rng.integers(-140, 128, n))).astype(np.float32)
    x[:4] = [np.nan, np.inf, -np.inf, 0.0]
    for offset in (-127 + 14, mxfp4.ROW_OFFSET.value):
        out = HostArray(np.zeros(4 * n, np.float32))
        _scale_pow2_kernel[(1,)](HostArray(e), HostArray(x), out, N=n, OFFSET=offset)
        pow2, capped, mul, scaled = out.array.reshape(4, n)
        inside = e <= 128  # pow2_to_128's domain (the scale bytes above it feed smax only)
        assert inside.sum() > 600
        np.testing.assert_array_equal(capped[inside].view(np.uint32),
                                      pow2[inside].view(np.uint32))
        assert oracle.bits_equal(scaled, mul).all(), offset
    print("ok scale_pow2")


def check_one_row_index_scores(rng) -> None:
    """Exact data (e4m3 queries, one scale byte per token): bit-equal to the oracle, at 1, 2
    and 4 blocks per program, with the rows in request order and shuffled. Within
    ``oracle.index_score_tolerance`` (scales 110..140): bf16 queries kept as bf16
    (q_round="none", the fp32 dots) and e4m3 queries over e4m3's whole range (the integer
    dots, ``row_dot``)."""
    kw = dict(num_heads=1, num_blocks=6, table_width=8, num_pages=40)
    exact = decode_index_case(rng, [700, 40, 129, 1, 0], 1, q_dtype="e4m3", per_token=True,
                              scale_lo=124, scale_hi=130, **kw)
    order = np.array([3, 0, 4, 2, 1])
    shuffled = dataclasses.replace(exact, q=exact.q[order], positions=exact.positions[order],
                                   requests=exact.requests[order])
    for case in (exact, shuffled):
        want = oracle.index_scores(*case.args(), num_blocks=case.num_blocks, sm_scale=SM_SCALE)
        for blocks in (None, 2, 4):  # 4: the second program's last two blocks lie past NB
            got = one_row_scores(case, "e4m3", blocks)
            np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    case = decode_index_case(rng, [600, 33, 128, 257, 0, 1], 1, scale_lo=110, scale_hi=140,
                             **kw)
    wide = decode_index_case(rng, [600, 33, 128, 257, 0, 1], 1, q_dtype="e4m3", scale_lo=110,
                             scale_hi=140, **kw)
    widen_index_q(wide)  # the integer dots' three query slices, every one of them used
    for q_round, tolerated in (("none", case), ("e4m3", wide)):
        got = one_row_scores(tolerated, q_round)
        static = dict(num_blocks=tolerated.num_blocks, sm_scale=SM_SCALE, q_round=q_round)
        want = oracle.index_scores(*tolerated.args(), **static).astype(np.float64)
        assert np.array_equal(np.isneginf(got), np.isneginf(want))
        live = np.isfinite(want)
        magnitude = oracle.index_score_magnitudes(*tolerated.args(), **static)[live]
        err = oracle.index_score_errors(got[live], want[live], magnitude)
        assert err.max() <= 1, (q_round, err.max())
    print("ok one_row_index_scores")


@triton.jit
def _mxfp8_store_kernel(o_ptr, values_ptr, scales_ptr, t, qh0):
    g = tl.arange(0, 4)
    # the attention kernels hold the output's columns in value order (mxfp4.value_dims)
    o = tl.load(o_ptr + g[:, None] * 128 + mxfp4.value_dims()[None, :])
    sparse_attention._store_output(o, values_ptr, scales_ptr, t, qh0, g, g < 4, 4, True, False)


def check_mxfp8_epilogue(rng) -> None:
    """The attention kernel's MXFP8 store of one token's 4 q heads (16 blocks): blocks with an
    Inf or NaN get scale byte 255 and NaN values (SPEC §1.9); finite blocks get the SPEC §1.6
    scale. Finite values are e4m3-exact after scaling (small integers times a power of two),
    so the interpreter's inexact e4m3 rounding cannot hide or fake a difference."""
    o = rng.integers(-15, 16, (4, 128)).astype(np.float32)
    o *= np.exp2(rng.integers(-20, 20, (4, 4, 1))).repeat(32, 1).reshape(4, 128)
    o[0, 3], o[1, 40], o[2, 64:96], o[3, 100] = np.inf, np.nan, -np.inf, np.nan
    o[3, 101] = np.inf
    values = HostArray(np.zeros(4 * 128, oracle.E4M3))
    scales = HostArray(np.zeros(4 * 4, np.uint8))
    _mxfp8_store_kernel[(1,)](HostArray(o), values, scales, 0, 0)
    want_values, want_scales = oracle.quantize_mxfp8(o.reshape(1, -1))
    got_scales = scales.array.reshape(1, -1)
    np.testing.assert_array_equal(got_scales, want_scales)
    assert (got_scales.reshape(4, 4) == 255).sum() == 4, got_scales
    np.testing.assert_array_equal(values.array.view(np.uint8),
                                  want_values.view(np.uint8).reshape(-1))
    print("ok mxfp8_epilogue")


def interpreted_select(scores, table, positions, requests, topk, init_blocks, local_blocks,
                       rows_per_program=None):
    """select_blocks_kernel as the lowering's plan launches it, or with ``rows_per_program``
    rows of a head per program."""
    heads, rows, num_blocks = scores.shape
    layout = select_blocks.plan(rows, num_blocks, topk)
    per_program = rows_per_program or layout.rows_per_program
    ids = HostArray(np.full((heads, rows, topk), 7, np.int32))
    pages = HostArray(np.full((rows, heads, topk), 7, np.int32))
    ctx = HostArray(np.full((rows, heads), 7, np.int32))
    select_blocks.select_blocks_kernel[(-(-rows // per_program), heads, 1)](
        *map(HostArray, (scores, table, positions, requests)), ids, pages, ctx,
        rows, table.shape[0], table.shape[1], num_blocks, init_blocks, local_blocks, H=heads,
        NBP=layout.blocks, TOPK=topk, KP=layout.selections, ROWS=per_program)
    return ids.array, pages.array, ctx.array


def check_select_blocks(rng) -> None:
    """Forced blocks by construction, scores that could outrank sentinels (1e30, +inf, NaN,
    FLT_MAX), ties, -0/+0, position INT32_MAX, padding rows: equal to the oracle, with one row
    per program and with several (the last program part empty), for a short and a long row."""
    short = [(2, 1, 1), (3, 2, 2), (16, 0, 1), (1, 3, 0), (64, 5, 7)]
    long = [(16, 0, 1), (64, 5, 7)]  # the interpreter walks a 128-key network slowly
    for num_blocks, per_program, configs in [(9, None, short), (9, 1, short[:2]),
                                             (9, 8, short[:2]), (100, None, long),
                                             (100, 2, long[:1])]:
        _check_select_blocks(rng, num_blocks, per_program, configs)
    print("ok select_blocks")


def _check_select_blocks(rng, num_blocks, rows_per_program, configs) -> None:
    heads, rows = 2, 12
    scores = rng.integers(-2, 3, (heads, rows, num_blocks)).astype(np.float32)
    poison = np.array([1e30, np.inf, np.nan, -np.inf, 3.4e38, -0.0], np.float32)
    mask = rng.random(scores.shape) < 0.4
    scores[mask] = rng.choice(poison, mask.sum())
    table = rng.integers(0, 1000, (3, num_blocks + 1)).astype(np.int32)
    positions = rng.integers(-1, num_blocks * 128 + 300, rows).astype(np.int32)
    positions[:3] = [2**31 - 1, -1, 130]
    requests = rng.integers(0, 3, rows).astype(np.int32)
    requests[3] = 5  # outside the table: a padding row
    for topk, init_blocks, local_blocks in configs:
        got = interpreted_select(scores, table, positions, requests, topk, init_blocks,
                                 local_blocks, rows_per_program)
        spec_pos = np.where((requests >= 0) & (requests < 3), positions, -1)
        want = oracle.select_blocks(scores, table, spec_pos, np.clip(requests, 0, 2),
                                    topk=topk, init_blocks=init_blocks,
                                    local_blocks=local_blocks)
        for g, w in zip(got, want, strict=True):
            np.testing.assert_array_equal(g, w)


def interpreted_scores(case, q_round: str, num_heads: int,
                       blocks: int | None = None) -> np.ndarray:
    """index_scores_kernel with the lowering's plan for the case (group dots or folded keys,
    as ``plan`` picks: the interpreter's dots are not exact, so only classes are compared),
    or with ``blocks`` blocks per program."""
    q, pool, table, positions, requests = (np.asarray(a) for a in case.args()[:5])
    rows, requests_n = len(positions), table.shape[0]
    plan = index_scores.plan(rows, num_heads, requests_n, case.num_blocks, num_sms=132)
    if blocks is not None:
        plan = plan.with_blocks(blocks, case.num_blocks)
    out = HostArray(np.full((num_heads, rows, case.num_blocks), 7.0, np.float32))
    q_fp8 = str(q.dtype) == "float8_e4m3fn"
    index_scores_triton.index_scores_kernel[plan.grid](
        *map(HostArray, (q, pool, table, positions, requests)), out, rows,
        requests_n, table.shape[1], pool.shape[0], case.num_blocks,
        float(folded_score_scale(SM_SCALE)), H=num_heads, ROWS=plan.rows, M=plan.m,
        BLOCKS=plan.blocks, Q_IS_FP8=q_fp8, ROUND_Q=not q_fp8 and q_round == "e4m3",
        PTX=False, DOT_DTYPE=tl.bfloat16 if q_round == "none" else tl.float16,
        ONE_ROW=plan.one_row, FOLD=plan.fold, INT_DOTS=plan.one_row and q_fp8,
        num_warps=plan.num_warps)
    return out.array, plan


def poison_index_case(case) -> None:
    """In place: a NaN key scale on a live token, and keys at scale byte 254 in one row's
    block 0 (dot products past FLT_MAX)."""
    table, positions, requests = case.block_table, case.positions, case.requests
    live = np.flatnonzero(positions >= 130)
    row = live[0]
    page = table[requests[row], 1]
    case.pool[page, 8192 + 4 * 2 + 3] = 255  # token 2 of block 1: live for the row
    case.q.view(np.uint8)[row, :, 96:] = 0  # its group's products are 0 (NaN only by rule)
    big = live[-1]
    case.q.view(np.uint8)[big] &= 0x7F  # |q|: the row's logits do not cancel
    case.pool[table[requests[big], 0], 8192:] = 254


def poison_diagonal_block(case) -> None:
    """In place: keys at scale byte 254 in the last live row's block 2, which a prefill
    tile's rows see only in part (the masked path of ``folded_row_maxima``)."""
    live = case.positions >= 0
    big = np.flatnonzero(live)[-1]
    # the row reaches block 2, and some row of the tile sees only part of it
    assert case.positions[big] >= 256 and case.positions[live].min() < 2 * 128 + 127
    case.pool[case.block_table[case.requests[big], 2], 8192:] = 254


def check_index_score_classes(rng) -> None:
    """SPEC §9.2 in every tiling (one row on the CUDA cores, group dots, folded keys): NaN
    where the oracle has NaN, -inf where it has -inf, finite elsewhere. e4m3 queries, and no
    NaN query: the interpreter's e4m3 conversions are not the hardware's (it decodes the e4m3
    NaN 0x7F as 480, and a bf16 NaN rounded to e4m3 came out finite) and its bf16 dots lost
    queries near 2**118, so NaN queries are left to tests/gpu/test_gpu_rules.py."""
    kw = dict(num_blocks=4, table_width=5, num_pages=40, scale_lo=120, scale_hi=126,
              q_dtype="e4m3")
    folded = prefill_index_case(rng, [70], [200], num_rows=70, num_heads=1, **kw)
    poison_diagonal_block(folded)  # (block 0, every row's whole, is poisoned below)
    cases = [
        ("one_row", decode_index_case(rng, [600, 140, 300, 5], 1, num_heads=1, **kw), 1, None),
        ("group_dots", decode_index_case(rng, [600, 140, 300], 4, num_heads=2, **kw), 2, None),
        ("folded", folded, 1, None),
        # a prefill tile's prefetching walk: block j + 1's page loaded while j is scored
        ("folded", folded, 1, 3),
    ]
    for name, case, heads, blocks in cases:
        if blocks is None:
            poison_index_case(case)
        got, plan = interpreted_scores(case, "e4m3", heads, blocks)
        assert plan.one_row == (name == "one_row") and plan.fold == (name == "folded"), plan
        want = oracle.index_scores(*case.args(), num_blocks=case.num_blocks,
                                   sm_scale=SM_SCALE, q_round="e4m3")
        assert np.isnan(want).sum() >= 2, name
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=name)
        np.testing.assert_array_equal(np.isneginf(got), np.isneginf(want), err_msg=name)
        assert np.isfinite(got[np.isfinite(want)]).all(), name
    print("ok index_score_classes")


def interpreted_attention(case, splits: int, blocks: int | None = None) -> np.ndarray:
    """attention_kernel (and reduce_kernel when ``splits > 1``, ``blocks`` MXFP8 blocks per
    merge program, by default the lowering's) as the lowering launches them, but with the PV
    product in fp32 (the interpreter's bf16 dots are wrong: 16 ones times 16 ones gave 4.2e9):
    bf16 output ``[T, Hq, 128]`` as float32."""
    q, k_pool, v_pool, table, ctx = (np.asarray(a) for a in case.args())
    tokens, q_heads, _ = q.shape
    num_pages, kv_heads = k_pool.shape[:2]
    group, n = q_heads // kv_heads, table.shape[-1]
    rows, gp = tokens * kv_heads, 16
    out = HostArray(np.zeros((tokens, q_heads, 128), ml_dtypes.bfloat16))
    consts = dict(G=group, GP=gp, PAGES=-(-n // splits), SPLITS=splits, Q_IS_FP8=False,
                  MXFP8=False, PTX=False, PV_DTYPE=tl.float32)
    args = [HostArray(a) for a in (q, k_pool, v_pool, table, ctx)]
    scalars = [kv_heads, num_pages, n, float(SM_SCALE)]
    if splits == 1:
        sparse_attention.attention_kernel[(rows, 1, 1)](*args, out, out, out, out, *scalars,
                                                        **consts)
    else:
        parts = rows * splits * gp
        o = HostArray(np.zeros(parts * 128, ml_dtypes.bfloat16))
        m, l_ = (HostArray(np.zeros(parts, np.float32)) for _ in range(2))
        sparse_attention.attention_kernel[(rows, splits, 1)](*args, o, o, m, l_, *scalars,
                                                             **consts)
        sparse_attention.reduce_kernel[sparse_attention.reduce_grid(rows, blocks)](
            o, m, l_, out, out, G=group, GP=gp, SPLITS=splits, MXFP8=False,
            BLOCKS=blocks or sparse_attention.REDUCE_BLOCKS, PTX=False)
    return out.array.astype(np.float32)


def check_attention_classes(rng) -> None:
    """SPEC §9.2 through the direct and the split-K paths: a live NaN key scale, a NaN and
    an infinite bf16 query element, an overflowing logit make their q heads NaN; a live V
    byte 255 makes its 32 dims NaN; garbage past the contexts does not leak. Classes against
    the oracle (NaN, +-inf, finite)."""
    ctx = np.array([[200, 130], [60, 256], [129, 1], [0, 90], [300, 300]], np.int32)
    case = attention_case(rng, ctx, group=2, n_pages=3, unused="mixed")
    case.k_pool[case.page_table[0, 1, 1], 1, 8192 + 4 * 1 + 3] = 255
    case.q[1, 1, 5] = np.inf
    case.q[2, 3, 9] = np.inf
    case.q[4, 0] = oracle.to_bf16(case.q[4, 0].astype(np.float64) * 2.0**125)
    case.k_pool[case.page_table[4, 0, 0], 0, 8192:] = 250
    case.v_pool[case.page_table[1, 1, 0], 1, 8192 + 4 * 10 + 2] = 255
    want = oracle.sparse_attention(*case.args(), sm_scale=SM_SCALE).astype(np.float32)
    assert np.isnan(want).any(axis=-1).sum() >= 5
    direct = None
    for splits in (1, 3):
        got = interpreted_attention(case, splits)
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=f"{splits}")
        np.testing.assert_array_equal(np.isinf(got), np.isinf(want), err_msg=f"{splits}")
        if direct is None:
            direct = got
    # The merge's values (the interpreter's dots are not exact, so against the direct path,
    # which shares them): within SPEC §10's attention tolerance (the partials are bf16).
    finite = np.isfinite(want)
    ok, why = oracle.attention_close(got[finite], direct[finite])
    assert ok, why
    # The merge's bits do not depend on how a row's columns are sliced over its programs.
    other = 4 if sparse_attention.REDUCE_BLOCKS != 4 else 1
    assert oracle.bits_equal(got, interpreted_attention(case, 3, blocks=other)).all()
    print("ok attention_classes")


def check_attention_long_rows(rng) -> None:
    """The merge of a row of more splits than ``MERGE_IN_FLIGHT`` (18 one-page splits: the
    stats pass, then blocks of partials; ``check_attention_classes`` covers the in-flight
    merge) against the direct path over the same 18-page table (which shares the
    interpreter's inexact dots), within SPEC §10's attention tolerance."""
    assert sparse_attention.MERGE_IN_FLIGHT < 18
    ctx = np.array([[18 * 128 - 5], [900]], np.int32)
    case = attention_case(rng, ctx, group=2, n_pages=18)
    ok, why = oracle.attention_close(interpreted_attention(case, 18),
                                     interpreted_attention(case, 1))
    assert ok, why
    print("ok attention_long_rows")


def main() -> int:
    rng = np.random.default_rng(0)
    check_page_values(rng)
    check_scale_pow2(rng)
    check_one_row_index_scores(rng)
    check_mxfp8_epilogue(rng)
    check_select_blocks(rng)
    check_index_score_classes(rng)
    check_attention_classes(rng)
    check_attention_long_rows(rng)
    return 0


if __name__ == "__main__":
    sys.exit(main())
