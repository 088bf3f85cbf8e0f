"""Exact float arithmetic from bit patterns.

XLA's CPU backend runs with flush-to-zero and denormals-are-zero, so ``x * 2**k`` on a subnormal
``x`` (or with a subnormal result) silently becomes zero. The codecs promise exact results down to
the fp32 subnormals (SPEC §1.8), so the few places that meet subnormals build their values from
integer bit patterns here instead of multiplying.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

F32_EXP_BIAS = 127
F32_MANT_BITS = 23


def f32_bits(x: jnp.ndarray) -> jnp.ndarray:
    """fp32 (or narrower float, widened exactly) -> uint32 bit pattern."""
    if x.dtype == jnp.bfloat16:
        # Widen by shifting: exact for subnormals too, whatever the FPU flags say.
        return lax.bitcast_convert_type(x, jnp.uint16).astype(jnp.uint32) << 16
    return lax.bitcast_convert_type(x.astype(jnp.float32), jnp.uint32)


def bf16_from_f32_bits(bits: jnp.ndarray) -> jnp.ndarray:
    """bfloat16 nearest-even rounding of fp32 bit patterns, done on the integers (exact for
    subnormals, which XLA's CPU conversion flushes); NaN stays NaN."""
    bits = bits.astype(jnp.uint32)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    is_nan = (bits & 0x7FFFFFFF) > 0x7F800000
    half = jnp.where(is_nan, (bits >> 16) | 0x40, rounded).astype(jnp.uint16)
    return lax.bitcast_convert_type(half, jnp.bfloat16)


def widen_rounded(x: jnp.ndarray) -> jnp.ndarray:
    """The fp32 values of a float array that was just rounded to a narrower type.

    XLA's GPU compiler allows excess precision by default and folds a chain of conversions
    ``f32 -> f8 (or bf16) -> f32`` into nothing, silently skipping the rounding. The
    optimization barrier keeps the narrow array as a value of its own, so the rounding stays.
    """
    return lax.optimization_barrier(x).astype(jnp.float32)


def f32_from_bits(bits: jnp.ndarray) -> jnp.ndarray:
    """uint32 bit pattern -> fp32."""
    return lax.bitcast_convert_type(bits.astype(jnp.uint32), jnp.float32)


def exact_div(numerator: jnp.ndarray, denominator: jnp.ndarray) -> jnp.ndarray:
    """Correctly rounded fp32 ``numerator / denominator`` (``denominator`` broadcasts).

    XLA's CPU backend rewrites a division by a constant or a broadcast into a multiplication by
    the reciprocal, which is off by an ulp for about half the inputs. The optimization barrier
    hides the divisor from that rewrite.
    """
    divisor = jnp.broadcast_to(jnp.asarray(denominator, jnp.float32), jnp.shape(numerator))
    return numerator / lax.optimization_barrier(divisor)


def pow2(k: jnp.ndarray) -> jnp.ndarray:
    """fp32 ``2**k`` for integer ``k`` in [-126, 127] (always a normal number)."""
    k = jnp.asarray(k, jnp.int32)
    return f32_from_bits(((k + F32_EXP_BIAS).astype(jnp.uint32)) << F32_MANT_BITS)


def mul_pow2(x: jnp.ndarray, k: jnp.ndarray) -> jnp.ndarray:
    """``x * 2**k`` for normal fp32 ``x`` and any integer ``k`` in [-252, 254].

    Exact whenever the result is a normal fp32 number; the factor is applied in two normal
    steps so that neither ``2**k`` nor an intermediate leaves the normal range needlessly.
    """
    k = jnp.asarray(k, jnp.int32)
    k1 = jnp.clip(k, -126, 127)
    k2 = jnp.clip(k - k1, -126, 127)
    return x * pow2(k1) * pow2(k2)


def exact_scaled_f32(bits: jnp.ndarray, k: jnp.ndarray) -> jnp.ndarray:
    """The fp32 value ``float(bits) * 2**k``, exact even when ``float(bits)`` is subnormal.

    ``bits`` is a uint32 fp32 pattern (any value, subnormals included); ``k`` an integer array.
    The result is exact whenever it is a normal fp32 number; smaller results may flush to a
    signed zero (callers only use results far above 2**-126). Inf and NaN pass through.
    """
    bits = bits.astype(jnp.uint32)
    sign = bits & jnp.uint32(0x80000000)
    exp_field = ((bits >> F32_MANT_BITS) & 0xFF).astype(jnp.int32)
    mant = (bits & 0x7FFFFF).astype(jnp.int32)
    significand = jnp.where(exp_field > 0, mant | 0x800000, mant)  # integer, < 2**24: exact
    exponent = jnp.maximum(exp_field, 1) - (F32_EXP_BIAS + F32_MANT_BITS) + k
    magnitude = mul_pow2(significand.astype(jnp.float32), exponent)
    signed = f32_from_bits(f32_bits(magnitude) | sign)
    return jnp.where(exp_field == 0xFF, f32_from_bits(bits), signed)
