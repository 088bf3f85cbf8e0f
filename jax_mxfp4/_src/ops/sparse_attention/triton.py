"""Triton kernels: sparse paged attention over MXFP4 K/V with split-K and a fused MXFP8
epilogue (SPEC §7, §7.1, §8).

Row ``r = t * Hkv + h`` attends with its ``G`` q heads (``GP`` dot rows, G padded to 16) over
the first ``context_lens[t, h]`` virtual tokens of its pages. ``attention_kernel`` program
``(r, s)`` takes pages ``s * PAGES .. s * PAGES + PAGES - 1`` (the plan's ``PAGES``: one,
``plans.TRITON_PAGES_PER_SPLIT``) with an online base-2 softmax:
QK as four ``K = 32`` tensor-core dots per page (``mxfp4.page_logits``, the bf16 query
normalized per q head to e4m3 as the reference does), P in bf16 against V dequantized exactly
to bf16, the even and the odd head dimensions as two dots (``mxfp4.page_values``). Where a
program walks several pages, a page's bytes are loaded one page ahead of its arithmetic. P is
divided by the running sum before the PV dot, so the accumulator is always a weighted mean of
V and cannot overflow where the output is finite (SPEC §7 "PV range"). With
one split the kernel stores the output itself (bf16, or the MXFP8 values and scales); with
several it stores per-split partials ``(m, l, o = O / l in bf16)`` that ``reduce_kernel``
merges with normalized weights ``exp(m_p - M) * l_p / sum`` before the same epilogue. A row
with nothing to attend to outputs zeros; a q head with a live logit that is not finite outputs
NaN (SPEC §9.2), tracked explicitly (``tl.max`` need not propagate NaN) and passed to the
merge as a NaN ``m_p``.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np
import triton
import triton.language as tl
from jax.core import ShapedArray

from jax_mxfp4._src.core import formats, plans, scaling
from jax_mxfp4._src.gpu import launch as launcher
from jax_mxfp4._src.triton import mxfp4, triton_call
from jax_mxfp4._src.triton.mxfp4 import (
    GROUP_DATA_BYTES,
    HEAD_DIM,
    MX_BLOCK,
    PAGE_TOKENS,
    TOKEN_DATA_BYTES,
    TOKEN_GROUPS,
)

LOG2E = tl.constexpr(1.4426950408889634)
PROPAGATE = tl.constexpr(tl.PropagateNan.ALL)
FLT_MIN = tl.constexpr(scaling.FLT_MIN)
E4M3_NAN = tl.constexpr(formats.E4M3_NAN)  # the float8_e4m3fn NaN byte


@triton.jit
def _abs_max_bits(x):
    """Max of ``|x|`` over the last axis of a bf16 tile, as fp32 bits (int32)."""
    bits = x.to(tl.int16, bitcast=True).to(tl.int32) & 0x7FFF
    return tl.max(bits, axis=1) << 16


@triton.jit
def _query_groups(q_ptr, qrow, ok, Q_IS_FP8: tl.constexpr, PTX: tl.constexpr):
    """The four query groups ``[GP, 32]`` as dot operands, and each row's scale exponent and
    mantissa (``q_scale = max(amax / 448, FLT_MIN)``; 1 for an e4m3 query)."""
    c = tl.arange(0, MX_BLOCK)
    base = q_ptr + qrow[:, None].to(tl.int64) * HEAD_DIM + c[None, :]
    x0 = tl.load(base, mask=ok[:, None], other=0.0)
    x1 = tl.load(base + MX_BLOCK, mask=ok[:, None], other=0.0)
    x2 = tl.load(base + 2 * MX_BLOCK, mask=ok[:, None], other=0.0)
    x3 = tl.load(base + 3 * MX_BLOCK, mask=ok[:, None], other=0.0)
    dot_dtype: tl.constexpr = tl.float16
    if Q_IS_FP8:
        expo = tl.zeros(qrow.shape, tl.int32)
        mant = tl.full(qrow.shape, 1.0, tl.float32)
        q0, q1, q2, q3 = x0.to(dot_dtype), x1.to(dot_dtype), x2.to(dot_dtype), x3.to(dot_dtype)
    else:
        q0, q1, q2, q3, expo, mant = _normalized(x0, x1, x2, x3, dot_dtype, PTX)
    return q0, q1, q2, q3, expo, mant


@triton.jit
def _normalized(x0, x1, x2, x3, dot_dtype: tl.constexpr, PTX: tl.constexpr):
    """bf16 query groups normalized per row to e4m3 (SPEC §7.1), with the scale's exponent
    and mantissa."""
    amax_bits = tl.maximum(tl.maximum(_abs_max_bits(x0), _abs_max_bits(x1)),
                           tl.maximum(_abs_max_bits(x2), _abs_max_bits(x3)))
    amax = amax_bits.to(tl.float32, bitcast=True)
    q_scale = tl.maximum(tl.math.div_rn(amax, tl.full(amax.shape, 448.0, tl.float32)), FLT_MIN)
    s = q_scale[:, None]
    inv = tl.math.div_rn(tl.full(amax.shape, 1.0, tl.float32), q_scale)[:, None]
    q0 = mxfp4.round_e4m3(mxfp4.quotient_rn(x0.to(tl.float32), s, inv), PTX).to(dot_dtype)
    q1 = mxfp4.round_e4m3(mxfp4.quotient_rn(x1.to(tl.float32), s, inv), PTX).to(dot_dtype)
    q2 = mxfp4.round_e4m3(mxfp4.quotient_rn(x2.to(tl.float32), s, inv), PTX).to(dot_dtype)
    q3 = mxfp4.round_e4m3(mxfp4.quotient_rn(x3.to(tl.float32), s, inv), PTX).to(dot_dtype)
    sbits = q_scale.to(tl.int32, bitcast=True)
    expo = ((sbits >> 23) & 0xFF) - 127
    mant = ((sbits & 0x7FFFFF) | 0x3F800000).to(tl.float32, bitcast=True)
    return q0, q1, q2, q3, expo, mant


@triton.jit
def _mxfp8_blocks(x, PTX: tl.constexpr):
    """MXFP8 of bf16 ``x [GP, 2, NB, 16]`` whose MXFP8 block ``b`` is ``x[:, :, b, :]``:
    e4m3 values (same shape) and scale bytes ``int32 [GP, NB]``. An Inf or NaN in a block:
    scale byte 255 and every value NaN (SPEC §1.9)."""
    bits = x.to(tl.int16, bitcast=True).to(tl.int32) & 0x7FFF
    amax = tl.max(tl.max(bits, axis=3), axis=1)  # bf16 bits [GP, NB]
    expo = (amax >> 7) & 0xFF
    sb = tl.minimum(tl.maximum(expo - 8 + ((amax & 0x7F) > 96).to(tl.int32), 0), 254)
    non_finite = (expo == 0xFF)[:, None, :, None]
    sb = tl.where(expo == 0xFF, 255, sb)
    scaled = x.to(tl.float32) * mxfp4.pow2(127 - sb)[:, None, :, None]
    codes = mxfp4.round_e4m3(scaled, PTX).to(tl.uint8, bitcast=True)
    codes = tl.where(non_finite, E4M3_NAN, codes)
    return codes.to(tl.float8e4nv, bitcast=True), sb


@triton.jit
def _store_output(o, out_ptr, scale_ptr, t, qh0, g, g_ok, HQ, MXFP8: tl.constexpr,
                  PTX: tl.constexpr):
    """Store the final output rows ``o f32 [GP, 128]`` of token ``t``, q heads ``qh0 + g``,
    columns in the value order of :func:`mxfp4.value_dims`: bf16 ``[T, Hq, 128]``, or MXFP8
    values ``[T, Hq*128]`` and scales ``[T, Hq*4]``."""
    d = mxfp4.value_dims()
    ob = o.to(tl.bfloat16)
    qh = (qh0 + g).to(tl.int64)
    if MXFP8:
        # columns (nibble, group, byte): a 32-element block is [:, :, b, :]
        blocks = tl.reshape(ob, (g.shape[0], 2, TOKEN_GROUPS, GROUP_DATA_BYTES))
        values, sb = _mxfp8_blocks(blocks, PTX)
        values = tl.reshape(values, (g.shape[0], HEAD_DIM))
        vptr = out_ptr + t.to(tl.int64) * HQ * HEAD_DIM + qh[:, None] * HEAD_DIM + d[None, :]
        tl.store(vptr, values, mask=g_ok[:, None])
        c = tl.arange(0, TOKEN_GROUPS)
        sptr = (scale_ptr + t.to(tl.int64) * HQ * TOKEN_GROUPS + qh[:, None] * TOKEN_GROUPS
                + c[None, :])
        tl.store(sptr, sb.to(tl.uint8), mask=g_ok[:, None])
    else:
        ptr = out_ptr + (t.to(tl.int64) * HQ + qh)[:, None] * HEAD_DIM + d[None, :]
        tl.store(ptr, ob, mask=g_ok[:, None])


@triton.jit
def page_offset(table_ptr, r, h, p, ctx, HKV, P, NPAGES):
    """``(ok, byte offset)`` of page ``p`` of row ``r`` in a pool ``u8[P, Hkv, 8704]``: a page
    past the context or with an id outside ``[0, P)`` is not ``ok`` (its offset is page 0's, and
    nothing is loaded from it). The one rule both split kernels follow."""
    # The table entry is masked by the table width, not by the context: its load does not
    # wait for the context's, and both are in flight together.
    page = tl.load(table_ptr + r.to(tl.int64) * NPAGES + p, mask=p < NPAGES, other=-1)
    ok = (p * PAGE_TOKENS < ctx) & (page >= 0) & (page < P)
    return ok, (tl.where(ok, page, 0).to(tl.int64) * HKV + h) * mxfp4.PAGE_BYTES


@triton.jit
def _page_bytes(k_ptr, v_ptr, ok, base):
    """Issue every load of the page at byte offset ``base`` that :func:`page_offset` gave
    (K codes and scales, V codes and scales) and return whether the page holds live tokens
    (a page that does not loads nothing and is skipped) and its raw bytes, ``(keys, k_scales,
    v_words, v_scales)`` with ``keys`` the four groups' code bytes (``mxfp4.split_groups``)."""
    # Every load first, then the keys' layout change: ptxas issues no load after a shared
    # store of loaded data, so with the keys split first the values' loads waited for the
    # keys' bytes to arrive (one more round trip on a short call's path).
    k_codes, k_scales = mxfp4.page_bytes(k_ptr + base, ok)
    v_words, v_scales = mxfp4.page_bytes(v_ptr + base, ok)
    return ok, (mxfp4.split_groups(k_codes), k_scales, v_words, v_scales)


@triton.jit
def _page_dots(q_groups, keys, scales, live, PTX: tl.constexpr):
    """A page's relative logits ``dots f32 [GP, 128]`` and one exponent for the whole page:
    ``q . k = dots * 2**exponent`` (int32 scalar) for every live token, from the query's four
    groups (:func:`_query_groups`) and the keys' (:func:`_page_bytes`).

    Each scale group's dot is scaled by ``2**(byte - ref)``, ``ref`` the largest scale byte
    of the page's live tokens (NaN-key tokens, byte 255, set none), so the logit scaling
    below is one factor per q head instead of one exponent per logit. A token whose every
    group lies more than 126 binades below ``ref`` gets dots of 0 (its logit is below
    ``2**-126`` of the page's largest token's, far inside SPEC §10's attention tolerance);
    every other token's logit is the same number as with its own exponent (a power of two
    applied to every term of the same sums). NaN for a token with a byte-255 group (SPEC
    §1.3, §9.2); tokens that are not live may get any value (they are masked)."""
    q0, q1, q2, q3 = q_groups
    b0, b1, b2, b3 = keys
    s0, s1, s2, s3, smax = mxfp4.token_scales(scales)
    nan_keys = smax == mxfp4.NAN_BYTE
    ref = tl.max(tl.where(live & ~nan_keys, smax, 0), axis=0)
    dots = mxfp4.scaled_dots(q0, q1, q2, q3, b0, b1, b2, b3, s0, s1, s2, s3, ref, nan_keys, PTX)
    return dots, mxfp4.key_exponent(q0, ref, PTX)


@triton.jit
def _scaled_logits(dots, expo, q_mant, sm_scale):
    """``dots * 2**expo * q_mant * sm_scale`` per q head (``expo`` int32 [GP]: the page's
    exponent plus the head's query exponent) in three multiplies per logit: the power of two
    as the head's two :func:`mxfp4.pow2_factors` (exact wherever the logit is a normal fp32),
    then the head's ``q_mant * sm_scale``."""
    first, second = mxfp4.pow2_factors(expo)
    return dots * first[:, None] * second[:, None] * (q_mant * sm_scale)[:, None]


@triton.jit
def _attend_page(query, page, state, first_tok, ctx, sm_scale, g_ok, PV_DTYPE: tl.constexpr,
                 PTX: tl.constexpr):
    """One page of the online softmax on its loaded bytes: ``query`` as :func:`_query_groups`
    returns it (the four groups, each row's exponent and mantissa), ``page`` as
    :func:`_page_bytes` does, its first token at ``first_tok`` of the row's ``ctx``, and the
    running ``state = (m_i, l_i, acc_even, acc_odd)`` (the output's even and odd head
    dimensions), returned updated. A live logit that is not finite (a NaN key or query, an
    overflow) becomes NaN and its q head's running max ``m_i`` NaN for good, in the one
    NaN-keeping max reduction the softmax takes anyway (SPEC §9.2)."""
    q0, q1, q2, q3, q_exp, q_mant = query
    keys, k_scales, v_words, v_scales = page
    m_i, l_i, acc_even, acc_odd = state
    live = (first_tok + tl.arange(0, PAGE_TOKENS)) < ctx
    dots, k_exp = _page_dots((q0, q1, q2, q3), keys, k_scales, live, PTX)
    logits = _scaled_logits(dots, k_exp + q_exp, q_mant, sm_scale)
    seen = live[None, :] & g_ok[:, None]
    logits = tl.where(tl.abs(logits) == float("inf"), float("nan"), logits)
    logits = tl.where(seen, logits, float("-inf"))
    m_new = tl.maximum(m_i, tl.reduce(logits, 1, _max_nan), propagate_nan=PROPAGATE)
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2((m_i - m_safe) * LOG2E)
    p = tl.exp2((logits - m_safe[:, None]) * LOG2E)
    l_old = l_i * alpha
    l_i = l_old + tl.sum(p, axis=1)
    # acc stays the weighted mean of V so far (weights summing to 1), so a large finite V
    # cannot overflow the fp32 sum (SPEC §7 PV range) as an unnormalized P.V could.
    inv_l = tl.where(l_i > 0, 1.0 / tl.where(l_i > 0, l_i, 1.0), 0.0)
    v_even, v_odd = mxfp4.page_values(v_words, v_scales, live, PV_DTYPE, PTX)
    p_norm = (p * inv_l[:, None]).to(PV_DTYPE)
    keep = (l_old * inv_l)[:, None]
    acc_even = acc_even * keep + tl.dot(p_norm, v_even)
    acc_odd = acc_odd * keep + tl.dot(p_norm, v_odd)
    return m_new, l_i, acc_even, acc_odd


@triton.jit
def _max_nan(a, b):
    return tl.maximum(a, b, propagate_nan=PROPAGATE)


@triton.jit
def attention_kernel(q_ptr, k_ptr, v_ptr, table_ptr, ctx_ptr, out_ptr, aux_ptr, m_ptr, l_ptr,
                     HKV, P, NPAGES, sm_scale, G: tl.constexpr, GP: tl.constexpr,
                     PAGES: tl.constexpr, SPLITS: tl.constexpr, Q_IS_FP8: tl.constexpr,
                     MXFP8: tl.constexpr, PTX: tl.constexpr,
                     PV_DTYPE: tl.constexpr = tl.bfloat16):
    """q ``[T, Hkv*G, 128]``, pools ``u8[P, Hkv, 8704]``, table ``s32[T*Hkv, n]``, context
    ``s32[T*Hkv]``. One split: ``out``/``aux`` are the final output (aux = MXFP8 scales).
    Several: ``out`` = o partials ``bf16 [R, SPLITS, GP, 128]``, ``m``/``l`` ``f32 [R,
    SPLITS, GP]``."""
    r = tl.program_id(0)
    s = tl.program_id(1)
    t = r // HKV
    h = r % HKV
    g = tl.arange(0, GP)
    g_ok = g < G
    ctx = tl.minimum(tl.maximum(tl.load(ctx_ptr + r), 0), NPAGES * PAGE_TOKENS)
    # The context and the first page's id are asked for before the query, so that they are
    # there when the query's normalization ends and the page's loads go out (a page's loads
    # come after the query's arithmetic: Triton moves the bytes into other layouts right
    # after their load, which would wait for them first).
    ok, base = page_offset(table_ptr, r, h, s * PAGES, ctx, HKV, P, NPAGES)
    qrow = t.to(tl.int64) * HKV * G + h * G + g
    query = _query_groups(q_ptr, qrow, g_ok, Q_IS_FP8, PTX)
    m_i = tl.full((GP,), float("-inf"), tl.float32)
    l_i = tl.zeros((GP,), tl.float32)
    acc_even = tl.zeros((GP, HEAD_DIM // 2), tl.float32)  # head dimensions 0, 2, .., 126
    acc_odd = tl.zeros((GP, HEAD_DIM // 2), tl.float32)  # 1, 3, .., 127
    # Software-pipelined over the split's pages: page i + 1's bytes are in flight while page
    # i is computed (a program walks only PAGES pages, so this hides every load but the first).
    ok, page = _page_bytes(k_ptr, v_ptr, ok, base)
    for i in tl.static_range(PAGES):
        if i + 1 < PAGES:
            nxt_ok, nxt_base = page_offset(table_ptr, r, h, s * PAGES + i + 1, ctx, HKV, P,
                                           NPAGES)
            nxt = _page_bytes(k_ptr, v_ptr, nxt_ok, nxt_base)
        if ok:
            m_i, l_i, acc_even, acc_odd = _attend_page(
                query, page, (m_i, l_i, acc_even, acc_odd), (s * PAGES + i) * PAGE_TOKENS,
                ctx, sm_scale, g_ok, PV_DTYPE, PTX)
        if i + 1 < PAGES:
            ok, page = nxt
    # a q head that saw nothing outputs zeros; a poisoned one (NaN max) NaN
    seen, poisoned = (l_i > 0)[:, None], (m_i != m_i)[:, None]
    even = tl.where(poisoned, float("nan"), tl.where(seen, acc_even, 0.0))
    odd = tl.where(poisoned, float("nan"), tl.where(seen, acc_odd, 0.0))
    if SPLITS == 1:
        # value_dims order
        o = tl.reshape(tl.permute(tl.join(even, odd), (0, 2, 1)), (GP, HEAD_DIM))
        _store_output(o, out_ptr, aux_ptr, t, h * G, g, g_ok, HKV * G, MXFP8, PTX)
    else:
        # the partial's columns in mxfp4.value_dims order: the even head dims, then the odd,
        # stored as the two accumulators are (no layout change to join them)
        part = (r.to(tl.int64) * SPLITS + s) * GP + g
        tl.store(m_ptr + part, m_i)
        tl.store(l_ptr + part, l_i)
        d = tl.arange(0, HEAD_DIM // 2)
        tl.store(out_ptr + part[:, None] * HEAD_DIM + d[None, :], even.to(tl.bfloat16))
        tl.store(out_ptr + part[:, None] * HEAD_DIM + HEAD_DIM // 2 + d[None, :],
                 odd.to(tl.bfloat16))


MERGE_IN_FLIGHT = tl.constexpr(16)
"""The most splits the merge takes unrolled: a row of at most this many (a decode row's
top-16 pages) merges within each thread (:func:`_merge_in_flight`); a longer row merges its
partials in unrolled blocks of this many, loaded before the block's first add, after one
pass over its stats."""


@triton.jit
def _split_weight(m, total, top):
    """A split's weight in its row's merge, ``exp(m - top) * total`` from its running max and
    sum (0 where it saw nothing, ``total == 0``), ``top`` the row's largest finite ``m`` (0
    where there is none)."""
    return tl.where(total > 0, tl.exp2((m - top) * LOG2E) * total, 0.0)


@triton.jit
def _reciprocal_or_zero(total):
    """``1 / total`` of a row's merge weights where ``total > 0``, 0 where no split saw
    anything: the division never sees a zero. (``_attend_page``'s ``inv_l`` is the same
    expression, written inline: as a call it compiled to different SASS.)"""
    return tl.where(total > 0, 1.0 / tl.where(total > 0, total, 1.0), 0.0)


@triton.jit
def _merge_stats(m_ptr, l_ptr, first, GP: tl.constexpr, SPLITS: tl.constexpr):
    """Over the ``[SPLITS, GP]`` stats at ``first``: each q head's largest finite ``m`` (0
    where none), ``1 / sum(exp(m_p - M) * l_p)`` (0 where nothing was seen), as ``[GP, 1]``,
    and whether a split's ``m`` is NaN (``[GP, 1]`` int32)."""
    split = tl.arange(0, triton.next_power_of_2(SPLITS))[:, None]
    stats = first + split * GP + tl.arange(0, GP)[None, :]
    m_t = tl.load(m_ptr + stats, mask=split < SPLITS, other=float("-inf"))
    l_t = tl.load(l_ptr + stats, mask=split < SPLITS, other=0.0)
    poisoned = tl.max((m_t != m_t).to(tl.int32), axis=0)
    safe_m = tl.max(tl.where(m_t != m_t, float("-inf"), m_t), axis=0)
    safe_m = tl.where(safe_m == float("-inf"), 0.0, safe_m)
    total = tl.sum(_split_weight(m_t, l_t, safe_m[None, :]), 0)
    inv_total = _reciprocal_or_zero(total)
    return (tl.reshape(safe_m, (GP, 1)), tl.reshape(inv_total, (GP, 1)),
            tl.reshape(poisoned, (GP, 1)))


@triton.jit
def merge_partials(o_ptr, m_ptr, l_ptr, r, cols, GP: tl.constexpr, SPLITS: tl.constexpr):
    """Columns ``cols`` (int32 ``[C]``) of row ``r``'s output ``f32 [GP, C]`` from its split
    partials (``o`` bf16 ``[R, SPLITS, GP, 128]``, ``m``/``l`` f32 ``[R, SPLITS, GP]``):
    weights ``exp(m_p - M) * l_p`` normalized before the sum (no overflow of a large V), the
    splits added in order; NaN where a split's ``m`` is NaN (a live logit was not finite).
    Each split's stats are loaded as ``[GP, 1]`` beside its partial: they broadcast onto it
    in registers (a ``[GP]`` vector would change layout through shared memory)."""
    if SPLITS <= MERGE_IN_FLIGHT:
        return _merge_in_flight(o_ptr, m_ptr, l_ptr, r, cols, GP, SPLITS)
    first = r.to(tl.int64) * SPLITS * GP
    safe_m, inv_total, poisoned = _merge_stats(m_ptr, l_ptr, first, GP, SPLITS)
    g = tl.arange(0, GP)[:, None]
    out = tl.zeros((GP, cols.shape[0]), tl.float32)
    for c in range(0, SPLITS, MERGE_IN_FLIGHT):
        for j in tl.static_range(MERGE_IN_FLIGHT):
            ok = c + j < SPLITS
            part = first + (c + j) * GP + g
            m_p = tl.load(m_ptr + part, mask=ok, other=float("-inf"))
            l_p = tl.load(l_ptr + part, mask=ok, other=0.0)
            o_p = tl.load(o_ptr + part * HEAD_DIM + cols[None, :], mask=ok, other=0.0)
            w = _split_weight(m_p, l_p, safe_m) * inv_total
            out += w * o_p.to(tl.float32)
    return tl.where(poisoned > 0, float("nan"), out)


@triton.jit
def _merge_in_flight(o_ptr, m_ptr, l_ptr, r, cols, GP: tl.constexpr, SPLITS: tl.constexpr):
    """:func:`merge_partials` for a row of at most :data:`MERGE_IN_FLIGHT` splits, every
    reduction over the splits within each thread and in split order: three unrolled passes
    (the largest finite ``m``; the weights' total; the normalized weighted sum) that load each
    split's ``[GP, 1]`` stats beside its partial, in the partial's layout, so nothing moves
    between threads.

    The first pass reads every split's ``m``, ``l`` and ``o`` (the later passes' loads of
    them are the same loads): ptxas places each load close to its first use, so while the
    first pass read only ``m``, the ``l`` loads went out after it and the ``o`` loads after
    the second pass (three round trips to memory). The extra reads change no output: ``l ==
    0`` only where ``m`` is -inf (a split that saw no token), and a NaN in a split's ``o``
    makes that output NaN in the weighted sum anyway (``0 * NaN`` is NaN). On sm_90 every
    ``m`` and ``l`` load now goes out first, 11 of the 16 ``o`` loads during the first pass
    (once the first ``m`` is there) and the other 5 after the second: two round trips and
    part of a third (bench/history/2026-12-03.md, eighteenth session, "What landed")."""
    part = r.to(tl.int64) * SPLITS * GP + tl.arange(0, GP)[:, None]
    poisoned = tl.zeros((GP, cols.shape[0]), tl.int1)
    top = tl.full((GP, 1), float("-inf"), tl.float32)
    for j in tl.static_range(SPLITS):
        o_j = tl.load(o_ptr + (part + j * GP) * HEAD_DIM + cols[None, :])
        m_j = tl.load(m_ptr + part + j * GP)
        l_j = tl.load(l_ptr + part + j * GP)
        poisoned = poisoned | (m_j != m_j) | (o_j != o_j)
        top = tl.maximum(top, tl.where((m_j != m_j) | (l_j == 0), float("-inf"), m_j))
    top = tl.where(top == float("-inf"), 0.0, top)
    total = tl.zeros((GP, 1), tl.float32)
    for j in tl.static_range(SPLITS):
        m_j = tl.load(m_ptr + part + j * GP)
        l_j = tl.load(l_ptr + part + j * GP)
        total += _split_weight(m_j, l_j, top)
    inv_total = _reciprocal_or_zero(total)
    out = tl.zeros((GP, cols.shape[0]), tl.float32)
    for j in tl.static_range(SPLITS):
        m_j = tl.load(m_ptr + part + j * GP)
        l_j = tl.load(l_ptr + part + j * GP)
        o_j = tl.load(o_ptr + (part + j * GP) * HEAD_DIM + cols[None, :])
        w = _split_weight(m_j, l_j, top) * inv_total
        out += w * o_j.to(tl.float32)
    return tl.where(poisoned, float("nan"), out)


@triton.jit
def reduce_kernel(o_ptr, m_ptr, l_ptr, out_ptr, aux_ptr, G: tl.constexpr,
                  GP: tl.constexpr, SPLITS: tl.constexpr, MXFP8: tl.constexpr,
                  BLOCKS: tl.constexpr, PTX: tl.constexpr):
    """Program ``(r, c)`` merges the split partials of row ``r`` (:func:`merge_partials`) for
    its MXFP8 blocks ``c * BLOCKS ..`` (32 head dimensions each) and stores them: bf16 ``[T,
    Hq, 128]``, or MXFP8 values ``[T, Hq*128]`` and scale bytes ``[T, Hq*4]``."""
    r = tl.program_id(0)
    g = tl.arange(0, GP)
    g_ok = g < G
    nibble = tl.arange(0, 2)[:, None]
    byte = (tl.program_id(1) * BLOCKS * GROUP_DATA_BYTES
            + tl.arange(0, BLOCKS * GROUP_DATA_BYTES)[None, :])
    # value order (mxfp4.value_dims): two runs of BLOCKS * 16 columns, loaded in 16-byte pieces
    cols = tl.reshape(nibble * TOKEN_DATA_BYTES + byte, (BLOCKS * MX_BLOCK,))
    cols = tl.max_contiguous(tl.multiple_of(cols, BLOCKS * GROUP_DATA_BYTES),
                             BLOCKS * GROUP_DATA_BYTES)
    dims = tl.reshape(2 * byte + nibble, (BLOCKS * MX_BLOCK,))
    out = merge_partials(o_ptr, m_ptr, l_ptr, r, cols, GP, SPLITS).to(tl.bfloat16)
    row = (r.to(tl.int64) * G + g)[:, None]  # q head rows [GP, 1] (row r = t * Hkv + h)
    if MXFP8:
        values, sb = _mxfp8_blocks(tl.reshape(out, (GP, 2, BLOCKS, GROUP_DATA_BYTES)), PTX)
        tl.store(out_ptr + row * HEAD_DIM + dims[None, :],
                 tl.reshape(values, (GP, BLOCKS * MX_BLOCK)), mask=g_ok[:, None])
        block = tl.program_id(1) * BLOCKS + tl.arange(0, BLOCKS)[None, :]
        tl.store(aux_ptr + row * TOKEN_GROUPS + block, sb.to(tl.uint8), mask=g_ok[:, None])
    else:
        tl.store(out_ptr + row * HEAD_DIM + dims[None, :], out, mask=g_ok[:, None])


REDUCE_BLOCKS = 1
"""MXFP8 blocks (32 head dimensions) per reduce program: ``4 // REDUCE_BLOCKS`` programs per
row. One block was as fast as or faster than two or four at 1 to 256 rows
(bench/history/2026-12-01.md, fourth session, the merge-program table): a short chain per
program, and the partials still load in 16-byte pieces. A constant: the programs'
shape never follows the number of rows (batch invariance)."""


def reduce_grid(rows: int, blocks: int | None = None) -> tuple[int, int, int]:
    """``reduce_kernel``'s grid for ``rows`` rows at ``blocks`` MXFP8 blocks per program
    (default :data:`REDUCE_BLOCKS`, read when called): a 128-dimension head has 4 blocks."""
    return (rows, formats.TOKEN_GROUPS // (blocks or REDUCE_BLOCKS), 1)


@dataclasses.dataclass(frozen=True)
class Plan:
    gp: int  # dot rows (q heads per kv head, padded to 16)
    splits: int  # pages split over this many programs per row (1 = direct output)
    pages: int  # pages per split
    num_warps: int


ATTENTION_WARPS = 4
"""Warps of every attention program, whatever the grid: a program's reductions and dot
layouts follow its warp count, so a count chosen by the grid size would make a row's bits
depend on the batch (SPEC §9.1). Four was the faster count from 32 rows on; eight helped only
at 1-8 rows (bench/history/2026-12-01.md, "later: page loads issued together")."""


def plan(group: int, num_pages: int) -> Plan:
    """``GP`` dot rows and the split-K plan of ``plans.attention_splits`` at
    ``plans.TRITON_PAGES_PER_SPLIT`` pages a split (read when called): both from the q-head
    group and the page-table width only."""
    gp = max(16, triton.next_power_of_2(group))
    splits = plans.attention_splits(num_pages, plans.TRITON_PAGES_PER_SPLIT)
    pages = triton.cdiv(max(num_pages, 1), splits)
    return Plan(gp, splits, pages, ATTENTION_WARPS)


# --- lowering (covers / lower: dispatch.lowering.KernelModule) ------------------------------------


def available(target, config) -> str | None:
    return triton_call.launcher_problem(target)


def covers(call) -> str | None:
    return None  # every call of the operation


def kernel_name(call) -> str:
    _, group, n, _ = plans.attention_rows(call.avals_in)
    layout = plan(group, n)
    if layout.splits == 1:
        return "attention_kernel"
    return f"attention_kernel[{layout.splits} splits]+reduce_kernel"


def _partials_launch(call, layout, grid, inputs, scalars, constants, part_avals):
    """The launch of the split kernel storing ``(o, m, l)`` partials."""
    return triton_call.launch(
        attention_kernel, call.target, grid=grid,
        buffers=(*inputs, "out_ptr", "m_ptr", "l_ptr"), avals=(*call.avals_in, *part_avals),
        scalars=scalars, constants=constants, nulls={"aux_ptr": jnp.uint8},
        num_warps=layout.num_warps)


def lower(ctx, call, q, k_pool, v_pool, pages, context):
    """The attention kernel storing the output itself (one split), or storing per-split
    partials that ``reduce_kernel`` merges (the partials are the first call's results: XLA
    allocates them like any intermediate)."""
    rows, group, n, kv_heads = plans.attention_rows(call.avals_in)
    layout = plan(group, n)
    mxfp8 = call.params["output"] == "mxfp8"
    constants = {"G": group, "GP": layout.gp, "PAGES": layout.pages, "SPLITS": layout.splits,
                 "Q_IS_FP8": jnp.dtype(call.avals_in[0].dtype) == jnp.float8_e4m3fn,
                 "MXFP8": mxfp8, "PV_DTYPE": tl.bfloat16}
    scalars = {"HKV": np.int32(kv_heads), "P": np.int32(call.avals_in[1].shape[0]),
               "NPAGES": np.int32(n), "sm_scale": np.float32(call.params["sm_scale"])}
    inputs = ("q_ptr", "k_ptr", "v_ptr", "table_ptr", "ctx_ptr")
    operands = [q, k_pool, v_pool, pages, context]
    grid = (rows, layout.splits, 1) if rows else (0, 1, 1)
    if layout.splits == 1:
        outputs = ("out_ptr", "aux_ptr") if mxfp8 else ("out_ptr",)
        nulls = {"m_ptr": jnp.float32, "l_ptr": jnp.float32}
        if not mxfp8:
            nulls["aux_ptr"] = jnp.uint8
        launch = triton_call.launch(
            attention_kernel, call.target, grid=grid, buffers=(*inputs, *outputs),
            avals=(*call.avals_in, *call.avals_out), scalars=scalars, constants=constants,
            nulls=nulls, num_warps=layout.num_warps)
        return launcher.emit(ctx, launch, operands, call.avals_in, call.avals_out)
    parts = rows * layout.splits * layout.gp
    part_avals = (ShapedArray((parts * formats.HEAD_DIM,), jnp.bfloat16),
                  ShapedArray((parts,), jnp.float32), ShapedArray((parts,), jnp.float32))
    launch = _partials_launch(call, layout, grid, inputs, scalars, constants, part_avals)
    partials = launcher.emit(ctx, launch, operands, call.avals_in, part_avals)
    merge = triton_call.launch(
        reduce_kernel, call.target, grid=reduce_grid(rows),
        buffers=("o_ptr", "m_ptr", "l_ptr", "out_ptr", *(("aux_ptr",) if mxfp8 else ())),
        avals=(*part_avals, *call.avals_out), scalars={},
        constants={"G": group, "GP": layout.gp, "SPLITS": layout.splits, "MXFP8": mxfp8,
                   "BLOCKS": REDUCE_BLOCKS},
        nulls={} if mxfp8 else {"aux_ptr": jnp.uint8})
    return launcher.emit(ctx, merge, partials, part_avals, call.avals_out)
