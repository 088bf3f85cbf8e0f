"""Number formats and the MXFP4 page layout (SPEC §1, §2.1).

MXFP4: e2m1 codes, two per byte (element ``2i`` in the low nibble of byte ``i``), and one e8m0
scale byte per 32 consecutive elements (value ``2**(byte - 127)``; byte 255 is NaN).
MXFP8: e4m3 values and one e8m0 scale byte per 32 elements.

Everything here is plain ``jax.numpy``: XLA fuses it into its neighbours on every platform.
Values that may be fp32 subnormals are built from bit patterns (see ``_bits``) so the results
are exact on XLA's CPU backend too.
"""

from __future__ import annotations

from typing import Literal

import jax.numpy as jnp
import numpy as np
from jax import lax

from jax_mxfp4._src.core._bits import bf16_from_f32_bits, exact_scaled_f32, f32_bits, f32_from_bits

# --- constants --------------------------------------------------------------------------------

HEAD_DIM = 128
"""Elements per token row of a page (main K/V and index K alike)."""
MX_BLOCK = 32
"""Elements that share one e8m0 scale byte."""
PAGE_TOKENS = 128
"""Tokens per page (= the sparse block size)."""
TOKEN_DATA_BYTES = HEAD_DIM // 2
"""Packed e2m1 bytes per token row (64)."""
TOKEN_GROUPS = HEAD_DIM // MX_BLOCK
"""Scale groups per token row (4)."""
TOKEN_SCALE_BYTES = TOKEN_GROUPS
"""Scale bytes per token row (4): one per group."""
PAGE_SCALE_OFFSET = PAGE_TOKENS * TOKEN_DATA_BYTES
"""Byte offset of the scale area inside a page (8192)."""
PAGE_BYTES = PAGE_SCALE_OFFSET + PAGE_TOKENS * TOKEN_SCALE_BYTES
"""Bytes per page: 128 x 64 B data + 128 x 4 B scales = 8704."""
E4M3_MAX = 448.0
E4M3_NAN = 0x7F
"""The float8_e4m3fn NaN byte (without its sign bit); e4m3fn has no Inf."""
E8M0_NAN = 255

E2M1_VALUES = np.array(
    [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0],
    dtype=np.float32,
)
"""Value of each e2m1 code 0..15 (bit 3 is the sign)."""

RoundMode = Literal["up", "even", "down"]
ROUND_MODES: tuple[str, ...] = ("up", "even", "down")
ROUND_MODE_CODES = {"up": 0, "even": 1, "down": 2}
"""How every kernel (C++ handlers, Triton, FlyDSL) receives ``round_mode``: an int32 code."""

# Largest |x| (in units of the block scale) that rounds to each e2m1 magnitude code, and whether
# a value exactly on the boundary rounds up: ties go to the even code (SPEC §1.4).
_E2M1_STEPS = ((0.25, False), (0.75, True), (1.25, False), (1.75, True),
               (2.5, False), (3.5, True), (5.0, False))


def check_round_mode(round_mode: str) -> None:
    if round_mode not in ROUND_MODES:
        raise ValueError(f"round_mode must be one of {ROUND_MODES}, got {round_mode!r}")


def _check_block_axis(x: jnp.ndarray, name: str, multiple: int) -> None:
    if x.ndim < 1 or x.shape[-1] % multiple:
        raise ValueError(
            f"{name}: the last axis must be a multiple of {multiple}, got shape {x.shape}"
        )


def _abs_bits_blocks(x_bf16: jnp.ndarray) -> tuple[jnp.ndarray, jnp.ndarray]:
    """fp32 bit patterns of a bf16 array, and the block amax's |bits| per 32 elements.

    The amax is taken on integer bit patterns (their order equals the float order for
    non-negative values), so subnormal inputs count even where the FPU treats them as zero.
    """
    bits = f32_bits(x_bf16)
    blocks = bits.reshape(*bits.shape[:-1], bits.shape[-1] // MX_BLOCK, MX_BLOCK)
    amax_bits = jnp.max(blocks & jnp.uint32(0x7FFFFFFF), axis=-1)
    return blocks, amax_bits


# --- MXFP4 ------------------------------------------------------------------------------------


def mxfp4_scale_byte(amax_bits: jnp.ndarray, round_mode: RoundMode = "up") -> jnp.ndarray:
    """The e8m0 scale byte of a block from the fp32 bits of its amax (a bf16 value).

    ``up`` (default, aiter's RoundUp): ``ceil_pow2(amax / 6)``, i.e. the exponent field of
    ``fp32(amax / 6)`` plus one if its mantissa is non-zero. For a bf16 amax ``1.m * 2**E`` this
    is ``E - 2 + (1.m > 1.5)`` (biased), at least 1 for any non-zero block, 0 for an all-zero one.
    ``even``: ``floor(log2(amax))`` after rounding the mantissa at 1.75 (``bits + 0x200000``),
    minus 2. ``down``: ``floor(log2(amax)) - 2``. Inf or NaN amax gives 255.
    """
    check_round_mode(round_mode)
    exp_field = ((amax_bits >> 23) & 0xFF).astype(jnp.int32)
    mant = (amax_bits & 0x7FFFFF).astype(jnp.int32)
    if round_mode == "up":
        byte = jnp.maximum(exp_field - 2 + (mant > 0x400000), 1)
        byte = jnp.where(amax_bits == 0, 0, byte)
    elif round_mode == "even":
        rounded_exp = (((amax_bits + 0x200000) >> 23) & 0xFF).astype(jnp.int32)
        byte = jnp.maximum(rounded_exp - 2, 0)
    else:
        byte = jnp.maximum(exp_field - 2, 0)
    byte = jnp.where(exp_field == 0xFF, E8M0_NAN, jnp.minimum(byte, 254))
    return byte.astype(jnp.uint8)


def _e2m1_magnitude_code(v: jnp.ndarray) -> jnp.ndarray:
    """Round non-negative fp32 ``v`` to the nearest e2m1 magnitude code 0..7, ties to even."""
    code = jnp.zeros(v.shape, jnp.uint8)
    for bound, tie_rounds_up in _E2M1_STEPS:
        above = (v >= bound) if tie_rounds_up else (v > bound)
        code = code + above.astype(jnp.uint8)
    return code


def pack_e2m1(codes: jnp.ndarray) -> jnp.ndarray:
    """uint8 codes ``[..., 2n]`` -> packed bytes ``[..., n]`` (element 2i in the low nibble)."""
    pairs = codes.reshape(*codes.shape[:-1], codes.shape[-1] // 2, 2)
    return (pairs[..., 0] | (pairs[..., 1] << 4)).astype(jnp.uint8)


def unpack_e2m1(packed: jnp.ndarray) -> jnp.ndarray:
    """Packed bytes ``uint8[..., n]`` -> codes ``uint8[..., 2n]``."""
    low = packed & 0x0F
    high = packed >> 4
    return jnp.stack([low, high], axis=-1).reshape(*packed.shape[:-1], 2 * packed.shape[-1])


def quantize_mxfp4(
    x: jnp.ndarray, *, round_mode: RoundMode = "up"
) -> tuple[jnp.ndarray, jnp.ndarray]:
    """Quantize ``x[..., D]`` (D a multiple of 32) to MXFP4 (SPEC §1.4).

    ``x`` is rounded to bfloat16 first, whatever its float dtype. Returns
    ``(packed uint8[..., D//2], scales uint8[..., D//32])``.
    """
    check_round_mode(round_mode)
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise TypeError(f"x must be a floating-point array, got {x.dtype}")
    _check_block_axis(x, "x", MX_BLOCK)
    blocks, amax_bits = _abs_bits_blocks(x.astype(jnp.bfloat16))
    scales = mxfp4_scale_byte(amax_bits, round_mode)
    # |x| / 2**(byte - 127), exactly (a power-of-two scaling, subnormal x included).
    shift = 127 - scales.astype(jnp.int32)[..., None]
    v = exact_scaled_f32(blocks & jnp.uint32(0x7FFFFFFF), shift)
    sign = (blocks >> 31).astype(jnp.uint8) << 3
    codes = (_e2m1_magnitude_code(v) | sign).reshape(*x.shape)
    return pack_e2m1(codes), scales


def _subnormal_units(significand: jnp.ndarray, shift: jnp.ndarray) -> jnp.ndarray:
    """``significand * 2**shift`` rounded to an integer, ties to even (fp32 subnormal bits).

    A value ``(2 + half) * 2**(e - 128)`` is ``(2 + half) << (e + 21)`` units of 2**-149.
    """
    significand = significand.astype(jnp.uint32)
    left = significand << jnp.clip(shift, 0, 31).astype(jnp.uint32)
    drop = jnp.clip(-shift, 0, 31).astype(jnp.uint32)
    kept = significand >> drop
    rest = significand - (kept << drop)
    halfway = jnp.where(drop > 0, jnp.uint32(1) << (jnp.maximum(drop, 1) - 1), 0)
    round_up = (drop > 0) & ((rest > halfway) | ((rest == halfway) & ((kept & 1) == 1)))
    return jnp.where(shift >= 0, left, kept + round_up.astype(jnp.uint32))


def mxfp4_f32_bits(codes: jnp.ndarray, scale_bytes: jnp.ndarray) -> jnp.ndarray:
    """fp32 bit patterns of ``e2m1(codes) * 2**(scale_bytes - 127)``, exact (SPEC §1.3, §1.8).

    ``scale_bytes`` broadcasts against ``codes``. Byte 255 gives NaN; results past the fp32
    range give inf; results below the normal range are exact subnormals.
    """
    codes = codes.astype(jnp.int32)
    byte = scale_bytes.astype(jnp.int32)
    mag = codes & 7
    exp_offset = jnp.where(mag >= 2, (mag >> 1) - 1, -1)
    half = jnp.where(mag >= 2, mag & 1, 0)  # mantissa 1.5 instead of 1.0
    e = byte + exp_offset
    normal = (e.astype(jnp.uint32) << 23) | (half.astype(jnp.uint32) << 22)
    subnormal = _subnormal_units(2 + half, e + 21)
    bits = jnp.where(e >= 255, jnp.uint32(0x7F800000), jnp.where(e >= 1, normal, subnormal))
    bits = jnp.where(mag == 0, jnp.uint32(0), bits)
    bits = bits | ((codes >> 3).astype(jnp.uint32) << 31)
    return jnp.where(byte == E8M0_NAN, jnp.uint32(0x7FC00000), bits)


def _from_f32_bits(bits: jnp.ndarray, dtype) -> jnp.ndarray:
    if jnp.dtype(dtype) == jnp.bfloat16:
        # Rounded on the bit patterns: XLA's CPU conversion would flush fp32 subnormals.
        return bf16_from_f32_bits(bits)
    return f32_from_bits(bits).astype(dtype)


def dequantize_mxfp4(packed: jnp.ndarray, scales: jnp.ndarray, dtype=jnp.float32) -> jnp.ndarray:
    """MXFP4 ``(packed uint8[..., D//2], scales uint8[..., D//32])`` -> ``dtype[..., D]``.

    Exact in fp32 and bfloat16 (subnormals included); byte 255 gives NaN.
    """
    packed, scales = jnp.asarray(packed), jnp.asarray(scales)
    if packed.dtype != jnp.uint8 or scales.dtype != jnp.uint8:
        raise TypeError(
            f"packed and scales must be uint8, got {packed.dtype} and {scales.dtype}"
        )
    if packed.shape[:-1] != scales.shape[:-1] or packed.shape[-1] != scales.shape[-1] * 16:
        raise ValueError(
            "scales must have one byte per 16 packed bytes (32 elements): got packed "
            f"{packed.shape} and scales {scales.shape}"
        )
    codes = unpack_e2m1(packed)
    codes = codes.reshape(*scales.shape, MX_BLOCK)  # explicit sizes: zero rows work too
    bits = mxfp4_f32_bits(codes, scales[..., None])
    return _from_f32_bits(bits.reshape(*packed.shape[:-1], 2 * packed.shape[-1]), dtype)


# --- e4m3 and MXFP8 ---------------------------------------------------------------------------


def to_e4m3(x: jnp.ndarray) -> jnp.ndarray:
    """Saturating round-to-nearest-even to float8_e4m3fn: ``RNE(clamp(x, -448, 448))`` (§1.5)."""
    x = jnp.asarray(x).astype(jnp.float32)
    return jnp.clip(x, -E4M3_MAX, E4M3_MAX).astype(jnp.float8_e4m3fn)


def mxfp8_scale_byte(amax_bits: jnp.ndarray) -> jnp.ndarray:
    """e8m0 scale of an MXFP8 block from the fp32 bits of its bf16 amax (SPEC §1.6, §1.9).

    ``clamp(E - 8 + (M7 > 96), 0, 254)``, E the exponent field and M7 the 7-bit mantissa;
    equal to ``ceil(log2(amax / 448)) + 127`` for every positive finite bf16 amax. An Inf or
    NaN amax gives 255 (NaN), as in MXFP4.
    """
    exp_field = ((amax_bits >> 23) & 0xFF).astype(jnp.int32)
    mant7 = ((amax_bits >> 16) & 0x7F).astype(jnp.int32)
    byte = jnp.clip(exp_field - 8 + (mant7 > 96), 0, 254)
    return jnp.where(exp_field == 0xFF, E8M0_NAN, byte).astype(jnp.uint8)


def quantize_mxfp8(x: jnp.ndarray) -> tuple[jnp.ndarray, jnp.ndarray]:
    """Quantize ``x[..., K]`` (K a multiple of 32) to MXFP8 (SPEC §1.6, §8).

    ``x`` is rounded to bfloat16 first. Returns ``(values float8_e4m3fn[..., K],
    scales uint8[..., K//32])``; bit-identical to the fused attention epilogue.
    """
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise TypeError(f"x must be a floating-point array, got {x.dtype}")
    _check_block_axis(x, "x", MX_BLOCK)
    blocks, amax_bits = _abs_bits_blocks(x.astype(jnp.bfloat16))
    scales = mxfp8_scale_byte(amax_bits)
    scaled = exact_scaled_f32(blocks, 127 - scales.astype(jnp.int32)[..., None])
    codes = lax.bitcast_convert_type(to_e4m3(scaled), jnp.uint8)
    codes = jnp.where((scales == E8M0_NAN)[..., None], jnp.uint8(E4M3_NAN), codes)
    return lax.bitcast_convert_type(codes, jnp.float8_e4m3fn).reshape(x.shape), scales


def mxfp8_f32_bits(codes: jnp.ndarray, scale_bytes: jnp.ndarray) -> jnp.ndarray:
    """fp32 bit patterns of ``e4m3(codes) * 2**(scale_bytes - 127)``, exact (SPEC §1.8).

    ``codes`` are float8_e4m3fn bytes (uint8); ``scale_bytes`` broadcasts against them. An
    e4m3 value is ``s * 2**n`` with an integer ``s < 16``, so every product is an fp32 normal
    or subnormal number (down to ``2**-136``) or past the fp32 range (inf). Byte 255 and the
    e4m3 NaN codes give NaN.
    """
    codes = codes.astype(jnp.int32)
    exp_field, mant = (codes >> 3) & 0xF, codes & 7
    significand = jnp.where(exp_field > 0, mant | 8, mant)
    exponent = jnp.maximum(exp_field, 1) - 10 + scale_bytes.astype(jnp.int32) - 127
    lead = 31 - lax.clz(jnp.maximum(significand, 1))  # floor(log2(significand)), 0..3
    e = lead + exponent
    normal = ((e + 127).astype(jnp.uint32) << 23) | (
        (significand.astype(jnp.uint32) << (23 - lead).astype(jnp.uint32)) & 0x7FFFFF)
    subnormal = _subnormal_units(significand, exponent + 149)
    bits = jnp.where(e >= 128, jnp.uint32(0x7F800000), jnp.where(e >= -126, normal, subnormal))
    bits = jnp.where(significand == 0, jnp.uint32(0), bits)
    bits = bits | ((codes >> 7).astype(jnp.uint32) << 31)
    nan = ((codes & 0x7F) == E4M3_NAN) | (scale_bytes == E8M0_NAN)
    return jnp.where(nan, jnp.uint32(0x7FC00000), bits)


def dequantize_mxfp8(values: jnp.ndarray, scales: jnp.ndarray, dtype=jnp.float32) -> jnp.ndarray:
    """MXFP8 ``(values e4m3[..., K], scales uint8[..., K//32])`` -> ``dtype[..., K]``.

    Exact in fp32, subnormal results included; bfloat16 results are the nearest-even rounding
    of the exact value. Byte 255 gives NaN.
    """
    values, scales = jnp.asarray(values), jnp.asarray(scales)
    if values.dtype != jnp.float8_e4m3fn or scales.dtype != jnp.uint8:
        raise TypeError(
            f"values must be float8_e4m3fn and scales uint8, got {values.dtype}, {scales.dtype}"
        )
    if values.shape[:-1] != scales.shape[:-1] or values.shape[-1] != scales.shape[-1] * MX_BLOCK:
        raise ValueError(
            f"scales must have one byte per 32 values: got {values.shape} and {scales.shape}"
        )
    codes = lax.bitcast_convert_type(values, jnp.uint8).reshape(*scales.shape, MX_BLOCK)
    bits = mxfp8_f32_bits(codes, scales[..., None])
    return _from_f32_bits(bits.reshape(values.shape), dtype)


__all__ = [
    "E2M1_VALUES",
    "E4M3_MAX",
    "HEAD_DIM",
    "MX_BLOCK",
    "PAGE_BYTES",
    "PAGE_SCALE_OFFSET",
    "PAGE_TOKENS",
    "TOKEN_DATA_BYTES",
    "TOKEN_GROUPS",
    "TOKEN_SCALE_BYTES",
    "dequantize_mxfp4",
    "dequantize_mxfp8",
    "mxfp4_f32_bits",
    "mxfp4_scale_byte",
    "mxfp8_f32_bits",
    "mxfp8_scale_byte",
    "pack_e2m1",
    "quantize_mxfp4",
    "quantize_mxfp8",
    "to_e4m3",
    "unpack_e2m1",
]
