"""FlyDSL kernel: sparse paged attention over MXFP4 K/V pages (SPEC §7, §8, §15.8–15.9).

A workgroup is one (row, partition); row ``r = t * Hkv + h`` attends with q heads
``h*G .. h*G+G-1`` (the 16 columns of the MFMA; columns >= G are computed and discarded)
over the first ``ctx`` tokens of its pages. Its 4 waves take the partition's pages round robin.

Per half page (64 tokens) a wave runs:

* **QK**: 4 ``v_mfma_scale_f32_16x16x128_f8f6f4``, K the fp4 A operand read straight from the
  page (lane (g, i): token i's bytes 16g..16g+15, scale byte g as the A scale), Q the e4m3 B
  operand. An e4m3 query is used as stored (B scale 127). A bf16 query row is normalized:
  ``q_scale = max(amax/448, FLT_MIN)``, ``q8 = e4m3(q / q_scale)``; the exponent of
  ``q_scale`` is the B scale and its mantissa (in [1, 2)) multiplies the logits, so the
  accumulator never exceeds the logit (SPEC §15.9).
* **softmax**, base 2: scores ``s = acc * mantissa * sm_scale * log2(e)``; tokens at or past
  ``ctx``, and every token of a page id outside ``[0, P)``, score ``-inf`` and get a zero V
  scale (garbage and e8m0 0/255 cannot leak); running max per q head, per-lane partial sums.
  A live score that is not finite (a key scale byte 255 in any group, a NaN query element, an
  overflow) poisons its q head: a per-lane flag, merged with the waves' ``m`` as NaN, makes
  the head's output NaN (SPEC §15.18); live V elements that are NaN or infinite reach the
  output through the PV sum.
* **PV**: V widened exactly to bf16 (e2m1 via ``v_cvt_scalef32_pk_f32_fp4`` at scale 1, times
  the exact fp32 e8m0 value, truncated) into a wave-private transposed LDS tile
  ``[128 dims][32 tokens]``; 16 ``v_mfma_f32_16x16x32_bf16`` with P (bf16, pre-scaled by 2**-12
  so the fp32 sum of a partition cannot overflow) as the A operand, straight from the QK
  accumulators: the k slots of lane group g are tokens ``4g..4g+3`` and ``16+4g..16+4g+3``
  of each 32-token step, and the V^T reads use the same order.

The 4 waves then merge ``(m, l, O)`` through LDS. ``direct`` kernels (one partition) write the
final bf16 output or its MXFP8 quantization (SPEC §8, fused epilogue); ``split`` kernels write
the partition's ``(m, l)`` and ``O/l`` (bf16) for :mod:`hip_kernels.attention_merge`.

Kernarg layout: :data:`ARGS` below (the one declaration). Grid: :func:`.abi.grid`.
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
from jax.core import ShapedArray

from jax_mxfp4.formats import PAGE_BYTES
from jax_mxfp4.formats import PAGE_SCALE_OFFSET as SCALE_OFFSET
from jax_mxfp4.gpu import launch as launcher
from jax_mxfp4.plans import attention_splits
from jax_mxfp4.scaling import FLT_MIN

from . import _ir as I
from . import _launch
from . import _numerics as N
from ._ir import rocdl
from ._signature import jit_launcher
from .abi import BLOCK_THREADS, Arg, Specialization
from .attention_merge import store_output_block
from .code_object import code_object

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


def _setup(spec: Specialization, a) -> I.LaneContext:
    c = I.lane_context()
    c.row = I.block_id("x")
    c.part = I.block_id("y")
    c.head = I.srem(c.row, a.num_kv_heads)
    capacity = I.mul(a.pages_per_row, I.ci32(128))
    ctx = I.uniform(I.load(I.i32(), I.global_ptr(a.context_lens), I.mul(I.zext64(c.row), I.ci64(4)),
                           align=4))
    c.ctx = I.smin(I.smax(ctx, I.ci32(0)), capacity)
    needed = I.lshr(I.add(c.ctx, I.ci32(127)), I.ci32(7))
    per_part = I.ceil_div(a.pages_per_row, a.num_partitions)
    c.first = I.mul(c.part, per_part)
    c.last = I.smin(I.add(c.first, per_part), needed)
    return c


def _query(spec: Specialization, a, c: I.LaneContext):
    """(B operand vector<8xi32>, B scale byte, per-column logit factor) of this lane."""
    qhead = I.select(I.lt(c.col, I.ci32(spec.group)), c.col, I.ci32(0))
    elem = I.mul(I.add(I.mul(I.zext64(c.row), I.ci64(spec.group)), I.zext64(qhead)), I.ci64(128))
    first = I.zext64(I.mul(c.grp, I.ci32(16)))
    base_factor = I.fmul(a.sm_scale, I.cf32(LOG2E))
    if spec.q == "e4m3":
        words = []
        for half in range(2):
            chunk = I.load(I.vec(4, I.i32()), I.global_ptr(a.q),
                           I.add(elem, I.add(first, I.ci64(64 * half))), align=16)
            words += [I.extract(chunk, e) for e in range(4)]
        return I.from_elements(I.vec(8, I.i32()), words), I.ci32(127), base_factor
    bf = []
    for half in range(2):
        start = I.mul(I.add(elem, I.add(first, I.ci64(64 * half))), I.ci64(2))
        for k in range(2):
            chunk = I.load(I.vec(4, I.i32()), I.global_ptr(a.q), I.add(start, I.ci64(16 * k)),
                           align=16)
            bf += [I.extract(chunk, e) for e in range(4)]
    values = N.bf16_words_to_f32(bf)
    amax = I.ci32(0)
    for v in values:
        amax = I.umax(amax, I.band(I.f32_bits(v), I.ci32(0x7FFFFFFF)))
    amax = I.f32_from_bits(amax)
    amax = I.fmax(amax, I.lane_xor_f32(amax, c.lane, 16))
    amax = I.fmax(amax, I.lane_xor_f32(amax, c.lane, 32))
    q_scale = I.fmax(I.fdiv(amax, I.cf32(N.E4M3_MAX)), I.cf32(FLT_MIN))
    words = N.pack_e4m3([I.fdiv(v, q_scale) for v in values])
    bits = I.f32_bits(q_scale)
    byte = I.band(I.lshr(bits, I.ci32(23)), I.ci32(0xFF))
    mantissa = I.f32_from_bits(I.bor(I.band(bits, I.ci32(0x7FFFFF)), I.ci32(0x3F800000)))
    return I.from_elements(I.vec(8, I.i32()), words), byte, I.fmul(mantissa, base_factor)


def _page(a, c: I.LaneContext, k):
    """(byte offset of the (page, kv head) in the pools, page usable) of page slot ``k``."""
    at = I.add(I.mul(I.zext64(c.row), I.zext64(a.pages_per_row)), I.zext64(k))
    page = I.uniform(I.load(I.i32(), I.global_ptr(a.page_table), I.mul(at, I.ci64(4)), align=4))
    ok = I.land(I.ge(page, I.ci32(0)), I.lt(page, a.num_pages))
    safe = I.select(ok, page, I.ci32(0))
    base = I.mul(I.add(I.mul(I.zext64(safe), I.zext64(a.num_kv_heads)), I.zext64(c.head)),
                 I.ci64(PAGE_BYTES))
    return base, ok


def _scores(a, c: I.LaneContext, q, base, ok, k, half, poisoned) -> tuple:
    """Base-2 scores of this lane over half page ``half`` (64 tokens): 4 tiles x 4 tokens
    (``16m + 4g + v``, m = 4*half .. 4*half+3) for q head ``col``, and ``poisoned`` (f32
    0/1) updated for a live score that is not finite or a live token with NaN keys."""
    b_operand, b_scale, factor = q
    limit = I.select(ok, I.sub(c.ctx, I.mul(k, I.ci32(128))), I.ci32(0))  # live iff token < limit
    out = []
    for tile in range(4):
        m = I.add(I.mul(half, I.ci32(4)), I.ci32(tile))
        token = I.add(I.mul(m, I.ci32(16)), c.col)
        data_at = I.add(base, I.zext64(I.add(I.mul(token, I.ci32(64)), I.mul(c.grp, I.ci32(16)))))
        a4 = I.load(I.vec(4, I.i32()), I.global_ptr(a.k_pool), data_at, align=16)
        scale_at = I.add(base, I.zext64(I.add(I.ci32(SCALE_OFFSET),
                                              I.add(I.mul(token, I.ci32(4)), c.grp))))
        a_scale = I.zext32(I.load(I.i8(), I.global_ptr(a.k_pool), scale_at, align=1))
        d = I.mfma_scale_16x16x128(I.widen_to_8_dwords(a4), b_operand, I.zeros_f32x4(),
                                   fmt_a=I.FMT_FP4_E2M1, fmt_b=I.FMT_FP8_E4M3,
                                   scale_a=a_scale, scale_b=b_scale)
        nan_keys = I.nan_scale_tokens(a_scale, c)
        for v in range(4):
            tok = I.add(I.add(I.mul(m, I.ci32(16)), I.ci32(v)), I.mul(c.grp, I.ci32(4)))
            dot = I.extract(d, v)
            s = I.fmul(dot, factor)
            live = I.lt(tok, limit)
            bad = I.lor(I.lor(I.not_finite(dot), I.not_finite(s)), nan_keys[v])
            poisoned = I.select(I.land(live, bad), I.cf32(1.0), poisoned)
            out.append(I.select(live, s, I.cf32(I.NEG_INF)))
    return out, poisoned


def _stage_v(a, c: I.LaneContext, lds_wave, base, ok, k, step) -> None:
    """Widen 32 tokens of V (step ``step``) to bf16 and store them transposed in LDS: lane
    (quad, dgroup) handles tokens ``4*quad .. +3`` and dims ``16*dgroup .. +15``, two tokens at
    a time (one 32-bit LDS word per dim)."""
    quad, dgroup = I.band(c.lane, I.ci32(7)), I.lshr(c.lane, I.ci32(3))
    limit = I.select(ok, I.sub(c.ctx, I.mul(k, I.ci32(128))), I.ci32(0))
    for pair in range(2):
        columns = []
        for s in range(2 * pair, 2 * pair + 2):
            tok = I.add(I.add(I.mul(step, I.ci32(32)), I.ci32(s)), I.mul(quad, I.ci32(4)))
            data_at = I.add(base, I.zext64(I.add(I.mul(tok, I.ci32(64)), I.mul(dgroup, I.ci32(8)))))
            words = I.load(I.vec(2, I.i32()), I.global_ptr(a.v_pool), data_at, align=8)
            scale_at = I.add(base, I.zext64(I.add(I.ci32(SCALE_OFFSET), I.add(
                I.mul(tok, I.ci32(4)), I.lshr(dgroup, I.ci32(1))))))
            byte = I.zext32(I.load(I.i8(), I.global_ptr(a.v_pool), scale_at, align=1))
            scale = I.select(I.lt(tok, limit), I.e8m0_to_f32(byte), I.cf32(0.0))
            vals = N.e2m1_word_to_f32(I.extract(words, 0)) + N.e2m1_word_to_f32(I.extract(words, 1))
            columns.append([I.lshr(I.f32_bits(I.fmul(v, scale)), I.ci32(16)) for v in vals])
        for e in range(16):
            word = I.bor(columns[0][e], I.shl(columns[1][e], I.ci32(16)))
            at = I.add(I.mul(I.add(I.mul(dgroup, I.ci32(16)), I.ci32(e)), I.ci32(VT_ROW)),
                       I.add(I.mul(quad, I.ci32(8)), I.ci32(4 * pair)))
            I.store(word, lds_wave, at, align=4)
    rocdl.s_waitcnt(lgkmcnt=0)


def _pv_step(c: I.LaneContext, lds_wave, a_operand, acc: list) -> list:
    """O += P[:, 32 tokens] x V[32 tokens, 128 dims] (8 bf16 MFMAs)."""
    out = []
    for dt in range(8):
        row = I.add(I.ci32(16 * dt), c.col)
        at = I.add(I.mul(row, I.ci32(VT_ROW)), I.mul(c.grp, I.ci32(8)))
        lo = I.load(I.vec(2, I.i32()), lds_wave, at, align=8)
        hi = I.load(I.vec(2, I.i32()), lds_wave, I.add(at, I.ci32(32)), align=8)
        b_operand = I.vbitcast(I.vec(8, I.bf16()), I.concat(lo, hi))
        out.append(I.mfma_bf16_16x16x32(a_operand, b_operand, acc[dt]))
    rocdl.s_waitcnt(lgkmcnt=0)
    return out


def _row_values(x, c: I.LaneContext) -> list:
    """Per-q-head value ``x`` (held by lane ``head``) for O rows ``4g + v``, v = 0..3."""
    return [I.lane_read_f32(x, I.add(I.mul(c.grp, I.ci32(4)), I.ci32(v))) for v in range(4)]


def _page_update(spec, a, c: I.LaneContext, q, lds_wave, k, half, state) -> list:
    """Online softmax and PV over half ``half`` (64 tokens) of page slot ``k``;
    ``state = [m, l, poisoned, O0..O7]``."""
    m_old, l_old, poisoned, acc = state[0], state[1], state[2], state[3:]
    base, ok = _page(a, c, k)
    scores, poisoned = _scores(a, c, q, base, ok, k, half, poisoned)
    page_max = scores[0]
    for s in scores[1:]:
        page_max = I.fmax(page_max, s)
    page_max = I.fmax(page_max, I.lane_xor_f32(page_max, c.lane, 16))
    page_max = I.fmax(page_max, I.lane_xor_f32(page_max, c.lane, 32))
    m_new = I.fmax(m_old, page_max)
    m_use = I.select(I.feq(m_new, I.cf32(I.NEG_INF)), I.cf32(0.0), m_new)
    alpha = I.exp2(I.fsub(m_old, m_use))
    probs = [I.exp2(I.fsub(s, m_use)) for s in scores]
    total = I.fmul(l_old, alpha)
    for p in probs:
        total = I.fadd(total, p)
    alphas = _row_values(alpha, c)
    acc = [I.from_elements(I.vec(4, I.f32()),
                           [I.fmul(I.extract(o, v), alphas[v]) for v in range(4)]) for o in acc]
    scaled = [I.fmul(p, I.cf32(P_PRESCALE)) for p in probs]
    operands = [N.pack_bf16_vec8(scaled[8 * step : 8 * step + 8]) for step in range(2)]
    for step in range(2):
        _stage_v(a, c, lds_wave, base, ok, k, I.add(I.mul(half, I.ci32(2)), I.ci32(step)))
        acc = _pv_step(c, lds_wave, operands[step], acc)
    return [m_new, total, poisoned, *acc]


def _merge_waves(spec, a, c: I.LaneContext, lds, stats, state) -> None:
    """Combine the 4 waves' (m, l, O) and store the direct output or the split partial. A
    poisoned q head's ``m`` goes to LDS as NaN (the epilogue's flag)."""
    m, l_lane, poisoned, acc = state[0], state[1], state[2], state[3:]
    total = I.fadd(l_lane, I.lane_xor_f32(l_lane, c.lane, 16))
    total = I.fadd(total, I.lane_xor_f32(total, c.lane, 32))
    poisoned = I.fmax(poisoned, I.lane_xor_f32(poisoned, c.lane, 16))
    poisoned = I.fmax(poisoned, I.lane_xor_f32(poisoned, c.lane, 32))
    m = I.select(I.fgt(poisoned, I.cf32(0.0)), I.cf32(float("nan")), m)
    lds_wave = I.gep(lds, I.mul(c.wave, I.ci32(WAVE_LDS)))
    with I.when(I.eq(c.grp, I.ci32(0))):
        at = I.mul(I.add(I.mul(c.wave, I.ci32(16)), c.col), I.ci32(8))
        I.store(I.from_elements(I.vec(2, I.f32()), [m, total]), stats, at, align=8)
    for dt in range(8):
        for v in range(4):
            qh = I.add(I.mul(c.grp, I.ci32(4)), I.ci32(v))
            at = I.mul(I.add(I.mul(qh, I.ci32(128)), I.add(I.ci32(16 * dt), c.col)), I.ci32(4))
            I.store(I.extract(acc[dt], v), lds_wave, at, align=4)
    I.barrier()
    qhead, block = I.lshr(c.lane, I.ci32(2)), I.band(c.lane, I.ci32(3))
    with I.when(I.land(I.eq(c.wave, I.ci32(0)), I.lt(qhead, I.ci32(spec.group)))):
        _epilogue(spec, a, c, lds, stats, qhead, block)


def _epilogue(spec, a, c: I.LaneContext, lds, stats, qhead, block) -> None:
    ms, ls = [], []
    poisoned = None
    for w in range(WAVES):
        pair = I.load(I.vec(2, I.f32()), stats, I.mul(I.add(I.ci32(16 * w), qhead), I.ci32(8)),
                      align=8)
        ms.append(I.extract(pair, 0))
        ls.append(I.extract(pair, 1))
        nan_m = I.is_nan(ms[-1])
        poisoned = nan_m if poisoned is None else I.lor(poisoned, nan_m)
    top = I.cf32(I.NEG_INF)
    for m, sm in zip(ms, ls, strict=True):
        top = I.select(I.fgt(sm, I.cf32(0.0)), I.fmax(top, m), top)
    weights = [I.select(I.fgt(sm, I.cf32(0.0)), I.exp2(I.fsub(m, top)), I.cf32(0.0))
               for m, sm in zip(ms, ls, strict=True)]
    total = I.cf32(0.0)
    for wgt, sm in zip(weights, ls, strict=True):
        total = I.fadd(total, I.fmul(wgt, sm))
    nonzero = I.fgt(total, I.cf32(0.0))
    safe = I.select(nonzero, total, I.cf32(1.0))
    values = []
    for chunk in range(8):
        rocdl.sched_barrier(0)  # one 4-dim chunk of the 4 waves' O at a time (register pressure)
        o = [I.cf32(0.0)] * 4
        for w in range(WAVES):
            dim = I.add(I.mul(block, I.ci32(32)), I.ci32(4 * chunk))
            elem = I.add(I.mul(qhead, I.ci32(128)), dim)
            at = I.add(I.ci32(w * WAVE_LDS), I.mul(elem, I.ci32(4)))
            four = I.load(I.vec(4, I.f32()), lds, at, align=16)
            o = [I.fadd(o[e], I.fmul(weights[w], I.extract(four, e))) for e in range(4)]
        for e in range(4):
            restored = I.fmul(I.fdiv(o[e], safe), I.cf32(1.0 / P_PRESCALE))
            value = I.select(nonzero, restored, I.cf32(0.0))
            values.append(I.select(poisoned, I.cf32(float("nan")), value))
    row_head = I.add(I.mul(c.row, I.ci32(spec.group)), qhead)
    if spec.path == "direct":
        store_output_block(spec.output, a.out, a.out_aux, row_head, block, values)
        return
    top = I.select(poisoned, I.cf32(float("nan")), I.select(nonzero, top, I.cf32(I.NEG_INF)))
    _store_partial(spec, a, c, qhead, block, values, top, total)


def _store_partial(spec, a, c: I.LaneContext, qhead, block, values, top, total) -> None:
    slot = I.add(I.mul(I.add(I.mul(I.zext64(c.row), I.zext64(a.num_partitions)), I.zext64(c.part)),
                       I.ci64(spec.group)), I.zext64(qhead))
    store_output_block("bf16", a.out, None, I.trunc32(slot), block, values)
    with I.when(I.eq(block, I.ci32(0))):
        I.store(I.from_elements(I.vec(2, I.f32()), [top, total]), I.global_ptr(a.out_aux),
                I.mul(slot, I.ci64(8)), align=8)


def _body(spec: Specialization, a) -> None:
    lds = I.lds_alloc(WAVES * WAVE_LDS + STATS_LDS)
    stats = I.gep(lds, I.ci32(WAVES * WAVE_LDS))
    c = _setup(spec, a)
    q = _query(spec, a, c)
    lds_wave = I.gep(lds, I.mul(c.wave, I.ci32(WAVE_LDS)))
    mine = I.sub(c.last, I.add(c.first, c.wave))
    count = I.select(I.gt(mine, I.ci32(0)), I.ceil_div(mine, I.ci32(WAVES)), I.ci32(0))

    def page(i, state):
        k = I.add(I.add(c.first, c.wave), I.mul(I.lshr(i, I.ci32(1)), I.ci32(WAVES)))
        return _page_update(spec, a, c, q, lds_wave, k, I.band(i, I.ci32(1)), state)

    init = [I.cf32(I.NEG_INF), I.cf32(0.0), I.cf32(0.0)] + [I.zeros_f32x4() for _ in range(8)]
    state = I.loop(I.ci32(0), I.mul(count, I.ci32(2)), init, page)
    _merge_waves(spec, a, c, lds, stats, state)


def build(spec: Specialization):
    """The ``@flyc.jit`` launcher of one sparse_attention specialization."""
    assert spec.op == "sparse_attention"
    return jit_launcher(spec.symbol, ARGS, functools.partial(_body, spec), THREADS)


# --- lowering (available / covers / lower: jax_mxfp4.lowering.KernelModule) -----------------


def _shape(call) -> tuple[int, int, int, int]:
    """(rows R = T * Hkv, q heads per kv head G, pages per row n, kv heads Hkv)."""
    q_aval, k_aval, _, pages_aval, _ = call.avals_in
    kv_heads = k_aval.shape[1]
    return (q_aval.shape[0] * kv_heads, q_aval.shape[1] // kv_heads, pages_aval.shape[-1],
            kv_heads)


def _specs(call) -> tuple[Specialization, Specialization | None, int]:
    """(attention kernel, merge kernel or ``None``, partitions NP) of a call: the direct
    kernel when ``plans.attention_splits`` gives one partition, else the split kernel (bf16
    partials whatever the output) and the merge."""
    _, group, n, _ = _shape(call)
    q, output = _launch.q_dtype(call.avals_in[0]), call.params["output"]
    partitions = attention_splits(n)
    if partitions == 1:
        return (Specialization("sparse_attention", q=q, group=group, output=output,
                               path="direct"), None, 1)
    return (Specialization("sparse_attention", q=q, group=group, output="bf16", path="split"),
            Specialization("attention_merge", group=group, output=output), partitions)


def available(target, config) -> str | None:
    return _launch.available(target, config)


def covers(call) -> str | None:
    group = _shape(call)[1]
    if group not in _launch.POWERS:
        return f"the kernels are built for {_launch.POWERS} q heads per kv head, not {group}"
    attention, merge, _ = _specs(call)
    return (_launch.code_object_problem(attention, call.target.arch)
            or (merge and _launch.code_object_problem(merge, call.target.arch)))


def kernel_name(call) -> str:
    attention, merge, partitions = _specs(call)
    if merge is None:
        return attention.symbol
    return f"{attention.symbol}[{partitions} partitions]+{merge.symbol}"


def lower(ctx, call, q, k_pool, v_pool, pages, context):
    """The direct kernel, or the split kernel writing its partials as the results of its
    custom call (``bf16[R, NP, G, 128]`` and ``f32[R, NP, G, 2]``: XLA allocates them like
    any intermediate) and a second call (``attention_merge``) reducing them."""
    rows, group, n, kv_heads = _shape(call)
    attention, merge, partitions = _specs(call)
    co = code_object(attention, arch=call.target.arch)
    inputs = ("q", "k_pool", "v_pool", "page_table", "context_lens")
    operands = [q, k_pool, v_pool, pages, context]
    scalars = {"num_rows": rows, "num_kv_heads": kv_heads, "num_pages": call.avals_in[1].shape[0],
               "pages_per_row": n, "num_partitions": partitions,
               "sm_scale": call.params["sm_scale"]}
    grid = _launch.empty_or(co.grid(num_rows=rows, num_partitions=partitions), rows)
    if merge is None:
        mxfp8 = call.params["output"] == "mxfp8"
        launch = _launch.launch(co, grid, buffers=(*inputs, "out", "out_aux")[:6 + mxfp8],
                                scalars=scalars, nulls=() if mxfp8 else ("out_aux",))
        return launcher.emit(ctx, launch, operands, call.avals_in, call.avals_out)
    part_avals = [ShapedArray((rows, partitions, group, 128), jnp.bfloat16),
                  ShapedArray((rows, partitions, group, 2), jnp.float32)]
    launch = _launch.launch(co, grid, buffers=(*inputs, "out", "out_aux"), scalars=scalars)
    partials = launcher.emit(ctx, launch, operands, call.avals_in, part_avals)
    merge_co = code_object(merge, arch=call.target.arch)
    mxfp8 = call.params["output"] == "mxfp8"
    merged = _launch.launch(
        merge_co, _launch.empty_or(merge_co.grid(num_rows=rows), rows),
        buffers=("partial_out", "partial_stats", "out", "out_aux")[:3 + mxfp8],
        scalars={"num_rows": rows, "num_partitions": partitions},
        nulls=() if mxfp8 else ("out_aux",))
    return launcher.emit(ctx, merged, partials, part_avals, call.avals_out)
