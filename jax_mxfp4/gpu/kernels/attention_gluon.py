"""Gluon kernel (Triton with explicit layouts, CUDA sm_80+): the split-K partials of sparse
attention, opt-in (``cuda_kernels="gluon"``; measured against the Triton kernel in RESULTS).

The Triton ``attention_kernel`` builds its dots' operands from shared memory as ``kWidth = 4``
and ``8`` fragments, each MMA's A operand assembled with register moves, and its layout
changes take 31 barriers a page. Here the split is the Triton kernel's, written with explicit
layouts:

* QK: each warp owns 32 of a page's 128 tokens. Each lane loads the code bytes whose nibbles
  its ``mma.sync`` B-operand registers hold and decodes them in place (the column order of
  ``index_tile_gluon``; the query is loaded in the matching order), with a page reference per
  warp (:func:`_warp_reference`);
* softmax: each warp's maxima and sums of its tokens, then the heads' maximum and sum across
  the warps (cross-warp reductions), P normalized by the running sum and stored as bf16
  ``[source warp, 16, 32]`` in shared memory;
* PV: warp ``g`` owns head dimensions ``32 g .. 32 g + 31`` (exactly scale group ``g``): it
  reads every source warp's P (``ldmatrix``) and that warp's values of its group
  (:func:`value_blocks`, decoded scaled by the warp that loaded them, read back transposed),
  so its output columns are its own and the partials need no merge inside the program.

Outputs are the partials ``reduce_kernel`` merges (``m``, ``l``, ``o / l`` in bf16, columns in
``mxfp4.value_dims`` order), so it replaces the split kernel only; tables of one split keep
the Triton kernel. The arithmetic is ``_attend_page``'s (SPEC §7, §15.9, §15.18).
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2

from jax_mxfp4.gpu.kernels import mxfp4
from jax_mxfp4.gpu.kernels.sparse_attention import FLT_MIN, LOG2E, _max_nan, page_offset

NUM_WARPS = 4
"""Warps per program; warp ``w`` owns tokens ``32 w .. 32 w + 31`` of every page in the QK
dots and head dims ``32 w .. 32 w + 31`` in the PV dots."""
WARPS = gl.constexpr(NUM_WARPS)

ACC = gl.constexpr(gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[NUM_WARPS, 1, 1],
                                             instr_shape=[1, 16, 8]))
A_OP = gl.constexpr(gl.DotOperandLayout(operand_index=0, parent=ACC.value, k_width=2))
B_OP = gl.constexpr(gl.DotOperandLayout(operand_index=1, parent=ACC.value, k_width=2))
K_CODES = gl.constexpr(gl.BlockedLayout(size_per_thread=[1, 1, 4], threads_per_warp=[1, 8, 4],
                                        warps_per_cta=[NUM_WARPS, 1, 1], order=[2, 1, 0]))
"""One scale group's key bytes ``[warp, 32 tokens, 16]``: a lane holds one code word."""
V_CODES = gl.constexpr(gl.DistributedLinearLayout(
    reg_bases=[[0, 0, 1], [0, 0, 2], [0, 0, 4], [0, 1, 0], [0, 8, 0], [0, 16, 0]],
    lane_bases=[[0, 2, 0], [0, 4, 0], [0, 0, 8], [0, 0, 16], [0, 0, 32]],
    warp_bases=[[1, 0, 0], [2, 0, 0]], block_bases=[], shape=[NUM_WARPS, 32, 64]))
"""A page's value bytes ``[warp, 32 tokens, 64]``: a lane holds 8 bytes (two code words) of
two consecutive tokens, bytes innermost (the decode takes a word per step); the PV operand's
``k`` pair is the token pair, so each decoded register pair is transposed into it."""
ROWS = gl.constexpr(gl.SliceLayout(2, ACC))  # [warp, 16]: per q head
Q_TILE = gl.constexpr(gl.BlockedLayout([1, 4], [4, 8], [NUM_WARPS, 1], [1, 0]))
"""The query tile ``[16, 128]``: a thread holds column bits 0-1 and 5-6 (nibble, b0, g0, g1)
in registers, so the operands split off along them without moving data."""
TOKENS = gl.constexpr(gl.SliceLayout(1, ACC))  # [warp, 32]: per token
STAGING = gl.constexpr(gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1,
                                               order=[2, 1, 0]))
OPERANDS = gl.constexpr(gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[1, 0]))
"""The query's eight ``[16, 16]`` operands ``[8, 16, 16]`` and P's ``[source warp, 16, 32]``
in shared memory, unswizzled (the slots' rank; :data:`STAGING` stores them whole)."""
VALUES = gl.constexpr(gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1,
                                              order=[3, 2, 1, 0]))
"""One nibble's values ``[source warp, group, 32 tokens, 16 bytes]``, unswizzled, stored
whole (the buffer takes :data:`STAGING`, the rank of a source warp's slot)."""


@triton.jit
def value_blocks(half):
    """One nibble's values ``[warp, 32 tokens, 64 bytes]`` -> ``[source warp, group, 32
    tokens, 16 bytes]``: what warp ``g`` reads back for its scale group ``g`` (bytes ``16 g
    .. 16 g + 15``, head dims ``32 g ..``)."""
    return tl.permute(tl.reshape(half, (half.shape[0], 32, 4, 16)), (0, 2, 1, 3))


@triton.jit
def query_operand_stack(qn):
    """``[16, 128]`` query rows -> the eight ``[16, 16]`` operands stacked ``[8, 16, 16]``
    (operand ``2 g + nib``: group 0 low nibble, group 0 high, group 1 low, ..; one tensor for
    one shared-memory store), column ``v`` of operand ``(g, nib)`` holding column ``32 g +
    index_tile_gluon.key_column(v, nib)``: columns ``(g1, g0, c, b1, b0, nib)`` reordered to
    ``[g1, g0, nib | row | v = (b1, c, b0)]``."""
    parts = tl.reshape(qn, (qn.shape[0], 2, 2, 4, 2, 2, 2))
    parts = tl.permute(parts, (1, 2, 6, 0, 4, 3, 5))  # [g1, g0, nib, row, b1, c, b0]
    return tl.reshape(parts, (8, qn.shape[0], 16))


@triton.jit
def key_operand_order(half):
    """``[warp, 32 tok, 16 bytes]`` of one nibble per byte -> ``[warp, 16 virtual k, 32 tok]``
    in ``index_tile_gluon.key_column`` order."""
    quads = tl.reshape(half, (half.shape[0], 32, 4, 2, 2))  # [w, tok, c, b1, b0]
    return tl.reshape(tl.permute(quads, (0, 3, 2, 4, 1)), (half.shape[0], 16, 32))


@gluon.jit
def _warp_tokens(layout: gl.constexpr):
    """Token (0..127) of each ``[warp, 32]`` element of a page."""
    w = gl.arange(0, WARPS, layout=gl.SliceLayout(1, layout))
    t = gl.arange(0, 32, layout=gl.SliceLayout(0, layout))
    return 32 * w[:, None] + t[None, :]


@gluon.jit
def _page_bytes(k_ptr, v_ptr, table_ptr, r, h, p, ctx, HKV, P, NPAGES):
    """Issue every load of page ``p`` of row ``r``: whether it holds live tokens, its four key
    groups' bytes, its key and value scale words and its value bytes (``ok`` and the offset:
    ``sparse_attention.page_offset``)."""
    ok, base = page_offset(table_ptr, r, h, p, ctx, HKV, P, NPAGES)
    kt = _warp_tokens(gl.SliceLayout(2, K_CODES))
    kb = gl.arange(0, 16, layout=gl.SliceLayout(0, gl.SliceLayout(1, K_CODES)))
    kaddr = k_ptr + base + kt[:, :, None] * 64 + kb[None, None, :]
    k0 = gl.load(kaddr, mask=ok, other=0)
    k1 = gl.load(kaddr + 16, mask=ok, other=0)
    k2 = gl.load(kaddr + 32, mask=ok, other=0)
    k3 = gl.load(kaddr + 48, mask=ok, other=0)
    st = _warp_tokens(TOKENS)
    k_words = (k_ptr + base).to(gl.pointer_type(gl.uint32)) + mxfp4.SCALE_OFFSET // 4
    k_scales = gl.load(k_words + st, mask=ok, other=0)
    vt = _warp_tokens(gl.SliceLayout(2, V_CODES))
    vb = gl.arange(0, 64, layout=gl.SliceLayout(0, gl.SliceLayout(1, V_CODES)))
    v_codes = gl.load(v_ptr + base + vt[:, :, None] * 64 + vb[None, None, :], mask=ok, other=0)
    v_words = (v_ptr + base).to(gl.pointer_type(gl.uint32)) + mxfp4.SCALE_OFFSET // 4
    v_scales = gl.load(v_words + vt, mask=ok, other=0)
    return ok, k0, k1, k2, k3, k_scales, v_codes, v_scales


@gluon.jit
def _key_operands(raw):
    """One group's key bytes -> the two B operands (low, high nibbles) ``fp16 [warp, 16, 32]``,
    ``e2m1 * 2**-14``."""
    lo, hi = gl.inline_asm_elementwise(mxfp4._FP16_PAIRS, "=r,=r,=r,=r,r", [raw],
                                       dtype=(gl.float16, gl.float16), is_pure=True, pack=4)
    return (gl.convert_layout(key_operand_order(lo), B_OP),
            gl.convert_layout(key_operand_order(hi), B_OP))


@gluon.jit
def _group_dot(qa_lo, qa_hi, raw, zero):
    k_lo, k_hi = _key_operands(raw)
    return mma_v2(qa_hi, k_hi, mma_v2(qa_lo, k_lo, zero))


@gluon.jit
def _value_halves(v_codes, v_scales, live):
    """A page's value bytes -> bf16 ``[warp, 32 tokens, 64 bytes]`` of the low and of the high
    nibbles (head dims ``2 b`` and ``2 b + 1``): ``e2m1 * 2**(byte - 127)`` exactly, NaN for
    scale byte 255, zeros where not ``live``."""
    b = gl.arange(0, 64, layout=gl.SliceLayout(0, gl.SliceLayout(1, V_CODES)))
    shift = 8 * (b // 16)
    byte = (v_scales[:, :, None] >> shift[None, None, :]) & 0xFF
    bits = (byte << 7) | gl.where(byte == mxfp4.NAN_BYTE, 0x40, 0)
    bits = gl.where(gl.convert_layout(live, gl.SliceLayout(2, V_CODES))[:, :, None], bits, 0)
    factor = bits.to(gl.uint16).to(gl.bfloat16, bitcast=True)
    return gl.inline_asm_elementwise(mxfp4._BF16_SCALED, "=r,=r,=r,=r,r,r,r",
                                     [v_codes, factor], dtype=(gl.bfloat16, gl.bfloat16),
                                     is_pure=True, pack=4)


@gluon.jit
def _stage_values(half, staged):
    """Store one nibble's values ``[warp, 32 tokens, 64 bytes]`` as ``[source warp, group,
    32 tokens, 16 bytes]``: what warp ``g`` reads back for its scale group ``g``."""
    staged._reinterpret(gl.bfloat16, [WARPS, WARPS, 32, 16], VALUES).store(value_blocks(half))


@gluon.jit
def _query(q_ptr, first_row, G, Q_IS_FP8: gl.constexpr):
    """The query rows ``first_row ..`` (``G`` of 16) normalized once per program (SPEC §15.9:
    ``q_scale = max(amax / 448, FLT_MIN)`` per q head, e4m3-rounded; an e4m3 query as is), as
    the eight A operands ``fp16 [warp, 16, 16]`` (group, nibble; the same in every warp, in
    ``key_column`` order), with each head's scale exponent and mantissa (``[warp, 16]``,
    ``ROWS``). The tile is normalized spread over the program's threads (16 elements a
    thread), then the eight operands go to one shared-memory buffer in one store
    (:func:`query_operand_stack`; eight stores to its slots took a barrier each) and are read
    back in their operand layout."""
    m = gl.arange(0, 16, layout=gl.SliceLayout(1, Q_TILE))
    d = gl.arange(0, 128, layout=gl.SliceLayout(0, Q_TILE))
    x = gl.load(q_ptr + (first_row + m)[:, None] * 128 + d[None, :], mask=(m < G)[:, None],
                other=0.0)
    per_head: gl.constexpr = gl.SliceLayout(1, Q_TILE)
    if Q_IS_FP8:
        q_exp = gl.zeros((16,), gl.int32, layout=per_head)
        q_mant = gl.full((16,), 1.0, gl.float32, layout=per_head)
        qn = x.to(gl.float16)
    else:
        bits = x.to(gl.int16, bitcast=True).to(gl.int32) & 0x7FFF
        amax = (gl.max(bits, axis=1) << 16).to(gl.float32, bitcast=True)
        q_scale = gl.maximum(gl.div_rn(amax, gl.full((16,), 448.0, gl.float32, per_head)),
                             FLT_MIN)
        sbits = q_scale.to(gl.int32, bitcast=True)
        q_exp = ((sbits >> 23) & 0xFF) - 127
        q_mant = ((sbits & 0x7FFFFF) | 0x3F800000).to(gl.float32, bitcast=True)
        # one division per q head, then the correctly rounded quotient per element
        inv = gl.div_rn(gl.full((16,), 1.0, gl.float32, per_head), q_scale)
        quotient = mxfp4.quotient_rn(x.to(gl.float32), q_scale[:, None], inv[:, None])
        qn = mxfp4.round_e4m3(quotient, True).to(gl.float16)
    staged = gl.allocate_shared_memory(gl.float16, [8, 16, 16], OPERANDS)
    staged._reinterpret(gl.float16, [8, 16, 16], STAGING).store(query_operand_stack(qn))
    gl.thread_barrier()
    qa = (_per_warp(staged.index(0)), _per_warp(staged.index(1)), _per_warp(staged.index(2)),
          _per_warp(staged.index(3)), _per_warp(staged.index(4)), _per_warp(staged.index(5)),
          _per_warp(staged.index(6)), _per_warp(staged.index(7)))
    rows: gl.constexpr = gl.SliceLayout(0, ROWS)
    return (qa, gl.convert_layout(q_exp, rows)[None, :],
            gl.convert_layout(q_mant, rows)[None, :])


@gluon.jit
def _per_warp(slot):
    """A dot's A operand ``[16, K]`` read from its shared-memory slot (a query operand, or one
    source warp's P), the same in every warp: ``[warp, 16, K]`` in ``A_OP``."""
    K: gl.constexpr = slot.shape[1]
    y = slot.load(gl.SliceLayout(0, A_OP))[None, :, :]
    return gl.broadcast(y, gl.zeros((WARPS, 16, K), slot.dtype, layout=A_OP))[0]


@gluon.jit
def _warp_reference(smax, live):
    """Each warp's reference scale byte for a page: the largest of its live tokens' bytes that
    are not NaN keys (0 where none), ``int32 [WARPS]`` (``SliceLayout(1, TOKENS)``): a
    reduction within the warp (its 32 tokens lie across its lanes), nothing crosses warps.
    The rule is ``sparse_attention._page_dots``' per warp: a token whose every group lies more
    than 126 binades below its warp's reference gets dots of 0."""
    return gl.max(gl.where(live & (smax != mxfp4.NAN_BYTE), smax, 0), axis=1)


@gluon.jit
def _attend(qa, q_exp, q_factor, page, first_tok, ctx, m_run, l_run, acc_lo, acc_hi, g_ok,
            p_staged, vlo_staged, vhi_staged):
    """One page of the online softmax (``_attend_page``'s arithmetic): each warp's logits of
    its 32 tokens (a page reference of each warp's own: :func:`_warp_reference`), the heads'
    maximum and sum across the warps, then each warp's PV dots for its own scale group's 32
    head dimensions over all 128 tokens (P and the values through shared memory). Returns the
    updated ``(m_run, l_run, acc_lo, acc_hi)``: ``m_run``, ``l_run`` ``[16]`` (the same in
    every warp), the accumulators ``[warp, 16, 16]`` (warp ``g``: dims ``32 g + 2 j`` and
    ``+ 1``). A live logit that is not finite makes its head's ``m_run`` NaN for good."""
    _, k0, k1, k2, k3, k_scales, v_codes, v_scales = page
    s0, s1, s2, s3, smax = mxfp4.token_scales(k_scales)
    live = (first_tok + _warp_tokens(TOKENS)) < ctx
    # the values first: their registers are free again before the logits take theirs
    v_lo, v_hi = _value_halves(v_codes, v_scales, live)
    _stage_values(v_lo, vlo_staged)
    _stage_values(v_hi, vhi_staged)
    ref = _warp_reference(smax, live)
    ref_t = ref[:, None]
    zero = gl.zeros((WARPS, 16, 32), gl.float32, layout=ACC)
    # a NaN key (scale byte 255) through group 0's factor: one select per token
    first = gl.where(smax == mxfp4.NAN_BYTE, float("nan"), mxfp4.pow2(s0 - ref_t))
    dots = _group_dot(qa[0], qa[1], k0, zero) * first[:, None, :]
    dots += _group_dot(qa[2], qa[3], k1, zero) * mxfp4.pow2(s1 - ref_t)[:, None, :]
    dots += _group_dot(qa[4], qa[5], k2, zero) * mxfp4.pow2(s2 - ref_t)[:, None, :]
    dots += _group_dot(qa[6], qa[7], k3, zero) * mxfp4.pow2(s3 - ref_t)[:, None, :]
    # q . k = dots * 2**(ref - 127 + 14 + q_exp) * q_mant: two powers of two and one factor
    # per (warp, head), as sparse_attention._scaled_logits takes them per head
    expo = gl.convert_layout(ref, gl.SliceLayout(1, ROWS))[:, None] - 127 + 14 + q_exp
    f1, f2 = mxfp4.pow2_factors(expo)
    logits = dots * f1[:, :, None] * f2[:, :, None] * q_factor[:, :, None]
    seen = live[:, None, :] & g_ok[:, :, None]
    logits = gl.where(gl.abs(logits) == float("inf"), float("nan"), logits)
    logits = gl.where(seen, logits, float("-inf"))
    warp_max = gl.reduce(logits, 2, _max_nan)  # [warp, 16]
    m_new = gl.maximum(m_run, gl.reduce(warp_max, 0, _max_nan),
                       propagate_nan=tl.PropagateNan.ALL)
    m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = gl.exp2((m_run - m_safe) * LOG2E)
    p = gl.exp2((logits - m_safe[None, :, None]) * LOG2E)
    l_old = l_run * alpha
    l_run = l_old + gl.sum(gl.sum(p, axis=2), axis=0)
    inv_l = gl.where(l_run > 0, 1.0 / gl.where(l_run > 0, l_run, 1.0), 0.0)
    p_whole = p_staged._reinterpret(gl.bfloat16, [WARPS, 16, 32], STAGING)
    p_whole.store((p * inv_l[None, :, None]).to(gl.bfloat16))
    gl.thread_barrier()
    keep = gl.convert_layout(l_old * inv_l, gl.SliceLayout(0, gl.SliceLayout(2, ACC)))
    acc_lo = acc_lo * keep[None, :, None]
    acc_hi = acc_hi * keep[None, :, None]
    for src in gl.static_range(WARPS):  # the tokens of warp src, against every group
        p_src = _per_warp(p_staged.index(src))
        acc_lo = mma_v2(p_src, vlo_staged.index(src).load(B_OP), acc_lo)
        acc_hi = mma_v2(p_src, vhi_staged.index(src).load(B_OP), acc_hi)
    gl.thread_barrier()  # the next page's stores wait for these loads
    return m_new, l_run, acc_lo, acc_hi


@gluon.jit
def attention_split_kernel(q_ptr, k_ptr, v_ptr, table_ptr, ctx_ptr, o_ptr, m_ptr, l_ptr, HKV, P,
                           NPAGES, sm_scale, G: gl.constexpr, PAGES: gl.constexpr,
                           SPLITS: gl.constexpr, Q_IS_FP8: gl.constexpr):
    """``attention_kernel``'s split-K partials (``GP = 16``): q ``[T, Hkv*G, 128]``, pools
    ``u8[P, Hkv, 8704]``, table ``s32[T*Hkv, n]``, context ``s32[T*Hkv]`` -> o ``bf16 [R,
    SPLITS, 16, 128]`` (columns in ``mxfp4.value_dims`` order), m, l ``f32 [R, SPLITS, 16]``."""
    r = gl.program_id(0)
    s = gl.program_id(1)
    t = r // HKV
    h = r % HKV
    g = gl.arange(0, 16, layout=gl.SliceLayout(0, ROWS))
    g_ok = g < G
    # The context, the page id and the page's bytes are asked for before the query: the
    # page's loads land in the layouts that use them, so nothing waits for them before the
    # query's normalization, and they are in flight while it runs.
    ctx = gl.minimum(gl.maximum(gl.load(ctx_ptr + r), 0), NPAGES * 128)
    page = _page_bytes(k_ptr, v_ptr, table_ptr, r, h, s * PAGES, ctx, HKV, P, NPAGES)
    qa, q_exp, q_mant = _query(q_ptr, t.to(gl.int64) * HKV * G + h * G, G, Q_IS_FP8)
    q_factor = q_mant * sm_scale
    g_ok2 = g_ok[None, :]
    heads: gl.constexpr = gl.SliceLayout(0, ROWS)
    m_run = gl.full((16,), float("-inf"), gl.float32, layout=heads)
    l_run = gl.zeros((16,), gl.float32, layout=heads)
    acc_lo = gl.zeros((WARPS, 16, 16), gl.float32, layout=ACC)
    acc_hi = gl.zeros((WARPS, 16, 16), gl.float32, layout=ACC)
    p_staged = gl.allocate_shared_memory(gl.bfloat16, [WARPS, 16, 32], OPERANDS)
    vlo_staged = gl.allocate_shared_memory(gl.bfloat16, [WARPS, WARPS, 32, 16], STAGING)
    vhi_staged = gl.allocate_shared_memory(gl.bfloat16, [WARPS, WARPS, 32, 16], STAGING)
    for i in gl.static_range(PAGES):  # page i + 1's bytes in flight while page i is computed
        if i + 1 < PAGES:
            following = _page_bytes(k_ptr, v_ptr, table_ptr, r, h, s * PAGES + i + 1, ctx,
                                    HKV, P, NPAGES)
        if page[0]:
            m_run, l_run, acc_lo, acc_hi = _attend(qa, q_exp, q_factor, page,
                                                   (s * PAGES + i) * 128, ctx, m_run, l_run,
                                                   acc_lo, acc_hi, g_ok2, p_staged,
                                                   vlo_staged, vhi_staged)
        if i + 1 < PAGES:
            page = following
    # warp w holds dims 32 w + 2 j (acc_lo) and + 1 (acc_hi): value_dims columns 16 w + j
    # and 64 + 16 w + j
    part = (r.to(gl.int64) * SPLITS + s) * 16
    w = gl.arange(0, WARPS, layout=gl.SliceLayout(1, ROWS))
    gm = gl.arange(0, 16, layout=gl.SliceLayout(0, ROWS))
    j = gl.arange(0, 16, layout=gl.SliceLayout(0, gl.SliceLayout(1, ACC)))
    col = (16 * w)[:, None, None] + j[None, None, :]
    base = o_ptr + (part + gm)[None, :, None] * 128 + col
    gl.store(base, acc_lo.to(gl.bfloat16))
    gl.store(base + 64, acc_hi.to(gl.bfloat16))
    gl.store(m_ptr + part + g, gl.convert_layout(m_run, gl.SliceLayout(0, ROWS)))
    gl.store(l_ptr + part + g, gl.convert_layout(l_run, gl.SliceLayout(0, ROWS)))
