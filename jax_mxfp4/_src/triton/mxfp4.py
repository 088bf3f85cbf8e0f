"""Triton device functions shared by the kernels: MXFP4 page decoding and exact scaling.

Hopper has no fp4 tensor cores, so a page's e2m1 codes are decoded in registers. Portable
decode (any Triton target, and Triton's interpreter): one shift-and-mask per nibble into e4m3
bytes (:func:`nibble_e4m3`): ``(code & 7) << 2 | (code & 8) << 4`` is exactly ``e2m1(code) *
2**-6`` as e4m3 (code 1: the e4m3 subnormal ``2**-7``), fed to the tensor cores directly
(``tl.dot`` on e4m3) or after the hardware e4m3 -> 16-bit conversion. On CUDA (the kernels'
``PTX`` argument) inline PTX decodes four bytes at a time: fp16 keys (:func:`nibbles_fp16`,
:func:`word_values`) from every byte re-laid at once as ``s000 mmm0`` (three shifts and four
masks per eight elements, then one byte permute per pair: the byte is the high half of the
fp16), scaled bf16 values (:func:`scaled_nibbles_bf16`) with one byte permute, a shift and a
logic op per pair of nibbles and two bf16 multiplies per pair. tests/gpu holds them
bit-exact on the device; tests/test_ptx_decode.py runs the PTX text itself on the CPU.
Each 32-element scale group is one ``K = 32`` dot; the group's e8m0 byte is applied to the
dot's result relative to the token's largest byte (``2**(byte - max)``, at most 1, so
nothing overflows), and the token's own power of two
(:func:`key_exponent`) once per logit, as the reference does. Prefill tiles fold the groups'
scales into 16-bit keys instead (:func:`folded_page_logits`): one ``K = 128`` dot per page and
one exponent for the page, applied to each row's maximum.

A page's loads are issued together before any is used (:func:`page_bytes`: one load of all
code bytes, one 32-bit word of scale bytes per token, for the keys and then the values, and
only then the keys' :func:`split_groups`), because Triton changes each loaded tensor's layout
right after its load, which waits for it, and ptxas issues no later load ahead of it.
One-row index scoring on the CUDA cores of a bf16 query kept as bf16 decodes 32-bit code
words four elements at a time into fp16 halves widened to fp32 (:func:`word_values`); an
e4m3-exact query takes exact integer byte dots instead (``row_dot``).

Page layout (SPEC §2.1): token ``t``'s 64 data bytes at ``t * 64`` (element ``2i`` in the low
nibble of byte ``i``), its 4 scale bytes at ``8192 + t * 4``.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.runtime.jit import constexpr_function

from jax_mxfp4._src.core import formats

# The page layout (``formats``, SPEC §2.1) as the kernels' compile-time constants: every Triton
# and Gluon kernel takes its page geometry from here (a global a kernel reads is a constexpr).
PAGE_TOKENS = tl.constexpr(formats.PAGE_TOKENS)  # tokens per page (128)
HEAD_DIM = tl.constexpr(formats.HEAD_DIM)  # elements per token row (128)
MX_BLOCK = tl.constexpr(formats.MX_BLOCK)  # elements per scale group (32)
TOKEN_GROUPS = tl.constexpr(formats.TOKEN_GROUPS)  # scale groups per token row (4)
TOKEN_DATA_BYTES = tl.constexpr(formats.TOKEN_DATA_BYTES)  # code bytes per token row (64)
TOKEN_SCALE_BYTES = tl.constexpr(formats.TOKEN_SCALE_BYTES)  # scale bytes per token row (4)
PAGE_SCALE_OFFSET = tl.constexpr(formats.PAGE_SCALE_OFFSET)  # the scale bytes' offset (8192)
PAGE_BYTES = tl.constexpr(formats.PAGE_BYTES)  # bytes per page (8704)
GROUP_DATA_BYTES = tl.constexpr(formats.MX_BLOCK // 2)  # code bytes of a token's group (16)
WORD_BYTES = tl.constexpr(4)  # bytes per 32-bit word (code words, a token's scale word)
WORD_ELEMENTS = tl.constexpr(2 * WORD_BYTES)  # e2m1 elements per code word (8)
TOKEN_WORDS = tl.constexpr(TOKEN_DATA_BYTES // WORD_BYTES)  # code words per token row (16)
GROUP_WORDS = tl.constexpr(GROUP_DATA_BYTES // WORD_BYTES)  # code words per group (4)

NAN_BYTE = tl.constexpr(formats.E8M0_NAN)  # e8m0 NaN: a token with it in any group has NaN keys
PROPAGATE_NAN = tl.constexpr(tl.PropagateNan.ALL)
FOLD_SHIFT = tl.constexpr(15)  # folded keys: a group at the reference byte is scaled by 2**15
FOLD_BAND = tl.constexpr(32)  # binades of group scale below the reference byte in one dot
BAND_STEP = tl.constexpr(2.0**-32)  # 2**-FOLD_BAND


@triton.jit
def pow2(e):
    """fp32 ``2**e`` for int32 ``e`` (0 below 2**-126, +inf above 2**127)."""
    bits = (tl.minimum(tl.maximum(e + 127, 0), 255) << 23).to(tl.int32)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def pow2_factors(e):
    """``2**e`` for int32 ``e`` as two normal fp32 factors (``e`` clamped to [-126, 127],
    then the rest): multiplying by both is exact whenever the result is a normal fp32. Take
    them once where many values share an exponent."""
    e1 = tl.minimum(tl.maximum(e, -126), 127)
    return pow2(e1), pow2(tl.minimum(tl.maximum(e - e1, -126), 127))


@triton.jit
def mul_pow2(x, e):
    """``x * 2**e`` in two normal steps (exact whenever the result is a normal fp32)."""
    first, second = pow2_factors(e)
    return x * first * second


@triton.jit
def pow2_to_128(e):
    """:func:`pow2` for int32 ``e <= 128`` (0 below 2**-126): its upper clamp cannot bind
    there, which the compiler cannot know (one integer instruction less)."""
    return ((tl.maximum(e, -127) + 127) << 23).to(tl.float32, bitcast=True)


@triton.jit
def mul_scale_pow2(x, smax, OFFSET: tl.constexpr):
    """:func:`mul_pow2` ``(x, smax + OFFSET)`` for int32 scale bytes ``smax`` in [0, 255] and
    ``-126 <= OFFSET < 0``, NaN where ``smax`` is the e8m0 NaN: the same two factors,
    ``2**min(e, 127)`` and ``2**max(e - 127, 0)``, without the clamps that cannot bind in that
    range, and the NaN keys' rule in the first factor instead of a select per logit."""
    tl.static_assert((OFFSET >= -126) and (OFFSET < 0))
    e = smax + OFFSET
    first = ((tl.minimum(e, 127) + 127) << 23).to(tl.float32, bitcast=True)
    second = (tl.maximum(e, 127) << 23).to(tl.float32, bitcast=True)
    return x * tl.where(smax == NAN_BYTE, float("nan"), first) * second


@triton.jit
def nibble_e4m3(codes):
    """e4m3 bits (uint8) of ``e2m1(code) * 2**-6`` for the low 4 bits of each of ``codes``."""
    return ((codes & 7) << 2) | ((codes & 8) << 4)


@triton.jit
def nibbles_fp8(raw):
    """e4m3 values ``e2m1 * 2**-6`` of the two elements in each byte of ``raw`` (uint8 ``[N,
    B]``, element ``2i`` in the low nibble of byte ``i``): ``float8e4nv [N, 2 * B]`` in element
    order."""
    pairs = tl.join(nibble_e4m3(raw), nibble_e4m3(raw >> 4))  # [N, B, 2]: 2i + parity
    codes = tl.reshape(pairs, (raw.shape[0], 2 * raw.shape[1]))
    return codes.to(tl.float8e4nv, bitcast=True)


# Four code bytes b0..b3 (one 32-bit register) re-laid as bytes ``s000 mmm0``: ``even`` holds
# the low nibbles (elements 0, 2, 4, 6), ``odd`` the high ones (three shifts, four masks for
# all eight elements). As the high byte of a 16-bit half such a byte is the fp16 ``e2m1 *
# 2**-14`` (sign at bit 15, magnitude at bits 9..11: exponent field 0..3 and mantissa bit 9;
# code 1 the subnormal 2**-15); one byte permute per register puts two of them there over
# zero low bytes.
_BYTES = """
shl.b32 t, {w}, 1; and.b32 e, t, 0x0E0E0E0E; shl.b32 t, {w}, 4; and.b32 t, t, 0x80808080;
or.b32 e, e, t;
shr.b32 t, {w}, 3; and.b32 o, t, 0x0E0E0E0E; and.b32 t, {w}, 0x80808080; or.b32 o, o, t;
"""
# fp16 pairs: $0 = (b0 low, b1 low), $1 = (b2 low, b3 low), $2 = (b0 high, b1 high), $3 =
# (b2 high, b3 high) nibbles.
_FP16_PAIRS = tl.constexpr("{ .reg .b32 t, e, o;" + _BYTES.format(w="$4")
                           + "prmt.b32 $0, e, 0, 0x1404; prmt.b32 $1, e, 0, 0x3424;"
                           + "prmt.b32 $2, o, 0, 0x1404; prmt.b32 $3, o, 0, 0x3424; }")
# bf16 values, four code bytes ($4) and their factor pairs ($5: bytes 0, 1; $6: bytes 2, 3):
# one byte permute puts b0, b1 in the two halves' low bytes (b2, b3 in their second bytes);
# each register is then two shifts and one three-input logic op, the 3 magnitude bits of both
# of its nibbles landing at once at bits 6..8 and their signs at bits 15, 31: e2m1 * 2**-126
# (code 1 the subnormal 2**-127), times 2**126 (exact: e2m1 itself), times the factor pair.
# $0 = (b0 low, b1 low), $1 = (b2 low, b3 low), $2 = (b0 high, b1 high), $3 = (b2 high, b3
# high) nibbles.
_BF16_SCALED = tl.constexpr(
    "{ .reg .b32 t, a, b, r0, r1, r2, r3, c;\n"
    "prmt.b32 t, $4, 0, 0x3120;\n"
    "shl.b32 a, t, 6; and.b32 a, a, 0x01C001C0; shl.b32 b, t, 12; and.b32 b, b, 0x80008000;\n"
    "or.b32 r0, a, b;\n"
    "shr.b32 a, t, 2; and.b32 a, a, 0x01C001C0; shl.b32 b, t, 4; and.b32 b, b, 0x80008000;\n"
    "or.b32 r1, a, b;\n"
    "shl.b32 a, t, 2; and.b32 a, a, 0x01C001C0; shl.b32 b, t, 8; and.b32 b, b, 0x80008000;\n"
    "or.b32 r2, a, b;\n"
    "shr.b32 a, t, 6; and.b32 a, a, 0x01C001C0; and.b32 b, t, 0x80008000;\n"
    "or.b32 r3, a, b;\n"
    "mov.b32 c, 0x7E807E80;"
    "mul.rn.bf16x2 r0, r0, c; mul.rn.bf16x2 r1, r1, c;"
    "mul.rn.bf16x2 r2, r2, c; mul.rn.bf16x2 r3, r3, c;"
    "mul.rn.bf16x2 $0, r0, $5; mul.rn.bf16x2 $1, r1, $6;"
    "mul.rn.bf16x2 $2, r2, $5; mul.rn.bf16x2 $3, r3, $6; }")


@triton.jit
def nibbles_fp16(raw):
    """fp16 values ``e2m1 * 2**-14`` (exact) of the two elements in each byte of ``raw`` (uint8
    ``[N, B]``, element ``2i`` in the low nibble of byte ``i``): ``float16 [N, 2 * B]`` in
    element order: 11 instructions per 8 elements (:data:`_FP16_PAIRS`). Inline PTX: CUDA
    only."""
    lo, hi = tl.inline_asm_elementwise(_FP16_PAIRS, "=r,=r,=r,=r,r", [raw],
                                       dtype=(tl.float16, tl.float16), is_pure=True, pack=4)
    return tl.reshape(tl.join(lo, hi), (raw.shape[0], 2 * raw.shape[1]))


@triton.jit
def scaled_nibbles_bf16(raw, factor):
    """bf16 values ``e2m1 * factor`` of the low and the high nibble of each byte of ``raw``
    (uint8, any shape), ``factor`` bf16 of the same shape (one per byte, both its elements):
    two bf16 tensors shaped like ``raw``. Exact where ``factor`` is a power of two and the
    product is in range (it rounds like any bf16 multiply: +-inf past the range, as fp32
    would). Inline PTX (sm_90's bf16 multiply): CUDA only."""
    return tl.inline_asm_elementwise(_BF16_SCALED, "=r,=r,=r,=r,r,r,r", [raw, factor],
                                     dtype=(tl.bfloat16, tl.bfloat16), is_pure=True, pack=4)


WORD_ORDER = tl.constexpr((0, 4, 2, 6, 1, 5, 3, 7))
"""The elements of a code word in the order :func:`word_values` returns them."""


@triton.jit
def code_halves(words):
    """The 8 elements of each code word of ``words`` (uint32, any shape; element ``e`` at bits
    ``4e``, ``2i`` the low nibble of byte ``i``) as fp16 ``e2m1 * 2**-14`` in the high bytes of
    four uint32 pairs of halves: elements (0, 4), (2, 6), (1, 5), (3, 7). The plain-Triton
    form of :data:`_FP16_PAIRS` and :data:`_WORD_FP32` (the interpreter runs it; compiled,
    LLVM folds its shared masks back into per-pair ones, so CUDA takes the PTX).

    Four elements at a time: three shifts and four masks re-lay every byte as ``s000 mmm0``
    (``even``: the low nibbles, ``odd``: the high ones), which as the high byte of a 16-bit
    half is the fp16 with the sign at bit 15 and the magnitude at bits 9..11 (exponent field
    0..3, mantissa bit 9: ``e2m1 * 2**-14``; code 1 is the fp16 subnormal ``2**-15``); one mask
    or one shift and a mask then clears the low bytes.
    """
    even = ((words << 1) & 0x0E0E0E0E) | ((words << 4) & 0x80808080)
    odd = ((words >> 3) & 0x0E0E0E0E) | (words & 0x80808080)
    return ((even << 8) & 0xFF00FF00, even & 0xFF00FF00, (odd << 8) & 0xFF00FF00,
            odd & 0xFF00FF00)


@triton.jit
def half_fp32(pairs, HIGH: tl.constexpr):
    """The low (or, ``HIGH``, the high) fp16 half of each uint32 of ``pairs`` as fp32."""
    if HIGH:
        bits = pairs >> 16
    else:
        bits = pairs & 0xFFFF
    return bits.to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)


# One code word ($8) -> its 8 elements as fp32 e2m1 * 2**-14 in WORD_ORDER: the bytes of
# _BYTES, each permuted into the high byte of a half and widened. In PTX, so that LLVM cannot
# fold the masks of :func:`code_halves` back into per-pair shifts, as it does to the plain
# Triton form (four operations per pair again).
_WORD_FP32 = tl.constexpr(
    "{ .reg .b32 t, e, o, p; .reg .b16 l, h;" + _BYTES.format(w="$8")
    + "prmt.b32 p, e, 0, 0x2404; mov.b32 {l, h}, p; cvt.f32.f16 $0, l; cvt.f32.f16 $1, h;"
    + "prmt.b32 p, e, 0, 0x3414; mov.b32 {l, h}, p; cvt.f32.f16 $2, l; cvt.f32.f16 $3, h;"
    + "prmt.b32 p, o, 0, 0x2404; mov.b32 {l, h}, p; cvt.f32.f16 $4, l; cvt.f32.f16 $5, h;"
    + "prmt.b32 p, o, 0, 0x3414; mov.b32 {l, h}, p; cvt.f32.f16 $6, l; cvt.f32.f16 $7, h; }")


@triton.jit
def word_values(words, PTX: tl.constexpr):
    """The 8 elements of each code word of ``words`` (uint32, any shape) as fp32 ``e2m1 *
    2**-14``, exact: eight tensors shaped like ``words``, in :data:`WORD_ORDER`. Each is a
    register of its own (no joins: a joined tensor of halves is packed again with byte
    permutes before it is widened), from :func:`code_halves`; where inline PTX runs
    (``PTX``), the same steps in PTX (:data:`_WORD_FP32`)."""
    if PTX:
        return tl.inline_asm_elementwise(_WORD_FP32, "=f,=f,=f,=f,=f,=f,=f,=f,r", [words],
                                         dtype=(tl.float32,) * 8, is_pure=True, pack=1)
    p04, p26, p15, p37 = code_halves(words)
    return (half_fp32(p04, False), half_fp32(p04, True), half_fp32(p26, False),
            half_fp32(p26, True), half_fp32(p15, False), half_fp32(p15, True),
            half_fp32(p37, False), half_fp32(p37, True))


@triton.jit
def row_scales(page_ptr, ok):
    """A page's scale bytes ``int32 [128, 4]`` for :func:`row_logits` (zeros where ``ok``, a
    scalar, is false). Triton changes their layout right after the load, which waits for it:
    load them where that wait overlaps other loads in flight, not before arithmetic."""
    byte = (PAGE_SCALE_OFFSET + tl.arange(0, PAGE_TOKENS)[:, None] * TOKEN_SCALE_BYTES
            + tl.arange(0, TOKEN_SCALE_BYTES)[None, :])
    return tl.load(page_ptr + byte, mask=ok, other=0).to(tl.int32)


@triton.jit
def row_words(page_ptr, ok):
    """The code words of a page's 128 tokens: ``uint32 [128, 16]``, 8 elements each (zeros
    where ``ok``, a scalar, is false)."""
    tok = tl.arange(0, PAGE_TOKENS)
    return tl.load(page_ptr.to(tl.pointer_type(tl.uint32)) + tok[:, None] * TOKEN_WORDS
                   + tl.arange(0, TOKEN_WORDS)[None, :], mask=ok, other=0)


ROW_OFFSET = tl.constexpr(-127 + 6)
"""A one-row dot's exponent minus its token's largest scale byte (:func:`row_logits`): the
e8m0 bias and the e4m3 encoding's ``2**-6`` of an e2m1 value."""


@triton.jit
def row_logits(q, words, scales, PTX: tl.constexpr):
    """Relative logits of one query row over every token of a page, on the CUDA cores (a
    single row wastes 15/16 of a tensor-core tile), in fp32 (a bf16 query: an e4m3-exact one
    takes ``row_dot.row_logits``): ``(dots f32 [128], smax int32 [128])``,
    each token's dots relative to its largest scale byte ``smax``; its logits are
    ``mul_scale_pow2(dots, smax, ROW_OFFSET)`` (NaN where ``smax`` is the e8m0 NaN). From the
    page's :func:`row_words` and :func:`row_scales`. ``q``: the row's values as eight ``f32
    [16]``, ``q[j][w]`` the element ``8w + WORD_ORDER[j]``, e4m3- or bf16-exact, so every
    product is exact. Words are decoded by :func:`word_values`."""
    v0, v1, v2, v3, v4, v5, v6, v7 = word_values(words, PTX)
    per_word = v0 * q[0][None, :]  # [128, 16], one fused multiply-add per element after it
    per_word += v1 * q[1][None, :]
    per_word += v2 * q[2][None, :]
    per_word += v3 * q[3][None, :]
    per_word += v4 * q[4][None, :]
    per_word += v5 * q[5][None, :]
    per_word += v6 * q[6][None, :]
    per_word += v7 * q[7][None, :]
    per_group = tl.reshape(per_word, (PAGE_TOKENS, TOKEN_GROUPS, GROUP_WORDS))
    return row_group_sum(tl.sum(per_group, axis=2), scales)


@triton.jit
def row_group_sum(per_group, scales):
    """A one-row scorer's token dots from its group dots ``f32 [128, 4]`` (in units of
    ``e2m1 * 2**-14`` times the query) and scale bytes ``int32 [128, 4]``: ``(dots f32 [128],
    smax int32 [128])``, each group rescaled by ``2**(s_g - smax)`` (:func:`row_logits`)."""
    smax = tl.max(scales, axis=1)
    # e2m1 * 2**-14 here: 8 more than the e4m3 encoding's 2**-6 that ROW_OFFSET assumes.
    return tl.sum(per_group * pow2_to_128(scales - smax[:, None] + 8), axis=1), smax


@triton.jit
def code_bytes(page_ptr, ok):
    """A page's code bytes ``uint8 [128, 64]`` in one load (zeros where ``ok``, a scalar, is
    false)."""
    byte = (tl.arange(0, PAGE_TOKENS)[:, None] * TOKEN_DATA_BYTES
            + tl.arange(0, TOKEN_DATA_BYTES)[None, :])
    return tl.load(page_ptr + byte, mask=ok, other=0)


@triton.jit
def scale_words(page_ptr, ok):
    """Each token's 4 scale bytes as one uint32 ``[128]`` (group ``g`` in bits ``8g``): one
    load and one layout change for the page instead of one per group. Zeros where ``ok``
    (a scalar) is false."""
    words = page_ptr.to(tl.pointer_type(tl.uint32)) + PAGE_SCALE_OFFSET // WORD_BYTES
    return tl.load(words + tl.arange(0, PAGE_TOKENS), mask=ok, other=0)


@triton.jit
def scale_byte(words, g: tl.constexpr):
    """Group ``g``'s scale byte of each of ``words`` (:func:`scale_words`) as int32."""
    return ((words >> (8 * g)) & 0xFF).to(tl.int32)


@triton.jit
def group_bytes(words):
    """Every group's scale byte of each of ``words`` (:func:`scale_words`): int32 ``[N, 4]``."""
    return ((words[:, None] >> (8 * tl.arange(0, TOKEN_GROUPS))[None, :]) & 0xFF).to(tl.int32)


@triton.jit
def page_bytes(page_ptr, ok):
    """A page's raw bytes in two loads issued together: the code bytes ``uint8 [128, 64]``
    (:func:`code_bytes`) and the scale words (:func:`scale_words`). Zeros where ``ok`` (a
    scalar) is false. Nothing here waits for the data: load the next page with it before
    computing the current one."""
    return code_bytes(page_ptr, ok), scale_words(page_ptr, ok)


@triton.jit
def split_groups(codes):
    """The four scale groups' code bytes ``uint8 [128, 16]`` of a page's :func:`code_bytes`
    (a layout change, which waits for the load)."""
    # [128, 64] -> [128, 16, 2 (group bit 1), 2 (group bit 0)], then split to the groups
    quads = tl.permute(tl.reshape(codes, (PAGE_TOKENS, 2, 2, GROUP_DATA_BYTES)), (0, 3, 1, 2))
    even, odd = tl.split(quads)  # group bit 0
    b0, b2 = tl.split(even)
    b1, b3 = tl.split(odd)
    return b0, b1, b2, b3


@constexpr_function
def fp16_keys(q_dtype, ptx) -> bool:
    """Whether :func:`group_dot` takes the keys as fp16 ``e2m1 * 2**-14`` straight from the
    bytes (fp16 queries where inline PTX runs) rather than as e4m3 ``e2m1 * 2**-6``: the one
    rule :func:`key_exponent` must follow too."""
    return bool(ptx) and q_dtype == tl.float16


@triton.jit
def group_dot(q_g, codes, factor, PTX: tl.constexpr):
    """``(q_g . K_g^T) * factor``: one scale group's logits, ``f32 [M, N]``, from the group's
    code bytes ``uint8 [N, 16]`` and a factor per key ``f32 [N]`` (``2**(s_g - smax)`` puts
    them in the units of :func:`key_exponent`).

    ``q_g``: the group's query values ``[M, 32]`` (fp16 holding e4m3 values, or bf16). The
    keys go in as e4m3 ``e2m1 * 2**-6`` (converted to ``q_g``'s
    dtype), or, for fp16 queries where inline PTX runs (``PTX``), straight from the bytes as
    fp16 ``e2m1 * 2**-14`` (:func:`nibbles_fp16`); products are exact either way.
    """
    if fp16_keys(q_g.dtype, PTX):
        dots = tl.dot(q_g, tl.trans(nibbles_fp16(codes)))
    else:
        dots = tl.dot(q_g, tl.trans(nibbles_fp8(codes).to(q_g.dtype)))
    return dots * factor[None, :]


@triton.jit
def key_exponent(q_g, smax, PTX: tl.constexpr):
    """``q . k = dots * 2**key_exponent`` for :func:`group_dot`'s dots of ``q_g``'s dtype."""
    if fp16_keys(q_g.dtype, PTX):
        return smax - 127 + 14
    return smax - 127 + 6


@triton.jit
def token_scales(scales):
    """Each token's four group scale bytes and their largest, int32 ``[N]`` each, from its
    scale word (:func:`scale_words`)."""
    s0, s1 = scale_byte(scales, 0), scale_byte(scales, 1)
    s2, s3 = scale_byte(scales, 2), scale_byte(scales, 3)
    return s0, s1, s2, s3, tl.maximum(tl.maximum(s0, s1), tl.maximum(s2, s3))


@triton.jit
def scaled_dots(q0, q1, q2, q3, b0, b1, b2, b3, s0, s1, s2, s3, ref, nan_keys,
                PTX: tl.constexpr):
    """The four group dots of a page, each scaled by ``2**(byte - ref)`` (:func:`group_dot`;
    ``ref`` each token's largest byte, or one byte for the page), summed: ``f32 [M, 128]`` in
    the units of :func:`key_exponent` of ``ref``; NaN for the tokens ``nan_keys`` marks, put
    in group 0's factor (a NaN factor makes the token's every dot NaN: one select per token
    instead of one per logit)."""
    first = tl.where(nan_keys, float("nan"), pow2(s0 - ref))
    dots = group_dot(q0, b0, first, PTX)
    dots += group_dot(q1, b1, pow2(s1 - ref), PTX)
    dots += group_dot(q2, b2, pow2(s2 - ref), PTX)
    dots += group_dot(q3, b3, pow2(s3 - ref), PTX)
    return dots


@triton.jit
def key_logits(q0, q1, q2, q3, b0, b1, b2, b3, scales, PTX: tl.constexpr):
    """:func:`page_logits` of a page's keys already split into groups (:func:`split_groups`)."""
    s0, s1, s2, s3, smax = token_scales(scales)
    dots = scaled_dots(q0, q1, q2, q3, b0, b1, b2, b3, s0, s1, s2, s3, smax,
                       smax == NAN_BYTE, PTX)
    return dots, key_exponent(q0, smax, PTX)


@triton.jit
def page_logits(q0, q1, q2, q3, codes, scales, PTX: tl.constexpr):
    """Relative logits of every token of a page loaded by :func:`page_bytes` (``codes``,
    ``scales``) and the token exponents.

    Returns ``(dots f32 [M, 128], exponent int32 [128])`` with the true ``q . k`` equal to
    ``dots * 2**exponent`` (:func:`key_exponent` of the token's max scale byte); NaN for a
    token with a scale byte 255 (its keys are NaN, SPEC §1.3, §9.2).
    """
    b0, b1, b2, b3 = split_groups(codes)
    return key_logits(q0, q1, q2, q3, b0, b1, b2, b3, scales, PTX)


@triton.jit
def _band_keys(codes, depth, band, DTYPE: tl.constexpr):
    """A page's keys (``codes``: :func:`code_bytes`) in exponent band ``band`` as one dot
    operand ``DTYPE [128, 128]``: each group's e4m3 codes times ``2**(FOLD_SHIFT - depth + band
    * FOLD_BAND)`` (``depth``: int32 [128, 4], each group's scale byte below the page's
    reference byte) where that exponent lies in ``(FOLD_SHIFT - FOLD_BAND, FOLD_SHIFT]``, zeros
    elsewhere."""
    keys = nibbles_fp8(codes).to(DTYPE)
    shift = FOLD_SHIFT - depth + band * FOLD_BAND
    inside = (shift <= FOLD_SHIFT) & (shift > FOLD_SHIFT - FOLD_BAND)
    factor = tl.where(inside, pow2(shift), 0.0).to(DTYPE)
    groups = tl.reshape(keys, (PAGE_TOKENS, TOKEN_GROUPS, MX_BLOCK))
    return tl.reshape(groups * factor[:, :, None], (PAGE_TOKENS, HEAD_DIM))


@triton.jit
def folded_page_logits(q, codes, scale_words, live):
    """:func:`page_logits` with the scale groups folded into the keys: one ``K = 128`` dot
    instead of four ``K = 32`` dots and four rescaled results, and one exponent for the page.

    ``q``: the query tile ``[M, 128]`` in fp16 (e4m3-exact values) or bf16; ``codes``,
    ``scale_words``: the page as :func:`page_bytes` loads it; ``live``: bool
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

    Returns ``(dots f32 [M, 128], exponent int32, first_nan int32)`` with ``q . k = dots *
    2**exponent`` for every live token, so a row's maximum can be taken first and scaled once.
    ``first_nan`` is the page index of the first token with a scale byte 255 (NaN keys: SPEC
    §1.3, §9.2; ``2**30`` where there is none); the dots of such tokens are finite (their
    groups at byte 255 fold to zeros), so the caller makes NaN the rows that see one, once per
    row instead of a NaN per element. The page's reference byte, its deepest group and its
    first NaN-key token come from one reduction across the tile.
    """
    scales = group_bytes(scale_words)
    largest, smallest = tl.max(scales, axis=1), tl.min(scales, axis=1)
    nan_keys = largest == NAN_BYTE
    live = live & ~nan_keys  # NaN tokens set no reference: the rest stay exact
    ref, shallowest, first_nan = tl.reduce(
        (tl.where(live, largest, 0), tl.where(live, smallest, NAN_BYTE),
         tl.where(nan_keys, tl.arange(0, PAGE_TOKENS), 2**30)), 0, _page_span)
    depth = ref - scales  # [128, 4]; negative (zero keys) only for tokens that are not live
    deepest = tl.maximum(ref - shallowest, 0)  # the deepest live group below the reference
    bands = deepest // FOLD_BAND + 1
    dots = tl.zeros((q.shape[0], PAGE_TOKENS), tl.float32)
    for i in range(bands):
        if i > 0:
            dots = dots * BAND_STEP
        dots = tl.dot(q, tl.trans(_band_keys(codes, depth, bands - 1 - i, q.dtype)), dots)
    return dots, ref - 127 + 6 - FOLD_SHIFT, first_nan


@triton.jit
def _page_span(ref_a, low_a, nan_a, ref_b, low_b, nan_b):
    """Combine of :func:`folded_page_logits`'s reduction: the largest reference byte, the
    smallest group byte, the first NaN-key token."""
    return tl.maximum(ref_a, ref_b), tl.minimum(low_a, low_b), tl.minimum(nan_a, nan_b)


@triton.jit
def value_factors(scales, live):
    """bf16 ``[128, 4]``: each group's scale ``2**(byte - 127)`` (its bf16 bits are ``byte <<
    7``: byte 0 gives 0, the fp32 kernels' ``pow2``), NaN for byte 255, 0 where ``live``
    (bool [128]) is false."""
    byte = group_bytes(scales)
    bits = (byte << 7) | tl.where(byte == NAN_BYTE, 0x40, 0)
    bits = tl.where(live[:, None], bits, 0)
    return bits.to(tl.uint16).to(tl.bfloat16, bitcast=True)


@triton.jit
def value_dims():
    """The head dimension of each column of ``join(lo, hi)`` of :func:`page_values` reshaped
    to 128 columns as ``[lo | hi]``: column ``j = 64 * nibble + byte`` holds element ``2 *
    byte + nibble``. The attention output is stored through this map."""
    j = tl.arange(0, HEAD_DIM)
    return 2 * (j % TOKEN_DATA_BYTES) + j // TOKEN_DATA_BYTES


@triton.jit
def page_values(codes, scales, live, DTYPE: tl.constexpr, PTX: tl.constexpr):
    """Exactly dequantized values of a page loaded by :func:`page_bytes`, as the low-nibble
    (even) and the high-nibble (odd) elements: two ``DTYPE [128, 64]`` (bf16 or fp32: exact),
    so each stays contiguous in registers and goes to shared memory (the PV dot's operand) in
    16-byte stores. A group with scale byte 255 is NaN, elements past the fp32 range are
    +-inf (SPEC §9.2); tokens where ``live`` (bool [128]) is false are zeros (so garbage,
    NaN scales included, cannot leak). bf16 where inline PTX runs (``PTX``) is decoded
    straight from the bytes (:func:`scaled_nibbles_bf16`): no fp32 tile of the page is ever
    held."""
    if (not PTX) or (DTYPE != tl.bfloat16):
        byte = group_bytes(scales)
        x = tl.reshape(nibbles_fp8(codes).to(tl.float32),
                       (PAGE_TOKENS, TOKEN_GROUPS, MX_BLOCK)) * 64.0  # e2m1, exact
        x = x * pow2(byte - 127)[:, :, None]
        x = tl.where((byte == NAN_BYTE)[:, :, None], float("nan"), x)
        x = tl.where(live[:, None, None], x, 0.0)
        # [token, byte, nibble]
        lo, hi = tl.split(tl.reshape(x, (PAGE_TOKENS, TOKEN_DATA_BYTES, 2)))
        return lo.to(DTYPE), hi.to(DTYPE)
    factor = tl.reshape(
        tl.broadcast_to(value_factors(scales, live)[:, :, None],
                        (PAGE_TOKENS, TOKEN_GROUPS, GROUP_DATA_BYTES)),
        (PAGE_TOKENS, TOKEN_DATA_BYTES))
    lo, hi = scaled_nibbles_bf16(codes, factor)
    return lo.to(DTYPE), hi.to(DTYPE)  # DTYPE is bf16 here: one return type for both branches


@triton.jit
def quotient_rn(x, d, inv):
    """``fp32(x / d)`` correctly rounded, for fp32 ``x`` and a positive normal ``d`` whose
    correctly rounded reciprocal is ``inv`` (``div_rn(1, d)``, once per divisor): the product
    ``q = x * inv`` is within an ulp, its residual ``x - q * d`` is exact in one fma, and one
    more fma lands on the correctly rounded quotient (Markstein's correction). Three operations
    per element instead of a full division; exact quotients (an e4m3 tie) come out exact.
    Not for the interpreter's arithmetic, which does not fuse ``tl.fma``."""
    q = x * inv
    return tl.fma(tl.fma(-q, d, x), inv, q)


@triton.jit
def round_e4m3(x, SATURATES: tl.constexpr = False):
    """Saturating round-to-nearest-even of fp32 ``x`` to e4m3 (SPEC §1.5). NaN stays NaN
    (SPEC §9.2). ``SATURATES``: the conversion saturates by itself, which is so wherever
    inline PTX runs (``PTX``): Triton has e4m3 on CUDA only from sm_89, where it converts with
    ``cvt.rn.satfinite`` (+-448 past the range, NaN kept), so no clamp is needed. Elsewhere
    (the interpreter, ROCm) the clamp comes first, and propagates NaN (PTX's plain ``max``
    would return -448 for a NaN)."""
    if not SATURATES:
        x = tl.minimum(tl.maximum(x, -448.0, propagate_nan=PROPAGATE_NAN), 448.0,
                       propagate_nan=PROPAGATE_NAN)
    return x.to(tl.float8e4nv, fp_downcast_rounding="rtne")
