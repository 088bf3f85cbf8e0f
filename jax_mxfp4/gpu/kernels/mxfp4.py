"""Triton device functions shared by the kernels: MXFP4 page decoding and exact scaling.

Hopper has no fp4 tensor cores, so a page's e2m1 codes are decoded in registers into e4m3
bytes with one shift-and-mask per nibble (:func:`nibble_e4m3`): ``(code & 7) << 2 | (code & 8)
<< 4`` is exactly ``e2m1(code) * 2**-6`` as e4m3 (code 1: the e4m3 subnormal ``2**-7``). Those
bytes feed the tensor cores directly (``tl.dot`` on e4m3) or after the hardware e4m3 -> fp16
conversion (fp16 dots, exact products and fp32 accumulation). Each 32-element scale group is
one ``K = 32`` dot; the group's e8m0 byte is applied to the dot's result relative to the
token's largest byte (``2**(byte - max)``, at most 1, so nothing overflows), and the token's
own ``2**(max - 127 + 6)`` is applied once per logit, as the reference does. Prefill tiles
fold the groups' scales into 16-bit keys instead (:func:`folded_page_logits`): one ``K = 128``
dot per page and one exponent for the page, applied to each row's maximum.

Where no tensor-core operand is built (V pages before their bf16 widening, one-row index
scoring on the CUDA cores), 32-bit code words are decoded two elements at a time into fp16
pairs and widened to fp32 (:func:`words_fp32`). The dots take e4m3 bytes instead: the same
fp16 decode feeding them moves 16-bit elements through shared memory on the way to the dot's
operand layout (measured slower: bench/RESULTS.md).

Page layout (SPEC §2.1): token ``t``'s 64 data bytes at ``t * 64`` (element ``2i`` in the low
nibble of byte ``i``), its 4 scale bytes at ``8192 + t * 4``.
"""

from __future__ import annotations

import triton
import triton.language as tl

from jax_mxfp4 import formats

NAN_BYTE = tl.constexpr(formats.E8M0_NAN)  # e8m0 NaN: a token with it in any group has NaN keys
PROPAGATE_NAN = tl.constexpr(tl.PropagateNan.ALL)
PAGE_BYTES = tl.constexpr(formats.PAGE_BYTES)
SCALE_OFFSET = tl.constexpr(formats.PAGE_SCALE_OFFSET)
FOLD_SHIFT = tl.constexpr(15)  # folded keys: a group at the reference byte is scaled by 2**15
FOLD_BAND = tl.constexpr(32)  # binades of group scale below the reference byte in one dot
BAND_STEP = tl.constexpr(2.0**-32)  # 2**-FOLD_BAND


@triton.jit
def pow2(e):
    """fp32 ``2**e`` for int32 ``e`` (0 below 2**-126, +inf above 2**127)."""
    bits = (tl.minimum(tl.maximum(e + 127, 0), 255) << 23).to(tl.int32)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def mul_pow2(x, e):
    """``x * 2**e`` in two normal steps (exact whenever the result is a normal fp32)."""
    e1 = tl.minimum(tl.maximum(e, -126), 127)
    e2 = tl.minimum(tl.maximum(e - e1, -126), 127)
    return x * pow2(e1) * pow2(e2)


@triton.jit
def nibble_e4m3(codes):
    """e4m3 bits (uint8) of ``e2m1(code) * 2**-6`` for the low 4 bits of each of ``codes``."""
    return ((codes & 7) << 2) | ((codes & 8) << 4)


@triton.jit
def e2m1_fp8(page_ptr, tok, first_byte, NBYTES: tl.constexpr):
    """e4m3 values ``e2m1 * 2**-6`` of the elements in bytes ``first_byte ..
    first_byte + NBYTES - 1`` of the tokens ``tok`` (int32 [N]) of one page: ``float8e4nv [N,
    2 * NBYTES]`` in element order."""
    i = tl.arange(0, NBYTES)
    raw = tl.load(page_ptr + tok[:, None] * 64 + first_byte + i[None, :])  # uint8 [N, NBYTES]
    pairs = tl.join(nibble_e4m3(raw), nibble_e4m3(raw >> 4))  # [N, NBYTES, 2]: 2i + parity
    codes = tl.reshape(pairs, (tok.shape[0], 2 * NBYTES))
    return codes.to(tl.float8e4nv, bitcast=True)


@triton.jit
def fp32_of_fp16_pairs(pairs):
    """The two fp16 halves of each uint32 of ``pairs`` ``[...]`` as fp32 ``[..., 2]`` (low
    half first)."""
    halves = tl.join(pairs & 0xFFFF, pairs >> 16)
    return halves.to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def page_words(page_ptr):
    """The code words of a page's 128 tokens: ``uint32 [128, 16]``, 8 elements each."""
    tok = tl.arange(0, 128)
    return tl.load(page_ptr.to(tl.pointer_type(tl.uint32)) + tok[:, None] * 16
                   + tl.arange(0, 16)[None, :])


@triton.jit
def words_fp32(words):
    """The 8 elements of each code word of ``words`` (uint32 ``[N, W]``; element ``e`` at
    bits ``4e``) as fp32 ``e2m1 * 2**-14``: ``[N, W, 8]`` in element order, exact.

    Two elements at a time, with no per-byte work: one shift left by ``9 - 4k`` puts the
    magnitudes of elements ``k`` and ``k + 4`` at bits 9..11 and 25..27 of an fp16 pair
    (exponent field 0..3, mantissa bit 9: ``e2m1 * 2**-14``; code 1 is the fp16 subnormal
    ``2**-15``), one shift by ``12 - 4k`` their signs at bits 15 and 31; the hardware widens
    the halves.
    """
    o0 = ((words << 9) & 0x0E000E00) | ((words << 12) & 0x80008000)
    o1 = ((words << 5) & 0x0E000E00) | ((words << 8) & 0x80008000)
    o2 = ((words << 1) & 0x0E000E00) | ((words << 4) & 0x80008000)
    o3 = ((words >> 3) & 0x0E000E00) | (words & 0x80008000)
    # tl.join stacks on a new last axis: [N, W, 2 (k // 2), 2 (k % 2), 2 (element k, k + 4)]
    values = fp32_of_fp16_pairs(tl.join(tl.join(o0, o2), tl.join(o1, o3)))
    return tl.reshape(tl.permute(values, (0, 1, 4, 2, 3)), (words.shape[0], words.shape[1], 8))


@triton.jit
def row_page_logits(q, page_ptr):
    """Relative logits of one query row over every token of a page, on the CUDA cores (a
    single row wastes 15/16 of a tensor-core tile): ``(dots f32 [128], exponent int32
    [128])`` as :func:`page_logits`. ``q``: the row's values ``f32 [16, 8]`` (element
    ``8w + k`` at ``[w, k]``), e4m3- or bf16-exact, so every product is exact.

    Words are decoded by :func:`words_fp32`. The scale bytes are loaded after the codes'
    arithmetic: loaded first or beside the codes, Triton converted their layout between the
    two loads (serializing them) or spent more instructions (sm_90 SASS counts).
    """
    tok = tl.arange(0, 128)
    per_word = tl.sum(words_fp32(page_words(page_ptr)) * q[None, :, :], axis=2)  # [128, 16]
    per_group = tl.sum(tl.reshape(per_word, (128, 4, 4)), axis=2)  # [128, 4]
    scales = tl.load(page_ptr + SCALE_OFFSET + tok[:, None] * 4
                     + tl.arange(0, 4)[None, :]).to(tl.int32)
    smax = tl.max(scales, axis=1)
    # e2m1 * 2**-14 here: 8 more than the e4m3 encoding's 2**-6 that the exponent assumes.
    dots = tl.sum(per_group * pow2(scales - smax[:, None] + 8), axis=1)
    return tl.where(smax == NAN_BYTE, float("nan"), dots), smax - 127 + 6


@triton.jit
def token_scales(page_ptr, tok):
    """The 4 scale bytes of each token as int32 ``[N]`` each, and their maximum."""
    base = page_ptr + SCALE_OFFSET + tok * 4
    s0 = tl.load(base).to(tl.int32)
    s1 = tl.load(base + 1).to(tl.int32)
    s2 = tl.load(base + 2).to(tl.int32)
    s3 = tl.load(base + 3).to(tl.int32)
    smax = tl.maximum(tl.maximum(s0, s1), tl.maximum(s2, s3))
    return s0, s1, s2, s3, smax


@triton.jit
def group_dot(q_g, page_ptr, tok, g, s_g, smax, USE_FP8: tl.constexpr):
    """``(q_g . K_g^T) * 2**(s_g - smax)``: one scale group's logits, ``f32 [M, N]``.

    ``q_g``: the group's query values ``[M, 32]`` (e4m3 when ``USE_FP8``, else fp16/bf16).
    """
    k8 = e2m1_fp8(page_ptr, tok, g * 16, 16)
    if USE_FP8:
        dots = tl.dot(q_g, tl.trans(k8))
    else:
        dots = tl.dot(q_g, tl.trans(k8.to(q_g.dtype)))
    return dots * pow2(s_g - smax)[None, :]


@triton.jit
def page_logits(q0, q1, q2, q3, page_ptr, USE_FP8: tl.constexpr):
    """Relative logits of every token of a page and the token exponents.

    Returns ``(dots f32 [M, 128], exponent int32 [128])`` with the true ``q . k`` equal to
    ``dots * 2**exponent`` (exponent = max scale byte - 127 + 6); NaN for a token with a scale
    byte 255 (its keys are NaN, SPEC §1.3, §15.18).
    """
    tok = tl.arange(0, 128)
    s0, s1, s2, s3, smax = token_scales(page_ptr, tok)
    dots = group_dot(q0, page_ptr, tok, 0, s0, smax, USE_FP8)
    dots += group_dot(q1, page_ptr, tok, 1, s1, smax, USE_FP8)
    dots += group_dot(q2, page_ptr, tok, 2, s2, smax, USE_FP8)
    dots += group_dot(q3, page_ptr, tok, 3, s3, smax, USE_FP8)
    return tl.where((smax == NAN_BYTE)[None, :], float("nan"), dots), smax - 127 + 6


@triton.jit
def _band_keys(page_ptr, depth, band, DTYPE: tl.constexpr):
    """A page's keys in exponent band ``band`` as one dot operand ``DTYPE [128, 128]``: each
    group's e4m3 codes times ``2**(FOLD_SHIFT - depth + band * FOLD_BAND)`` (``depth``: int32
    [128, 4], each group's scale byte below the page's reference byte) where that exponent lies in
    ``(FOLD_SHIFT - FOLD_BAND, FOLD_SHIFT]``, zeros elsewhere."""
    codes = e2m1_fp8(page_ptr, tl.arange(0, 128), 0, 64).to(DTYPE)
    shift = FOLD_SHIFT - depth + band * FOLD_BAND
    inside = (shift <= FOLD_SHIFT) & (shift > FOLD_SHIFT - FOLD_BAND)
    factor = tl.where(inside, pow2(shift), 0.0).to(DTYPE)
    return tl.reshape(tl.reshape(codes, (128, 4, 32)) * factor[:, :, None], (128, 128))


@triton.jit
def folded_page_logits(q, page_ptr, live):
    """:func:`page_logits` with the scale groups folded into the keys: one ``K = 128`` dot
    instead of four ``K = 32`` dots and four rescaled results, and one exponent for the page.

    ``q``: the query tile ``[M, 128]`` in fp16 (e4m3-exact values) or bf16; ``live``: bool
    [128], the tokens any row may see. The reference is the largest scale byte of the live
    tokens. A group ``depth`` binades below it is scaled by ``2**(FOLD_SHIFT - depth)`` into
    the 16-bit operand: exact for depths 0..31 (fp16: from ``e2m1 * 2**-6 * 2**-16 >=
    2**-23``, a subnormal, up to ``6 * 2**9``). Deeper groups (all-zero groups, byte 0, or
    tokens far below the page's largest) take one more dot per 32 binades, deepest first, the
    running result scaled by ``2**-32`` between them (Horner, in place: no second
    accumulator). A page whose live groups all lie within 32 binades, the common case, takes
    one dot. Tokens that are not live may get any finite keys (zeros above the reference):
    their logits must be masked. A live token more than ~100 binades below the page's largest
    loses low bits to fp32 subnormals: far below the 2 ulp of the block's magnitude (SPEC
    §10) that the largest token sets.

    Returns ``(dots f32 [M, 128], exponent int32)`` with ``q . k = dots * 2**exponent`` for
    every live token, so a row's maximum can be taken first and scaled once; the dots of a
    token with a scale byte 255 (NaN keys) are NaN.
    """
    tok = tl.arange(0, 128)
    scales = tl.load(page_ptr + SCALE_OFFSET + tok[:, None] * 4
                     + tl.arange(0, 4)[None, :]).to(tl.int32)
    nan_keys = tl.max(scales, axis=1) == NAN_BYTE
    live = live & ~nan_keys  # NaN tokens get NaN dots, not a scale: the rest stay exact
    ref = tl.max(tl.where(live, tl.max(scales, axis=1), 0), axis=0)
    depth = ref - scales  # [128, 4]; negative (zero keys) only for tokens that are not live
    deepest = tl.max(tl.max(tl.where(live[:, None], depth, 0), axis=1), axis=0)
    bands = deepest // FOLD_BAND + 1
    dots = tl.zeros((q.shape[0], 128), tl.float32)
    for i in range(bands):
        if i > 0:
            dots = dots * BAND_STEP
        dots = tl.dot(q, tl.trans(_band_keys(page_ptr, depth, bands - 1 - i, q.dtype)), dots)
    dots = tl.where(nan_keys[None, :], float("nan"), dots)  # elementwise: no extra reduction
    return dots, ref - 127 + 6 - FOLD_SHIFT


@triton.jit
def load_page(page_ptr):
    """A page's raw bytes: code words ``uint32 [128, 16]`` (:func:`page_words`) and scale
    bytes ``uint8 [128, 4]``."""
    tok = tl.arange(0, 128)
    words = page_words(page_ptr)
    scales = tl.load(page_ptr + SCALE_OFFSET + tok[:, None] * 4 + tl.arange(0, 4)[None, :])
    return words, scales


@triton.jit
def page_values(words, scales, live, DTYPE: tl.constexpr):
    """Exactly dequantized values ``DTYPE [128, 128]`` (bf16: exact) of a page loaded by
    :func:`load_page`: a group with scale byte 255 is NaN, elements past the fp32 range are
    +-inf (SPEC §15.18); tokens where ``live`` (bool [128]) is false are zeros (so garbage, NaN
    scales included, cannot leak)."""
    x = tl.reshape(words_fp32(words), (128, 4, 32)) * 16384.0  # e2m1, exact
    x = x * pow2(scales.to(tl.int32) - 127)[:, :, None]
    x = tl.where((scales == NAN_BYTE)[:, :, None], float("nan"), x)
    x = tl.where(live[:, None, None], x, 0.0)
    return tl.reshape(x, (128, 128)).to(DTYPE)


@triton.jit
def round_e4m3(x):
    """Saturating round-to-nearest-even of fp32 ``x`` to e4m3 (SPEC §15.2): the hardware
    conversion (``cvt.rn.satfinite`` on sm_90) after the clamp. NaN stays NaN (SPEC §15.18):
    the clamp propagates it (PTX's plain ``max`` would return -448 for a NaN)."""
    clamped = tl.minimum(tl.maximum(x, -448.0, propagate_nan=PROPAGATE_NAN), 448.0,
                         propagate_nan=PROPAGATE_NAN)
    return clamped.to(tl.float8e4nv, fp_downcast_rounding="rtne")
