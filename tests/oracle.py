"""An independent float64 numpy oracle for every jax_mxfp4 operation.

Written from docs/spec.md alone; it never imports jax_mxfp4 (nor jax). Values are computed in
float64 (exact for every product the operations form) and rounded to the output format at the
end with the rounding helpers below, which implement round-to-nearest-even from first
principles.
``ml_dtypes`` is used only to hold bfloat16 / float8_e4m3fn arrays and to decode them (the
decoding of a value already on the grid is exact).

Conventions: arrays in, numpy arrays out. ``D = 128`` elements per token row, 32 per scale block.
"""

from __future__ import annotations

from typing import NamedTuple

import ml_dtypes
import numpy as np

BF16 = ml_dtypes.bfloat16
E4M3 = ml_dtypes.float8_e4m3fn

D = 128
BLOCK = 32
PAGE_TOKENS = 128
PAGE_BYTES = 8704
SCALE_OFFSET = 8192
E4M3_MAX = 448.0
E4M3_NAN_BYTE = 0x7F  # float8_e4m3fn has no Inf; 0x7F and 0xFF are NaN
FLT_MIN = 2.0**-126
LOG2E_LITERAL = 1.4426950409  # SPEC §0: the truncated literal the scorers use

# SPEC §1.1: e2m1 code -> value; bit 3 is the sign (code 8 is -0).
E2M1_MAGNITUDES = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
E2M1_TABLE = np.concatenate([E2M1_MAGNITUDES, -E2M1_MAGNITUDES])


# --------------------------------------------------------------------------------------------
# Rounding from first principles
# --------------------------------------------------------------------------------------------


def rne(x, mant_bits: int, min_exp: int) -> np.ndarray:
    """Round float64 ``x`` to a binary format with ``mant_bits`` stored mantissa bits and
    smallest normal exponent ``min_exp`` (subnormals below it), nearest, ties to even.
    No overflow handling: callers clamp or map to inf themselves."""
    x = np.array(x, dtype=np.float64, copy=True)
    nz = np.isfinite(x) & (x != 0)
    v = x[nz]
    _, e = np.frexp(v)  # |v| = m * 2**e, m in [0.5, 1)
    quantum = np.ldexp(1.0, np.maximum(e - 1, min_exp) - mant_bits)
    x[nz] = np.round(v / quantum) * quantum  # v / quantum is exact; np.round is half-to-even
    return x


def round_bf16(x) -> np.ndarray:
    """float64 values of ``x`` rounded to bfloat16 (RNE; overflow -> inf)."""
    r = rne(x, 7, -126)
    big = np.isfinite(r) & (np.abs(r) >= 2.0**128)
    r[big] = np.copysign(np.inf, r[big])
    return r


def round_e4m3_sat(x) -> np.ndarray:
    """float64 values of the saturating e4m3 RNE of ``x``: ``RNE(clamp(x, -448, 448))``."""
    return rne(np.clip(np.asarray(x, np.float64), -E4M3_MAX, E4M3_MAX), 3, -6)


def as_f64(x) -> np.ndarray:
    return np.asarray(x).astype(np.float64)


def to_bf16(x) -> np.ndarray:
    """bfloat16 array of the RNE rounding of ``x`` (float64 values already on the grid
    convert exactly)."""
    return round_bf16(as_f64(x)).astype(BF16)


def to_e4m3(x) -> np.ndarray:
    return round_e4m3_sat(as_f64(x)).astype(E4M3)


def f32_bits(x) -> np.ndarray:
    return np.asarray(x, np.float32).view(np.uint32)


# --------------------------------------------------------------------------------------------
# Codecs (SPEC §1)
# --------------------------------------------------------------------------------------------


def decode_e2m1(codes) -> np.ndarray:
    return E2M1_TABLE[np.asarray(codes).astype(np.int64) & 15]


def decode_e8m0(scale_bytes) -> np.ndarray:
    """2**(byte - 127) for bytes 0..254 (byte 0 is 2**-127), NaN for 255 (SPEC §1.3)."""
    b = np.asarray(scale_bytes).astype(np.int64)
    return np.where(b == 255, np.nan, np.ldexp(1.0, np.minimum(b, 254) - 127))


def unpack(packed) -> np.ndarray:
    """uint8[..., n] -> codes uint8[..., 2n], element 2i in the low nibble of byte i."""
    p = np.asarray(packed, np.uint8)
    codes = np.empty((*p.shape[:-1], 2 * p.shape[-1]), np.uint8)
    codes[..., 0::2] = p & 0x0F
    codes[..., 1::2] = p >> 4
    return codes


def pack(codes) -> np.ndarray:
    c = np.asarray(codes, np.uint8)
    return (c[..., 0::2] | (c[..., 1::2] << 4)).astype(np.uint8)


def dequant_mxfp4(packed, scales) -> np.ndarray:
    """float64 ``[..., 2n]`` values of MXFP4 ``(packed [..., n], scales [..., n // 16])``."""
    codes = unpack(packed)
    vals = decode_e2m1(codes)
    s = decode_e8m0(scales)
    vals = vals.reshape(*vals.shape[:-1], -1, BLOCK) * s[..., None]
    return vals.reshape(codes.shape)


def dequant_mxfp4_as(packed, scales, dtype) -> np.ndarray:
    """The dequantized values in ``dtype`` (float32 or bfloat16); exact (values have at most
    two significant bits), overflow to inf."""
    v = dequant_mxfp4(packed, scales)
    if dtype == np.float32:
        with np.errstate(over="ignore"):
            return v.astype(np.float32)
    return round_bf16(v).astype(BF16)


def e2m1_rne_code(v) -> np.ndarray:
    """Magnitude code 0..7 of the e2m1 value nearest to non-negative ``v``; ties to the even
    code; values past 6 saturate to code 7 (6.0)."""
    v = np.asarray(v, np.float64)
    d = np.abs(v[..., None] - E2M1_MAGNITUDES)
    dmin = d.min(axis=-1, keepdims=True)
    cand = d == dmin
    even = cand & (np.arange(8) % 2 == 0)
    use_even = even.any(axis=-1, keepdims=True)
    chosen = np.where(use_even, even, cand)
    return np.argmax(chosen, axis=-1).astype(np.uint8)


def bf16_values(x) -> np.ndarray:
    """float64 values of ``x`` (any float dtype) rounded to bfloat16 (SPEC §1.4)."""
    return round_bf16(as_f64(x))


def mxfp4_scale_bytes(amax, round_mode: str = "up") -> np.ndarray:
    """e8m0 scale byte per block from the (bf16-valued) block amax (SPEC §1.4)."""
    amax = np.asarray(amax, np.float64)
    if round_mode == "up":
        r = amax.astype(np.float32) / np.float32(6.0)  # fp32 division, correctly rounded
        bits = f32_bits(r)
        exp_field = ((bits >> 23) & 0xFF).astype(np.int64)
        mant = bits & 0x7FFFFF
        byte = exp_field + ((mant != 0) & (exp_field < 255))
    elif round_mode == "even":
        bits = f32_bits(amax.astype(np.float32)).astype(np.uint64)
        rounded = ((bits + 0x200000) & 0xFF800000).astype(np.int64)
        # floor(log2(rounded value)) - 2, biased: the rounded value is 0 or a power of two
        # 2**(field - 127) (field 255 stands for 2**128).
        byte = np.where(rounded == 0, 0, np.maximum((rounded >> 23) - 2, 0))
    elif round_mode == "down":
        _, e = np.frexp(amax)  # floor(log2(amax)) = e - 1 for amax > 0
        byte = np.where(amax == 0, 0, np.maximum((e - 1) - 2 + 127, 0))
    else:
        raise ValueError(round_mode)
    # SPEC §1.9: a block whose amax is Inf or NaN gets byte 255 (NaN) in every mode.
    return np.where(np.isfinite(amax), np.clip(byte, 0, 254), 255).astype(np.uint8)


def quantize_mxfp4(x, round_mode: str = "up") -> tuple[np.ndarray, np.ndarray]:
    """MXFP4 of ``x[..., D]``: ``(packed uint8[..., D//2], scales uint8[..., D//32])``."""
    xv = bf16_values(x)
    blocks = xv.reshape(*xv.shape[:-1], -1, BLOCK)
    amax = np.max(np.abs(blocks), axis=-1)
    scales = mxfp4_scale_bytes(amax, round_mode)
    v = np.abs(blocks) / decode_e8m0(scales)[..., None]  # division by a power of two: exact
    sign = np.signbit(blocks).astype(np.uint8) << 3
    codes = (e2m1_rne_code(v) | sign).reshape(xv.shape)
    return pack(codes), scales


def mxfp8_scale_bytes(amax) -> np.ndarray:
    """``clamp(ceil(log2(amax / 448)) + 127, 0, 254)`` in float64; amax 0 -> 0 (SPEC §1.6);
    an Inf or NaN amax -> 255 (SPEC §1.9)."""
    amax = np.asarray(amax, np.float64)
    finite = np.isfinite(amax)
    with np.errstate(divide="ignore", invalid="ignore"):
        sb = np.ceil(np.log2(np.where(finite, amax, 1.0) / E4M3_MAX)) + 127
    sb = np.where(amax == 0, 0, sb)
    return np.where(finite, np.clip(sb, 0, 254), 255).astype(np.uint8)


def quantize_mxfp8(x) -> tuple[np.ndarray, np.ndarray]:
    """MXFP8 of ``x[..., K]`` (rounded to bf16 first): ``(e4m3[..., K], uint8[..., K//32])``.
    Every value of a block with scale byte 255 (an Inf or NaN in the block) is the e4m3 NaN
    0x7F (SPEC §1.6, §1.9)."""
    xv = bf16_values(x)
    blocks = xv.reshape(*xv.shape[:-1], -1, BLOCK)
    scales = mxfp8_scale_bytes(np.max(np.abs(blocks), axis=-1))
    non_finite = (scales == 255)[..., None]
    with np.errstate(invalid="ignore"):
        scaled = blocks * np.ldexp(1.0, 127 - scales.astype(np.int64))[..., None]
    values = round_e4m3_sat(np.where(non_finite, 0.0, scaled)).astype(E4M3).view(np.uint8)
    values = np.where(non_finite, np.uint8(E4M3_NAN_BYTE), values)
    return values.reshape(xv.shape).view(E4M3), scales


# --------------------------------------------------------------------------------------------
# Pools (SPEC §2.1, §3)
# --------------------------------------------------------------------------------------------


def write_cache(pool, x, slots, round_mode: str = "up") -> np.ndarray:
    """Pool ``uint8[P, (Hkv,) 8704]`` after writing ``x[T, (Hkv,) D]`` at ``slots[T]``."""
    pool = np.array(pool, np.uint8, copy=True)
    x = np.asarray(x)
    slots = np.asarray(slots).astype(np.int64)
    num_pages = pool.shape[0]
    packed, scales = quantize_mxfp4(x, round_mode)
    for n, s in enumerate(slots):
        if s < 0 or s >= num_pages * PAGE_TOKENS:
            continue
        page, off = divmod(int(s), PAGE_TOKENS)
        pool[page, ..., off * 64 : off * 64 + 64] = packed[n]
        pool[page, ..., SCALE_OFFSET + off * 4 : SCALE_OFFSET + off * 4 + 4] = scales[n]
    return pool


def split_pool(pool) -> tuple[np.ndarray, np.ndarray]:
    pool = np.asarray(pool, np.uint8)
    lead = pool.shape[:-1]
    data = pool[..., :SCALE_OFFSET].reshape(*lead, PAGE_TOKENS, 64)
    scales = pool[..., SCALE_OFFSET:].reshape(*lead, PAGE_TOKENS, 4)
    return data, scales


def dequant_pool(pool) -> np.ndarray:
    """float64 ``[P, (Hkv,) 128, D]``."""
    data, scales = split_pool(pool)
    return dequant_mxfp4(data, scales)


# --------------------------------------------------------------------------------------------
# Query rows (SPEC §2.2, §2.5)
# --------------------------------------------------------------------------------------------


def prefill_rows(cu_seqlens_q, prefix_lens, num_rows: int) -> tuple[np.ndarray, np.ndarray]:
    cu = np.asarray(cu_seqlens_q).astype(np.int64)
    prefix = np.asarray(prefix_lens).astype(np.int64)
    positions = np.full(num_rows, -1, np.int32)
    requests = np.zeros(num_rows, np.int32)
    for b in range(len(prefix)):
        for n in range(cu[b], min(cu[b + 1], num_rows)):
            positions[n] = prefix[b] + (n - cu[b])
            requests[n] = b
    return positions, requests


def decode_rows(seq_lens, s: int) -> tuple[np.ndarray, np.ndarray]:
    seq = np.asarray(seq_lens).astype(np.int64)
    positions, requests = [], []
    for b, length in enumerate(seq):
        for i in range(s):
            p = length - s + i
            positions.append(p if p >= 0 else -1)
            requests.append(b)
    return np.array(positions, np.int32), np.array(requests, np.int32)


# --------------------------------------------------------------------------------------------
# Index scores (SPEC §4, §4.1, §5, §5.1, §2.3)
# --------------------------------------------------------------------------------------------


def score_scale(sm_scale: float) -> np.float32:
    return np.float32(sm_scale * LOG2E_LITERAL)


def index_query_values(q, q_round: str = "e4m3") -> np.ndarray:
    q = np.asarray(q)
    if q.dtype == E4M3 or q_round == "none":
        return q.astype(np.float64)
    return round_e4m3_sat(q.astype(np.float64))


def index_scores(q, index_pool, block_table, positions, requests, *, num_blocks: int,
                 sm_scale: float, q_round: str = "e4m3") -> np.ndarray:
    """float32 ``[H, T, num_blocks]``."""
    qe = index_query_values(q, q_round)  # [T, H, D]
    num_rows, num_heads, _ = qe.shape
    pages = dequant_pool(index_pool)  # [P, 128, D] float64
    num_pages = pages.shape[0]
    table = np.asarray(block_table).astype(np.int64)
    positions = np.asarray(positions).astype(np.int64)
    requests = np.asarray(requests).astype(np.int64)
    scale = score_scale(sm_scale)
    out = np.full((num_heads, num_rows, num_blocks), -np.inf, np.float32)
    for n in range(num_rows):
        p = positions[n]
        if p < 0:
            continue
        for j in range(num_blocks):
            page = table[requests[n], j]
            live = int(min(max(p - j * PAGE_TOKENS + 1, 0), PAGE_TOKENS))
            if live == 0 or not 0 <= page < num_pages:
                continue
            with np.errstate(over="ignore", invalid="ignore"):
                dots = pages[page, :live] @ qe[n].T  # [live, H], exact products, f64 sums
                logits = dots.astype(np.float32)
                best = logits.max(axis=0) * scale
            # SPEC §9.2: a live logit that is not finite in fp32 (NaN key or query, overflow)
            out[:, n, j] = np.where(np.isfinite(logits).all(axis=0), best, np.nan)
    return out


def index_score_magnitudes(q, index_pool, block_table, positions, requests, *,
                           num_blocks: int, sm_scale: float, q_round: str = "e4m3"):
    """float64 ``[H, T, num_blocks]``: max over live tokens of ``sum_d |Qe[d] K[t, d]|`` times
    the folded scale (0 where no token is live): the unit of :func:`index_score_tolerance`
    (an fp32 sum's error scales with it, not with the possibly cancelled score)."""
    qe = np.abs(index_query_values(q, q_round))
    num_rows, num_heads, _ = qe.shape
    pages = np.abs(dequant_pool(index_pool))
    table = np.asarray(block_table).astype(np.int64)
    out = np.zeros((num_heads, num_rows, num_blocks))
    for n in range(num_rows):
        p = int(positions[n])
        for j in range(num_blocks):
            page = table[int(requests[n]), j]
            live = int(min(max(p - j * PAGE_TOKENS + 1, 0), PAGE_TOKENS))
            if p < 0 or live == 0 or not 0 <= page < pages.shape[0]:
                continue
            out[:, n, j] = (pages[page, :live] @ qe[n].T).max(axis=0)
    return out * float(score_scale(sm_scale))


# --------------------------------------------------------------------------------------------
# Block selection (SPEC §6, §6.1, §2.5)
# --------------------------------------------------------------------------------------------


class Selection(NamedTuple):
    block_ids: np.ndarray  # int32[H, T, topk]
    page_table: np.ndarray  # int32[T, H, topk]
    context_lens: np.ndarray  # int32[T, H]


def score_order_key(score) -> tuple:
    """Sort key of one score, larger is better (SPEC §6): ``+inf > finite > NaN > -inf``,
    ``-0 < +0``."""
    s = float(score)
    if np.isnan(s):
        return (1, 0.0, 0)
    if s == -np.inf:
        return (0, 0.0, 0)
    return (2, s, 0 if np.signbit(s) else 1)


def selection_order(scores_row, valid: int, init_blocks: int, local_blocks: int) -> list:
    """Blocks 0..valid-1 of one (head, row) in selection order (SPEC §6): the forced blocks
    first (init blocks, then the local blocks that are not init blocks, ascending), then the
    others by score, best first, ties to the lower block."""
    init = min(max(init_blocks, 0), valid)
    first_local = max(valid - max(local_blocks, 0), init)
    forced = list(range(init)) + list(range(first_local, valid))
    rest = sorted(range(init, first_local),
                  key=lambda j: (tuple(-k for k in score_order_key(scores_row[j])), j))
    return forced + rest


def select_blocks(scores, block_table, positions, requests, *, topk: int = 16,
                  init_blocks: int = 0, local_blocks: int = 1) -> Selection:
    scores = np.asarray(scores, np.float32)
    num_heads, num_rows, num_blocks = scores.shape
    table = np.asarray(block_table).astype(np.int64)
    ids = np.full((num_heads, num_rows, topk), -1, np.int32)
    page_table = np.zeros((num_rows, num_heads, topk), np.int32)
    ctx = np.zeros((num_rows, num_heads), np.int32)
    for n in range(num_rows):
        p = int(positions[n])
        if p < 0:
            continue
        b = int(requests[n])
        valid = min(p // PAGE_TOKENS + 1, num_blocks)
        self_blk = p // PAGE_TOKENS
        for h in range(num_heads):
            order = selection_order(scores[h, n], valid, init_blocks, local_blocks)
            chosen = order[: min(topk, valid)]
            ids[h, n, : len(chosen)] = chosen
            full = [j for j in chosen if j != self_blk]
            tail = self_blk in chosen
            emit = full + ([self_blk] if tail else [])
            page_table[n, h, : len(emit)] = [table[b, j] for j in emit]
            if tail:
                ctx[n, h] = len(full) * PAGE_TOKENS + (p + 1 - self_blk * PAGE_TOKENS)
            else:
                ctx[n, h] = min(len(chosen) * PAGE_TOKENS, p + 1)
    return Selection(ids, page_table, ctx)


# --------------------------------------------------------------------------------------------
# Sparse attention (SPEC §7, §7.1, §8)
# --------------------------------------------------------------------------------------------


def attention_query_values(q) -> tuple[np.ndarray, np.ndarray]:
    """(q8 float64 [T, Hq, D], q_scale float64 [T, Hq]): the e4m3 query the logits use and the
    factor restoring its scale (1 for an e4m3 query)."""
    q = np.asarray(q)
    if q.dtype == E4M3:
        qv = q.astype(np.float64)
        return qv, np.ones(qv.shape[:-1])
    q32 = q.astype(np.float32)
    amax = np.max(np.abs(q32), axis=-1)
    q_scale = np.maximum(amax / np.float32(E4M3_MAX), np.float32(FLT_MIN)).astype(np.float32)
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        ratio = q32 / q_scale[..., None]  # fp32 division, correctly rounded
    return round_e4m3_sat(ratio.astype(np.float64)), q_scale.astype(np.float64)


def sparse_attention_f64(q, k_pool, v_pool, page_table, context_lens, *,
                         sm_scale: float) -> np.ndarray:
    """float64 ``[T, Hq, D]`` (before the bf16 rounding of the output)."""
    q8, q_scale = attention_query_values(q)
    num_rows, num_q_heads, _ = q8.shape
    kp = dequant_pool(k_pool)  # [P, Hkv, 128, D]
    # V elements are fp32 values (SPEC §9.2): past the fp32 range they are infinite.
    with np.errstate(over="ignore"):
        vp = dequant_pool(v_pool).astype(np.float32).astype(np.float64)
    num_pages, num_kv_heads = kp.shape[:2]
    group = num_q_heads // num_kv_heads
    table = np.asarray(page_table).astype(np.int64)
    ctx_lens = np.asarray(context_lens).astype(np.int64)
    out = np.zeros((num_rows, num_q_heads, D))
    for t in range(num_rows):
        for h in range(num_kv_heads):
            ctx = int(min(ctx_lens[t, h], table.shape[2] * PAGE_TOKENS))
            if ctx <= 0:
                continue
            ks, vs = [], []
            for i in range(0, ctx, PAGE_TOKENS):
                page = table[t, h, i // PAGE_TOKENS]
                if not 0 <= page < num_pages:
                    continue  # out-of-range page id: its tokens are masked
                n = min(PAGE_TOKENS, ctx - i)
                ks.append(kp[page, h, :n])
                vs.append(vp[page, h, :n])
            if not ks:
                continue
            k = np.concatenate(ks)
            v = np.concatenate(vs)
            heads = slice(h * group, (h + 1) * group)
            with np.errstate(over="ignore", invalid="ignore"):
                scaled = (q8[t, heads] @ k.T) * q_scale[t, heads, None]  # [G, n]
                logits = scaled * sm_scale
                # SPEC §9.2: a live logit that is not finite in fp32 -> that q head is NaN
                finite = (np.isfinite(scaled.astype(np.float32))
                          & np.isfinite(logits.astype(np.float32))).all(axis=-1)
                w = np.exp(logits - logits.max(axis=-1, keepdims=True))
                out[t, heads] = (w @ v) / w.sum(axis=-1, keepdims=True)
            out[t, heads] = np.where(finite[:, None], out[t, heads], np.nan)
    return out


def sparse_attention(q, k_pool, v_pool, page_table, context_lens, *, sm_scale: float,
                     output: str = "bf16"):
    out = round_bf16(sparse_attention_f64(q, k_pool, v_pool, page_table, context_lens,
                                          sm_scale=sm_scale))
    if output == "bf16":
        return out.astype(BF16)
    return quantize_mxfp8(out.reshape(out.shape[0], -1))


# --------------------------------------------------------------------------------------------
# Comparison helpers
# --------------------------------------------------------------------------------------------


def bits_equal(a, b) -> np.ndarray:
    """Elementwise bit equality of two float arrays of the same dtype, any NaN equal to any
    NaN."""
    a = np.asarray(a)
    b = np.asarray(b)
    assert a.dtype == b.dtype, (a.dtype, b.dtype)
    width = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize]
    same = a.view(width) == b.view(width)
    an = np.isnan(a.astype(np.float64))
    bn = np.isnan(b.astype(np.float64))
    return np.where(an | bn, an & bn, same)


def ulp_f32(x) -> np.ndarray:
    """Spacing of float32 at |x| (finite x)."""
    return np.spacing(np.abs(np.asarray(x, np.float32))).astype(np.float64)


INDEX_SCORE_BOUND = 2.0**-16
"""An inexact index score's largest error, as a fraction of its magnitude (docs/spec.md §10,
§10.1): a token's 128 products are exact in fp32, so an fp32 accumulation of them, in any
order and rounding to nearest or toward zero, rounds at most 127 times, each by less than
one ulp of a partial sum, which is at most the magnitude (an ulp of a normal number is at
most ``2**-23`` of it); the kernel's final multiply by the score scale and the oracle's
rounding to fp32 add half an ulp each: ``128 * 2**-23``. (Partial sums in fp32's normal
range, as in every case the tests build.)"""


def index_score_tolerance(magnitude) -> np.ndarray:
    """float64: the largest ``|score - oracle|`` a backend's score may have, from its
    :func:`index_score_magnitudes` (:data:`INDEX_SCORE_BOUND` of it, plus two steps of fp32's
    subnormal spacing for scores near zero)."""
    return np.asarray(magnitude, np.float64) * INDEX_SCORE_BOUND + 2.0**-148


def index_score_errors(got, want, magnitude) -> np.ndarray:
    """``|got - want|`` in units of :func:`index_score_tolerance` (finite entries given): at
    most 1 against the oracle, at most 2 between two backends."""
    err = np.abs(np.asarray(got, np.float64) - np.asarray(want, np.float64))
    return err / index_score_tolerance(magnitude)


def attention_close(actual, expected, *, rtol=1e-2, atol=1e-2, max_outside=0.01,
                    max_rel_l2=5e-3) -> tuple[bool, str]:
    """SPEC §10: allclose(rtol=atol=1e-2) with at most 1% of elements outside, and relative
    L2 error <= 5e-3."""
    a = np.asarray(actual).astype(np.float64)
    e = np.asarray(expected).astype(np.float64)
    if not np.all(np.isfinite(a)):
        return False, "non-finite output"
    outside = np.abs(a - e) > atol + rtol * np.abs(e)
    frac = float(outside.mean()) if outside.size else 0.0
    norm = float(np.linalg.norm(e))
    err = float(np.linalg.norm(a - e))
    rel = err / norm if norm > 0 else err
    ok = frac <= max_outside and rel <= max_rel_l2
    return ok, f"outside={frac:.4%} rel_l2={rel:.3e}"
