"""Number-format conversions shared by the kernels (SPEC §1): e4m3, bf16, e2m1, MXFP8.

Every helper emits gfx950 instructions whose rounding is the SPEC's: ``v_cvt_pk_fp8_f32``
rounds to nearest even (MODE register default) and saturation is an explicit clamp to ±448
first (SPEC §1.5) that keeps NaN (§9.2); bf16 values widen to fp32 exactly by a 16-bit
shift; e2m1 codes widen with ``v_cvt_scalef32_pk_f32_fp4`` at scale 1.0 (exact) and are scaled
by an exact fp32 power of two.
"""

from __future__ import annotations

from jax_mxfp4._src.flydsl import _ir as ir
from jax_mxfp4._src.flydsl._ir import arith, rocdl

E4M3_MAX = 448.0
E8M0_NAN = 255
E4M3_NAN_WORD = 0x7F7F7F7F
"""Four float8_e4m3fn NaN bytes (0x7F) in one i32."""


def clamp_e4m3(x):
    """``clamp(x, -448, 448)`` in fp32; NaN stays NaN (SPEC §9.2: ``fmax`` would turn it
    into -448)."""
    return ir.fmin_nan(ir.fmax_nan(x, ir.cf32(-E4M3_MAX)), ir.cf32(E4M3_MAX))


def pack_e4m3x4(values) -> object:
    """Four fp32 values -> one i32 of four e4m3 bytes (element 0 in the low byte), saturating
    round-to-nearest-even."""
    a, b, c, d = (clamp_e4m3(v) for v in values)
    low = rocdl.cvt_pk_fp8_f32(ir.i32(), a, b, ir.ci32(0), False)
    return rocdl.cvt_pk_fp8_f32(ir.i32(), c, d, low, True)


def pack_e4m3(values) -> list:
    """fp32 values (a multiple of 4) -> i32 words of e4m3 bytes, in element order."""
    return [pack_e4m3x4(values[i : i + 4]) for i in range(0, len(values), 4)]


def bf16_pair_to_f32(word) -> tuple:
    """An i32 holding two bf16 (element 0 low) -> the two exact fp32 values."""
    low = ir.f32_from_bits(ir.shl(word, ir.ci32(16)))
    high = ir.f32_from_bits(ir.band(word, ir.ci32(0xFFFF0000)))
    return low, high


def bf16_words_to_f32(words) -> list:
    out = []
    for word in words:
        out.extend(bf16_pair_to_f32(word))
    return out


def to_bf16_bits(x):
    """fp32 -> its bf16 rounding (nearest even) as the low 16 bits of an i32."""
    value = arith.truncf(ir.bf16(), ir.raw(x))
    return arith.extui(ir.i32(), arith.bitcast(ir.i16(), value))


def bf16_round_f32(x):
    """fp32 -> the fp32 value of its bf16 rounding (nearest even)."""
    return ir.f32_from_bits(ir.shl(to_bf16_bits(x), ir.ci32(16)))


def pack_bf16x2(a, b):
    """Two fp32 -> one i32 holding their bf16 roundings (``a`` low)."""
    return ir.bor(to_bf16_bits(a), ir.shl(to_bf16_bits(b), ir.ci32(16)))


def pack_bf16_vec8(values):
    """Eight fp32 -> ``vector<8xbf16>`` (nearest even), the operand of a bf16 MFMA."""
    return ir.from_elements(ir.vec(8, ir.bf16()), [arith.truncf(ir.bf16(),
                                                                ir.raw(v)) for v in values])


def e2m1_word_to_f32(word) -> list:
    """An i32 of eight packed e2m1 codes (element 0 in the low nibble) -> eight exact fp32
    values (unscaled)."""
    out = []
    for pair in range(4):
        two = rocdl.cvt_scalef32_pk_f32_fp4(ir.vec(2, ir.f32()), word, ir.cf32(1.0), pair)
        out.extend([ir.extract(two, 0), ir.extract(two, 1)])
    return out


def mxfp8_scale_byte(amax_bits):
    """SPEC §1.6: ``clamp(E - 8 + (M7 > 96), 0, 254)`` from the fp32 bits of a bf16 amax;
    255 where the amax is Inf or NaN (SPEC §1.9)."""
    exp_field = ir.band(ir.lshr(amax_bits, ir.ci32(23)), ir.ci32(0xFF))
    mant7 = ir.band(ir.lshr(amax_bits, ir.ci32(16)), ir.ci32(0x7F))
    byte = ir.add(ir.sub(exp_field, ir.ci32(8)), arith.extui(ir.i32(), ir.gt(mant7, ir.ci32(96))))
    byte = ir.smin(ir.smax(byte, ir.ci32(0)), ir.ci32(254))
    return ir.select(ir.eq(exp_field, ir.ci32(0xFF)), ir.ci32(E8M0_NAN), byte)


def mxfp8_block(values_bf16_f32) -> tuple:
    """Quantize 32 bf16-valued fp32 to MXFP8 (SPEC §1.6, §8): ``(8 i32 words of e4m3, byte)``.

    ``values * 2**(127 - sb)`` is an exact power-of-two scaling (``sb <= 247`` for finite bf16,
    so the factor is a normal fp32) and the e4m3 rounding is saturating nearest-even. A block
    holding Inf or NaN gets byte 255 and every value the e4m3 NaN (SPEC §1.9).
    """
    amax = ir.ci32(0)
    for v in values_bf16_f32:
        amax = ir.umax(amax, ir.band(ir.f32_bits(v), ir.ci32(0x7FFFFFFF)))
    byte = mxfp8_scale_byte(amax)
    non_finite = ir.eq(byte, ir.ci32(E8M0_NAN))
    finite_byte = ir.smin(byte, ir.ci32(254))  # keeps the factor a normal fp32
    factor = ir.f32_from_bits(ir.shl(ir.sub(ir.ci32(254), finite_byte), ir.ci32(23)))
    scaled = [ir.fmul(v, factor) for v in values_bf16_f32]
    words = [ir.select(non_finite, ir.ci32(E4M3_NAN_WORD), w) for w in pack_e4m3(scaled)]
    return words, byte
