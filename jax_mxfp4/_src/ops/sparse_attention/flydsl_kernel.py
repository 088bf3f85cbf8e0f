"""FlyDSL kernel: sparse paged attention over MXFP4 K/V pages (SPEC §6.1, §7, §7.1, §8).

A workgroup is one (row, partition); row ``r = t * Hkv + h`` attends with q heads
``h*G .. h*G+G-1`` (the 16 columns of the MFMA; columns >= G are computed and discarded)
over the first ``ctx`` tokens of its pages. Its 4 waves take the partition's pages round robin.

Per half page (64 tokens) a wave runs:

* **QK**: 4 ``v_mfma_scale_f32_16x16x128_f8f6f4``, K the fp4 A operand read straight from the
  page (lane (g, i): token i's bytes 16g..16g+15, scale byte g as the A scale), Q the e4m3 B
  operand. An e4m3 query is used as stored (B scale 127). A bf16 query row is normalized:
  ``q_scale = max(amax/448, FLT_MIN)``, ``q8 = e4m3(q / q_scale)``; the exponent of
  ``q_scale`` is the B scale and its mantissa (in [1, 2)) multiplies the logits, so the
  accumulator never exceeds the logit (SPEC §7.1).
* **softmax**, base 2: scores ``s = acc * mantissa * sm_scale * log2(e)``; tokens at or past
  ``ctx``, and every token of a page id outside ``[0, P)``, score ``-inf`` and get a zero V
  scale (garbage and e8m0 0/255 cannot leak); running max per q head, per-lane partial sums.
  A live score that is not finite (a key scale byte 255 in any group, a NaN query element, an
  overflow) poisons its q head: a per-lane flag, merged with the waves' ``m`` as NaN, makes
  the head's output NaN (SPEC §9.2); live V elements that are NaN or infinite reach the
  output through the PV sum.
* **PV**: V widened exactly to bf16 (e2m1 via ``v_cvt_scalef32_pk_f32_fp4`` at scale 1, times
  the exact fp32 e8m0 value, truncated) into a wave-private transposed LDS tile
  ``[128 dims][32 tokens]``; 16 ``v_mfma_f32_16x16x32_bf16`` with P (bf16, pre-scaled by 2**-12
  so the fp32 sum of a partition cannot overflow) as the A operand, straight from the QK
  accumulators: the k slots of lane group g are tokens ``4g..4g+3`` and ``16+4g..16+4g+3``
  of each 32-token step, and the V^T reads use the same order.

The 4 waves then merge ``(m, l, O)`` through LDS. ``direct`` kernels (one partition) write the
final bf16 output or its MXFP8 quantization (SPEC §8, fused epilogue); ``split`` kernels write
the partition's ``(m, l)`` and ``O/l`` (bf16) for
:mod:`jax_mxfp4._src.ops.sparse_attention.flydsl_merge`.

Kernarg layout: :data:`ARGS` below (the one declaration). Grid: :func:`.abi.grid`.
"""

from __future__ import annotations

import functools

from jax_mxfp4._src.core.formats import PAGE_BYTES
from jax_mxfp4._src.core.formats import PAGE_SCALE_OFFSET as SCALE_OFFSET
from jax_mxfp4._src.core.scaling import FLT_MIN
from jax_mxfp4._src.flydsl import _ir as ir
from jax_mxfp4._src.flydsl import _numerics as numerics
from jax_mxfp4._src.flydsl._ir import rocdl
from jax_mxfp4._src.flydsl._signature import jit_launcher
from jax_mxfp4._src.flydsl.abi import BLOCK_THREADS, Arg, Specialization
from jax_mxfp4._src.ops.sparse_attention.flydsl_merge import store_output_block

ARGS = (
    Arg("q", "pointer", "bf16|e4m3[T, Hkv*G, 128] queries"),
    Arg("k_pool", "pointer", "u8[P, Hkv, 8704] MXFP4 keys"),
    Arg("v_pool", "pointer", "u8[P, Hkv, 8704] MXFP4 values"),
    Arg("page_table", "pointer", "s32[T, Hkv, n] page ids in attention order"),
    Arg("context_lens", "pointer", "s32[T, Hkv] tokens attended per row"),
    Arg("out", "pointer", "direct: bf16[T, Hkv*G, 128] or e4m3[T, Hkv*G*128] (mxfp8 values); "
        "split: bf16[R, NP, G, 128] partial outputs (normalized)"),
    Arg("out_aux", "pointer", "direct mxfp8: u8[T, Hkv*G*4] scales; split: f32[R, NP, G, 2] "
        "partial (base-2 max, sum); direct bf16: unused (may be null)"),
    Arg("num_rows", "i32", "R = T * Hkv"),
    Arg("num_kv_heads", "i32", "Hkv"),
    Arg("num_pages", "i32", "P"),
    Arg("pages_per_row", "i32", "n"),
    Arg("num_partitions", "i32", "NP (1 for the direct kernels)"),
    Arg("sm_scale", "f32", "softmax scale"),
)

THREADS = BLOCK_THREADS["sparse_attention"]
WAVES = 4
VT_ROW = 72  # bytes per dim row of the V^T tile: 32 bf16 tokens + 8 bytes of padding
WAVE_LDS = 128 * VT_ROW  # 9216 >= the 16 x 128 fp32 O tile the merge stores there
STATS_LDS = WAVES * 16 * 2 * 4
P_PRESCALE = 2.0**-12
LOG2E = 1.4426950408889634


def _setup(spec: Specialization, a) -> ir.LaneContext:
    c = ir.lane_context()
    c.row = ir.block_id("x")
    c.part = ir.block_id("y")
    c.head = ir.srem(c.row, a.num_kv_heads)
    capacity = ir.mul(a.pages_per_row, ir.ci32(128))
    ctx = ir.uniform(ir.load(ir.i32(), ir.global_ptr(a.context_lens), ir.mul(ir.zext64(c.row),
                                                                             ir.ci64(4)),
                             align=4))
    c.ctx = ir.smin(ir.smax(ctx, ir.ci32(0)), capacity)
    needed = ir.lshr(ir.add(c.ctx, ir.ci32(127)), ir.ci32(7))
    per_part = ir.ceil_div(a.pages_per_row, a.num_partitions)
    c.first = ir.mul(c.part, per_part)
    c.last = ir.smin(ir.add(c.first, per_part), needed)
    return c


def _query(spec: Specialization, a, c: ir.LaneContext):
    """(B operand vector<8xi32>, B scale byte, per-column logit factor) of this lane."""
    qhead = ir.select(ir.lt(c.col, ir.ci32(spec.group)), c.col, ir.ci32(0))
    elem = ir.mul(ir.add(ir.mul(ir.zext64(c.row), ir.ci64(spec.group)), ir.zext64(qhead)),
                  ir.ci64(128))
    first = ir.zext64(ir.mul(c.grp, ir.ci32(16)))
    base_factor = ir.fmul(a.sm_scale, ir.cf32(LOG2E))
    if spec.q == "e4m3":
        words = []
        for half in range(2):
            chunk = ir.load(ir.vec(4, ir.i32()), ir.global_ptr(a.q),
                            ir.add(elem, ir.add(first, ir.ci64(64 * half))), align=16)
            words += [ir.extract(chunk, e) for e in range(4)]
        return ir.from_elements(ir.vec(8, ir.i32()), words), ir.ci32(127), base_factor
    bf = []
    for half in range(2):
        start = ir.mul(ir.add(elem, ir.add(first, ir.ci64(64 * half))), ir.ci64(2))
        for k in range(2):
            chunk = ir.load(ir.vec(4, ir.i32()), ir.global_ptr(a.q), ir.add(start, ir.ci64(16 * k)),
                            align=16)
            bf += [ir.extract(chunk, e) for e in range(4)]
    values = numerics.bf16_words_to_f32(bf)
    amax = ir.ci32(0)
    for v in values:
        amax = ir.umax(amax, ir.band(ir.f32_bits(v), ir.ci32(0x7FFFFFFF)))
    amax = ir.f32_from_bits(amax)
    amax = ir.fmax(amax, ir.lane_xor_f32(amax, c.lane, 16))
    amax = ir.fmax(amax, ir.lane_xor_f32(amax, c.lane, 32))
    q_scale = ir.fmax(ir.fdiv(amax, ir.cf32(numerics.E4M3_MAX)), ir.cf32(FLT_MIN))
    # no guard needed: a NaN element's quotient is NaN either way, and an infinite element
    # makes q_scale infinite, whose B scale byte 255 poisons the row in the MFMA
    inverse = ir.fdiv(ir.cf32(1.0), q_scale)
    words = numerics.pack_e4m3([ir.quotient_rn(v, q_scale, inverse, guard_infinite=False)
                                for v in values])
    bits = ir.f32_bits(q_scale)
    byte = ir.band(ir.lshr(bits, ir.ci32(23)), ir.ci32(0xFF))
    mantissa = ir.f32_from_bits(ir.bor(ir.band(bits, ir.ci32(0x7FFFFF)), ir.ci32(0x3F800000)))
    return ir.from_elements(ir.vec(8, ir.i32()), words), byte, ir.fmul(mantissa, base_factor)


def _page(a, c: ir.LaneContext, k):
    """(byte offset of the (page, kv head) in the pools, page usable) of page slot ``k``."""
    at = ir.add(ir.mul(ir.zext64(c.row), ir.zext64(a.pages_per_row)), ir.zext64(k))
    page = ir.uniform(ir.load(ir.i32(), ir.global_ptr(a.page_table), ir.mul(at, ir.ci64(4)),
                              align=4))
    ok = ir.land(ir.ge(page, ir.ci32(0)), ir.lt(page, a.num_pages))
    safe = ir.select(ok, page, ir.ci32(0))
    base = ir.mul(ir.add(ir.mul(ir.zext64(safe), ir.zext64(a.num_kv_heads)), ir.zext64(c.head)),
                  ir.ci64(PAGE_BYTES))
    return base, ok


def _scores(a, c: ir.LaneContext, q, base, ok, k, half, poisoned) -> tuple:
    """Base-2 scores of this lane over half page ``half`` (64 tokens): 4 tiles x 4 tokens
    (``16m + 4g + v``, m = 4*half .. 4*half+3) for q head ``col``, and ``poisoned`` (f32
    0/1) updated for a live score that is not finite or a live token with NaN keys."""
    b_operand, b_scale, factor = q
    limit = ir.select(ok, ir.sub(c.ctx, ir.mul(k, ir.ci32(128))),
                      ir.ci32(0))  # live iff token < limit
    out = []
    for tile in range(4):
        m = ir.add(ir.mul(half, ir.ci32(4)), ir.ci32(tile))
        token = ir.add(ir.mul(m, ir.ci32(16)), c.col)
        data_at = ir.add(base, ir.zext64(ir.add(ir.mul(token, ir.ci32(64)), ir.mul(c.grp,
                                                                                   ir.ci32(16)))))
        a4 = ir.load(ir.vec(4, ir.i32()), ir.global_ptr(a.k_pool), data_at, align=16)
        scale_at = ir.add(base, ir.zext64(ir.add(ir.ci32(SCALE_OFFSET),
                                                 ir.add(ir.mul(token, ir.ci32(4)), c.grp))))
        a_scale = ir.zext32(ir.load(ir.i8(), ir.global_ptr(a.k_pool), scale_at, align=1))
        d = ir.mfma_scale_16x16x128(ir.widen_to_8_dwords(a4), b_operand, ir.zeros_f32x4(),
                                    fmt_a=ir.FMT_FP4_E2M1, fmt_b=ir.FMT_FP8_E4M3,
                                    scale_a=a_scale, scale_b=b_scale)
        for v in range(4):
            tok = ir.add(ir.add(ir.mul(m, ir.ci32(16)), ir.ci32(v)), ir.mul(c.grp, ir.ci32(4)))
            dot = ir.extract(d, v)
            s = ir.fmul(dot, factor)
            live = ir.lt(tok, limit)
            # a key scale byte 255 or a NaN query element makes the MFMA's dot NaN, and a
            # non-finite dot a non-finite s (factor > 0, or 0 giving NaN): one test covers all
            poisoned = ir.select(ir.land(live, ir.not_finite(s)), ir.cf32(1.0), poisoned)
            out.append(ir.select(live, s, ir.cf32(ir.NEG_INF)))
    return out, poisoned


def _stage_v(a, c: ir.LaneContext, lds_wave, base, ok, k, step) -> None:
    """Widen 32 tokens of V (step ``step``) to bf16 and store them transposed in LDS: lane
    (quad, dgroup) handles tokens ``4*quad .. +3`` and dims ``16*dgroup .. +15``, two tokens at
    a time (one 32-bit LDS word per dim)."""
    quad, dgroup = ir.band(c.lane, ir.ci32(7)), ir.lshr(c.lane, ir.ci32(3))
    limit = ir.select(ok, ir.sub(c.ctx, ir.mul(k, ir.ci32(128))), ir.ci32(0))
    for pair in range(2):
        columns = []
        for s in range(2 * pair, 2 * pair + 2):
            tok = ir.add(ir.add(ir.mul(step, ir.ci32(32)), ir.ci32(s)), ir.mul(quad, ir.ci32(4)))
            data_at = ir.add(base, ir.zext64(ir.add(ir.mul(tok, ir.ci32(64)), ir.mul(dgroup,
                                                                                     ir.ci32(8)))))
            words = ir.load(ir.vec(2, ir.i32()), ir.global_ptr(a.v_pool), data_at, align=8)
            scale_at = ir.add(base, ir.zext64(ir.add(ir.ci32(SCALE_OFFSET), ir.add(
                ir.mul(tok, ir.ci32(4)), ir.lshr(dgroup, ir.ci32(1))))))
            byte = ir.zext32(ir.load(ir.i8(), ir.global_ptr(a.v_pool), scale_at, align=1))
            scale = ir.select(ir.lt(tok, limit), ir.e8m0_to_f32(byte), ir.cf32(0.0))
            vals = (numerics.e2m1_word_to_f32(ir.extract(words, 0))
                    + numerics.e2m1_word_to_f32(ir.extract(words, 1)))
            columns.append([ir.lshr(ir.f32_bits(ir.fmul(v, scale)), ir.ci32(16)) for v in vals])
        for e in range(16):
            word = ir.bor(columns[0][e], ir.shl(columns[1][e], ir.ci32(16)))
            at = ir.add(ir.mul(ir.add(ir.mul(dgroup, ir.ci32(16)), ir.ci32(e)), ir.ci32(VT_ROW)),
                        ir.add(ir.mul(quad, ir.ci32(8)), ir.ci32(4 * pair)))
            ir.store(word, lds_wave, at, align=4)
    rocdl.s_waitcnt(lgkmcnt=0)


def _pv_step(c: ir.LaneContext, lds_wave, a_operand, acc: list) -> list:
    """O += P[:, 32 tokens] x V[32 tokens, 128 dims] (8 bf16 MFMAs)."""
    out = []
    for dt in range(8):
        row = ir.add(ir.ci32(16 * dt), c.col)
        at = ir.add(ir.mul(row, ir.ci32(VT_ROW)), ir.mul(c.grp, ir.ci32(8)))
        lo = ir.load(ir.vec(2, ir.i32()), lds_wave, at, align=8)
        hi = ir.load(ir.vec(2, ir.i32()), lds_wave, ir.add(at, ir.ci32(32)), align=8)
        b_operand = ir.vbitcast(ir.vec(8, ir.bf16()), ir.concat(lo, hi))
        out.append(ir.mfma_bf16_16x16x32(a_operand, b_operand, acc[dt]))
    rocdl.s_waitcnt(lgkmcnt=0)
    return out


def _row_values(x, c: ir.LaneContext) -> list:
    """Per-q-head value ``x`` (held by lane ``head``) for O rows ``4g + v``, v = 0..3."""
    return [ir.lane_read_f32(x, ir.add(ir.mul(c.grp, ir.ci32(4)), ir.ci32(v))) for v in range(4)]


def _page_update(spec, a, c: ir.LaneContext, q, lds_wave, k, half, state) -> list:
    """Online softmax and PV over half ``half`` (64 tokens) of page slot ``k``;
    ``state = [m, l, poisoned, O0..O7]``."""
    m_old, l_old, poisoned, acc = state[0], state[1], state[2], state[3:]
    base, ok = _page(a, c, k)
    scores, poisoned = _scores(a, c, q, base, ok, k, half, poisoned)
    page_max = scores[0]
    for s in scores[1:]:
        page_max = ir.fmax(page_max, s)
    page_max = ir.fmax(page_max, ir.lane_xor_f32(page_max, c.lane, 16))
    page_max = ir.fmax(page_max, ir.lane_xor_f32(page_max, c.lane, 32))
    m_new = ir.fmax(m_old, page_max)
    m_use = ir.select(ir.feq(m_new, ir.cf32(ir.NEG_INF)), ir.cf32(0.0), m_new)
    alpha = ir.exp2(ir.fsub(m_old, m_use))
    probs = [ir.exp2(ir.fsub(s, m_use)) for s in scores]
    total = ir.fmul(l_old, alpha)
    for p in probs:
        total = ir.fadd(total, p)
    alphas = _row_values(alpha, c)
    acc = [ir.from_elements(ir.vec(4, ir.f32()),
                            [ir.fmul(ir.extract(o, v), alphas[v]) for v in range(4)]) for o in acc]
    scaled = [ir.fmul(p, ir.cf32(P_PRESCALE)) for p in probs]
    operands = [numerics.pack_bf16_vec8(scaled[8 * step : 8 * step + 8]) for step in range(2)]
    for step in range(2):
        _stage_v(a, c, lds_wave, base, ok, k, ir.add(ir.mul(half, ir.ci32(2)), ir.ci32(step)))
        acc = _pv_step(c, lds_wave, operands[step], acc)
    return [m_new, total, poisoned, *acc]


def _merge_waves(spec, a, c: ir.LaneContext, lds, stats, state) -> None:
    """Combine the 4 waves' (m, l, O) and store the direct output or the split partial. A
    poisoned q head's ``m`` goes to LDS as NaN (the epilogue's flag)."""
    m, l_lane, poisoned, acc = state[0], state[1], state[2], state[3:]
    total = ir.fadd(l_lane, ir.lane_xor_f32(l_lane, c.lane, 16))
    total = ir.fadd(total, ir.lane_xor_f32(total, c.lane, 32))
    poisoned = ir.fmax(poisoned, ir.lane_xor_f32(poisoned, c.lane, 16))
    poisoned = ir.fmax(poisoned, ir.lane_xor_f32(poisoned, c.lane, 32))
    m = ir.select(ir.fgt(poisoned, ir.cf32(0.0)), ir.cf32(float("nan")), m)
    lds_wave = ir.gep(lds, ir.mul(c.wave, ir.ci32(WAVE_LDS)))
    with ir.when(ir.eq(c.grp, ir.ci32(0))):
        at = ir.mul(ir.add(ir.mul(c.wave, ir.ci32(16)), c.col), ir.ci32(8))
        ir.store(ir.from_elements(ir.vec(2, ir.f32()), [m, total]), stats, at, align=8)
    for dt in range(8):
        for v in range(4):
            qh = ir.add(ir.mul(c.grp, ir.ci32(4)), ir.ci32(v))
            at = ir.mul(ir.add(ir.mul(qh, ir.ci32(128)), ir.add(ir.ci32(16 * dt), c.col)),
                        ir.ci32(4))
            ir.store(ir.extract(acc[dt], v), lds_wave, at, align=4)
    ir.barrier()
    qhead, block = ir.lshr(c.lane, ir.ci32(2)), ir.band(c.lane, ir.ci32(3))
    with ir.when(ir.land(ir.eq(c.wave, ir.ci32(0)), ir.lt(qhead, ir.ci32(spec.group)))):
        _epilogue(spec, a, c, lds, stats, qhead, block)


def _epilogue(spec, a, c: ir.LaneContext, lds, stats, qhead, block) -> None:
    ms, ls = [], []
    poisoned = None
    for w in range(WAVES):
        pair = ir.load(ir.vec(2, ir.f32()), stats, ir.mul(ir.add(ir.ci32(16 * w), qhead),
                                                          ir.ci32(8)),
                       align=8)
        ms.append(ir.extract(pair, 0))
        ls.append(ir.extract(pair, 1))
        nan_m = ir.is_nan(ms[-1])
        poisoned = nan_m if poisoned is None else ir.lor(poisoned, nan_m)
    top = ir.cf32(ir.NEG_INF)
    for m, sm in zip(ms, ls, strict=True):
        top = ir.select(ir.fgt(sm, ir.cf32(0.0)), ir.fmax(top, m), top)
    weights = [ir.select(ir.fgt(sm, ir.cf32(0.0)), ir.exp2(ir.fsub(m, top)), ir.cf32(0.0))
               for m, sm in zip(ms, ls, strict=True)]
    total = ir.cf32(0.0)
    for wgt, sm in zip(weights, ls, strict=True):
        total = ir.fadd(total, ir.fmul(wgt, sm))
    nonzero = ir.fgt(total, ir.cf32(0.0))
    safe = ir.select(nonzero, total, ir.cf32(1.0))  # >= 1 when nonzero: the top wave's sum
    inverse = ir.fdiv(ir.cf32(1.0), safe)
    values = []
    for chunk in range(8):
        rocdl.sched_barrier(0)  # one 4-dim chunk of the 4 waves' O at a time (register pressure)
        o = [ir.cf32(0.0)] * 4
        for w in range(WAVES):
            dim = ir.add(ir.mul(block, ir.ci32(32)), ir.ci32(4 * chunk))
            elem = ir.add(ir.mul(qhead, ir.ci32(128)), dim)
            at = ir.add(ir.ci32(w * WAVE_LDS), ir.mul(elem, ir.ci32(4)))
            four = ir.load(ir.vec(4, ir.f32()), lds, at, align=16)
            o = [ir.fadd(o[e], ir.fmul(weights[w], ir.extract(four, e))) for e in range(4)]
        for e in range(4):
            restored = ir.fmul(ir.quotient_rn(o[e], safe, inverse), ir.cf32(1.0 / P_PRESCALE))
            value = ir.select(nonzero, restored, ir.cf32(0.0))
            values.append(ir.select(poisoned, ir.cf32(float("nan")), value))
    row_head = ir.add(ir.mul(c.row, ir.ci32(spec.group)), qhead)
    if spec.path == "direct":
        store_output_block(spec.output, a.out, a.out_aux, row_head, block, values)
        return
    top = ir.select(poisoned, ir.cf32(float("nan")), ir.select(nonzero, top, ir.cf32(ir.NEG_INF)))
    _store_partial(spec, a, c, qhead, block, values, top, total)


def _store_partial(spec, a, c: ir.LaneContext, qhead, block, values, top, total) -> None:
    slot = ir.add(ir.mul(ir.add(ir.mul(ir.zext64(c.row), ir.zext64(a.num_partitions)),
                                ir.zext64(c.part)),
                         ir.ci64(spec.group)), ir.zext64(qhead))
    store_output_block("bf16", a.out, None, ir.trunc32(slot), block, values)
    with ir.when(ir.eq(block, ir.ci32(0))):
        ir.store(ir.from_elements(ir.vec(2, ir.f32()), [top, total]), ir.global_ptr(a.out_aux),
                 ir.mul(slot, ir.ci64(8)), align=8)


def _body(spec: Specialization, a) -> None:
    lds = ir.lds_alloc(WAVES * WAVE_LDS + STATS_LDS)
    stats = ir.gep(lds, ir.ci32(WAVES * WAVE_LDS))
    c = _setup(spec, a)
    q = _query(spec, a, c)
    lds_wave = ir.gep(lds, ir.mul(c.wave, ir.ci32(WAVE_LDS)))
    mine = ir.sub(c.last, ir.add(c.first, c.wave))
    count = ir.select(ir.gt(mine, ir.ci32(0)), ir.ceil_div(mine, ir.ci32(WAVES)), ir.ci32(0))

    def page(i, state):
        k = ir.add(ir.add(c.first, c.wave), ir.mul(ir.lshr(i, ir.ci32(1)), ir.ci32(WAVES)))
        return _page_update(spec, a, c, q, lds_wave, k, ir.band(i, ir.ci32(1)), state)

    init = [ir.cf32(ir.NEG_INF), ir.cf32(0.0), ir.cf32(0.0)] + [ir.zeros_f32x4() for _ in range(8)]
    state = ir.loop(ir.ci32(0), ir.mul(count, ir.ci32(2)), init, page)
    _merge_waves(spec, a, c, lds, stats, state)


def build(spec: Specialization):
    """The ``@flyc.jit`` launcher of one sparse_attention specialization."""
    assert spec.op == "sparse_attention"
    return jit_launcher(spec.symbol, ARGS, functools.partial(_body, spec), THREADS)
