"""Floating-point helpers: exact fp32 fused multiply-add, correctly rounded transcendentals,
and the narrow formats (bf16, f16, fp8 e4m3/e5m2 in OCP and FNUZ flavours, fp4 e2m1, e8m0).

All functions take and return numpy arrays (any shape) and never depend on the platform's
floating-point environment beyond IEEE round-to-nearest-even in float32/float64 arithmetic.
Where an instruction's exact hardware behaviour is not published (transcendentals are about
1 ulp on the hardware), the emulator computes the correctly rounded result; the README says
which rules come from which source.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

F32_SIGN = np.uint32(0x80000000)
F32_ABS = np.uint32(0x7FFFFFFF)
F32_QUIET = np.uint32(0x00400000)


def f32(bits: np.ndarray) -> np.ndarray:
    return bits.view(np.float32)


def bits32(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, np.float32).view(np.uint32)


def is_nan_bits(bits: np.ndarray) -> np.ndarray:
    return (bits & F32_ABS) > np.uint32(0x7F800000)


def is_snan_bits(bits: np.ndarray) -> np.ndarray:
    return is_nan_bits(bits) & ((bits & F32_QUIET) == 0)


def quiet(bits: np.ndarray) -> np.ndarray:
    """NaNs quieted (the quiet bit set, payload kept); other values unchanged."""
    return np.where(is_nan_bits(bits), bits | F32_QUIET, bits)


# ---- exact rounding of a float64 with a known error to float32 --------------------------------

def _round_to_odd(s: np.ndarray, err: np.ndarray) -> np.ndarray:
    """``s + err`` (s float64, |err| below half an ulp of s) as a float64 rounded to odd:
    when err is non-zero and s is even, step s one ulp towards the exact value. A float64
    rounded to odd and then rounded to float32 gives the correctly rounded float32 (53 bits
    leave more than the two guard bits double rounding needs)."""
    bits = s.view(np.uint64)
    inexact = (err != 0) & np.isfinite(s) & ((bits & np.uint64(1)) == 0)
    if not inexact.any():
        return s
    towards_larger_magnitude = (err > 0) == (s > 0)
    step = np.where(towards_larger_magnitude, np.uint64(1), np.uint64(2**64 - 1))
    fixed = (bits + np.where(inexact, step, np.uint64(0))).view(np.float64)
    return np.where(inexact & (s != 0), fixed, s)


def fma_f32(a: np.ndarray, b: np.ndarray, c: np.ndarray, scale_exp=None) -> np.ndarray:
    """fp32 ``(a*b + c) * 2**scale_exp`` with one rounding (IEEE fusedMultiplyAdd, RNE),
    denormals kept (``scale_exp``: None, or an int array for V_DIV_FMAS_F32's post-scale).

    a*b is exact in float64 (24+24 bits); the float64 sum is made exact-to-odd with
    TwoSum's error term, scaled by a power of two (exact), then rounded once to float32.
    """
    with np.errstate(all="ignore"):
        a64 = np.asarray(a, np.float64)
        p = a64 * np.asarray(b, np.float64)
        c64 = np.asarray(c, np.float64)
        s = p + c64
        bb = s - p
        err = (p - (s - bb)) + (c64 - bb)
        err = np.where(np.isfinite(err), err, 0.0)
        s = _round_to_odd(s, err)
        if scale_exp is not None:
            s = np.ldexp(s, np.asarray(scale_exp, np.int32))
        return s.astype(np.float32)


def f32_exponent(x: np.ndarray) -> np.ndarray:
    """Biased exponent field of float32 values, as int64."""
    return ((np.asarray(x, np.float32).view(np.uint32) >> 23) & 0xFF).astype(np.int64)


def is_denormal_f32(x: np.ndarray) -> np.ndarray:
    bits = np.asarray(x, np.float32).view(np.uint32)
    return ((bits & np.uint32(0x7F800000)) == 0) & ((bits & np.uint32(0x7FFFFF)) != 0)


def div_scale_f32(s0, s1, s2):
    """V_DIV_SCALE_F32 (S0 = the value to scale, S1 = denominator, S2 = numerator):
    (result, vcc). The CDNA4 ISA pseudocode, with the result S0 where no branch assigns it;
    ``S2/S1 == DENORM`` read as "the fp32 quotient is below the normal range" and the f64
    reciprocal tests (never true for fp32 inputs) dropped."""
    s0, s1, s2 = (np.asarray(x, np.float32) for x in (s0, s1, s2))
    with np.errstate(all="ignore"):
        q = np.abs(s2.astype(np.float64) / s1.astype(np.float64))
        up = np.ldexp(s0, 64).astype(np.float32)
    e1, e2 = f32_exponent(s1), f32_exponent(s2)
    zero = (s2 == 0) | (s1 == 0)
    big = ~zero & (e2 - e1 >= 96)
    den_denormal = ~zero & ~big & is_denormal_f32(s1)
    tiny_quotient = ~zero & ~big & ~den_denormal & (q > 0) & (q < 2.0**-126)
    tiny_num = ~zero & ~big & ~den_denormal & ~tiny_quotient & (e2 <= 23)
    out = np.where(zero, np.float32(np.nan), s0)
    out = np.where(big & (s0 == s1), up, out)
    out = np.where(den_denormal | tiny_num, up, out)
    out = np.where(tiny_quotient & (s0 == s2), up, out)
    return out.astype(np.float32), big | tiny_quotient


def div_fmas_f32(a, b, c, vcc):
    """V_DIV_FMAS_F32: fma(a, b, c), post-scaled when VCC by 2**64 if |c| >= 2 (the quotient was
    computed against a denominator scaled up) else 2**-64 (numerator scaled up), one rounding.
    The ISA pseudocode prints a 2**32 factor that does not undo div_scale's 2**64; the
    exponent-dependent form is tinygrad's, from its hardware tests (see README)."""
    c = np.asarray(c, np.float32)
    k = np.where(vcc, np.where(f32_exponent(c) > 127, 64, -64), 0)
    return fma_f32(a, b, c, k)


def div_fixup_f32(s0, s1, s2):
    """V_DIV_FIXUP_F32 (S0 = quotient, S1 = denominator, S2 = numerator), after the ISA
    pseudocode (first matching case wins)."""
    s0, s1, s2 = (np.asarray(x, np.float32) for x in (s0, s1, s2))
    sign = np.signbit(s1) ^ np.signbit(s2)
    inf = np.where(sign, -np.inf, np.inf).astype(np.float32)
    zero = np.where(sign, -0.0, 0.0).astype(np.float32)
    nan = np.float32(np.nan)
    e1, e2 = f32_exponent(s1), f32_exponent(s2)
    with np.errstate(invalid="ignore"):
        cases = [
            (np.isnan(s2), quiet(s2.view(np.uint32)).view(np.float32)),
            (np.isnan(s1), quiet(s1.view(np.uint32)).view(np.float32)),
            ((s1 == 0) & (s2 == 0), np.float32(-nan)),
            ((np.abs(s1) == np.inf) & (np.abs(s2) == np.inf), np.float32(-nan)),
            ((s1 == 0) | (np.abs(s2) == np.inf), inf),
            ((np.abs(s1) == np.inf) | (s2 == 0), zero),
            (e2 - e1 < -150, zero),
            (e1 == 255, inf),
            (np.isnan(s0), inf),
        ]
        out = np.where(sign, -np.abs(s0), np.abs(s0))
        for cond, value in reversed(cases):
            out = np.where(cond, value, out)
    return out.astype(np.float32)


def _correct_from_midpoint(q64: np.ndarray, below: np.ndarray) -> np.ndarray:
    """Round a float64 approximation ``q64`` of an exact real to float32. If q64 sits exactly
    on a float32 rounding midpoint, ``below`` says whether the exact value is below it (then
    the result rounds down), else up."""
    bits = q64.view(np.uint64)
    midpoint = (bits & np.uint64(0x1FFFFFFF)) == np.uint64(0x10000000)
    if midpoint.any():
        nudged = (bits + np.where(below == (q64 > 0), np.uint64(2**64 - 1),
                                  np.uint64(1))).view(np.float64)
        q64 = np.where(midpoint & np.isfinite(q64) & (q64 != 0), nudged, q64)
    return q64.astype(np.float32)


def rcp_f32(x: np.ndarray) -> np.ndarray:
    """Correctly rounded fp32 1/x (the hardware is about 1 ulp; see README)."""
    with np.errstate(all="ignore"):
        x64 = np.asarray(x, np.float64)
        q = 1.0 / x64
        # exact check at a float32 midpoint m: m*x (25+24 bits) is exact in float64.
        return _correct_from_midpoint(q, q * x64 > 1.0)


def sqrt_f32(x: np.ndarray) -> np.ndarray:
    """Correctly rounded fp32 sqrt."""
    with np.errstate(all="ignore"):
        x64 = np.asarray(x, np.float64)
        q = np.sqrt(x64)
        return _correct_from_midpoint(q, q * q > x64)


def rsq_f32(x: np.ndarray) -> np.ndarray:
    """fp32 1/sqrt(x), rounded from float64 (about 0.5 ulp)."""
    with np.errstate(all="ignore"):
        return (1.0 / np.sqrt(np.asarray(x, np.float64))).astype(np.float32)


def flush_denormal_f32(x: np.ndarray) -> np.ndarray:
    """Denormal float32 values replaced by zero of the same sign."""
    bits = x.view(np.uint32)
    denormal = ((bits & np.uint32(0x7F800000)) == 0) & ((bits & np.uint32(0x7FFFFF)) != 0)
    return np.where(denormal, (bits & F32_SIGN).view(np.float32), x)


def exp2_f32(x: np.ndarray) -> np.ndarray:
    """v_exp_f32: 2**x rounded from a float64 evaluation, denormal results flushed to +0.

    LLVM's AMDGPU lowering of llvm.exp2.f32 says "v_exp_f32 is good enough for OpenCL, except
    it doesn't handle denormals" and rescales inputs below -126 when denormals are needed
    (AMDGPUISelLowering.cpp, lowerFEXP2); an input that would give a denormal therefore gives 0
    on the hardware.
    """
    with np.errstate(all="ignore"):
        return flush_denormal_f32(np.exp2(np.asarray(x, np.float64)).astype(np.float32))


def log2_f32(x: np.ndarray) -> np.ndarray:
    """v_log_f32: log2(x) rounded from float64; denormal inputs read as zero (LLVM's LowerFLOG2:
    "v_log_f32 ... doesn't handle denormals")."""
    with np.errstate(all="ignore"):
        return np.log2(np.asarray(flush_denormal_f32(np.asarray(x, np.float32)),
                                  np.float64)).astype(np.float32)


# ---- integer conversions -----------------------------------------------------------------------

def f32_to_u32(x: np.ndarray) -> np.ndarray:
    """Truncation toward zero, saturating to [0, 2**32-1]; NaN gives 0."""
    with np.errstate(all="ignore"):
        x64 = np.nan_to_num(np.asarray(x, np.float64), nan=0.0)
        return np.clip(np.trunc(x64), 0, 4294967295.0).astype(np.uint32)


def f32_to_i32(x: np.ndarray) -> np.ndarray:
    """Truncation toward zero, saturating to [-2**31, 2**31-1]; NaN gives 0."""
    with np.errstate(all="ignore"):
        x64 = np.nan_to_num(np.asarray(x, np.float64), nan=0.0)
        return np.clip(np.trunc(x64), -2147483648.0, 2147483647.0).astype(np.int32)


# ---- narrow float formats ------------------------------------------------------------------------

def f32_to_bf16_bits(x_bits: np.ndarray) -> np.ndarray:
    """bf16 RNE of fp32 bits; NaN becomes a quiet NaN with the sign and top payload kept."""
    x_bits = np.asarray(x_bits, np.uint32)
    rounded = (x_bits + np.uint32(0x7FFF) + ((x_bits >> 16) & np.uint32(1))) >> 16
    nan = ((x_bits >> 16) | np.uint32(0x40)) & np.uint32(0xFFFF)
    return np.where(is_nan_bits(x_bits), nan, rounded & np.uint32(0xFFFF)).astype(np.uint32)


def bf16_bits_to_f32(h: np.ndarray) -> np.ndarray:
    return (np.asarray(h, np.uint32) << 16).view(np.float32)


def f32_to_f16_bits(x: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        return np.asarray(x, np.float32).astype(np.float16).view(np.uint16).astype(np.uint32)


def f16_bits_to_f32(h: np.ndarray) -> np.ndarray:
    return (np.asarray(h, np.uint32) & np.uint32(0xFFFF)).astype(np.uint16).view(
        np.float16).astype(np.float32)


FP8_FORMATS = {
    # name: (ml_dtypes type, maximum finite magnitude)
    "e4m3fn": (ml_dtypes.float8_e4m3fn, 448.0),
    "e5m2": (ml_dtypes.float8_e5m2, 57344.0),
    "e4m3fnuz": (ml_dtypes.float8_e4m3fnuz, 240.0),
    "e5m2fnuz": (ml_dtypes.float8_e5m2fnuz, 57344.0),
}


def fp8_formats(arch: str) -> tuple[str, str]:
    """(fp8, bf8) format names: OCP e4m3fn/e5m2 on gfx950, FNUZ on gfx942 (AMD's matrix-core
    blog post: CDNA3 uses the FNUZ variants, CDNA4 the OCP ones)."""
    return ("e4m3fnuz", "e5m2fnuz") if arch == "gfx942" else ("e4m3fn", "e5m2")


def _fp8_decode_table(fmt: str) -> np.ndarray:
    dtype = FP8_FORMATS[fmt][0]
    return np.arange(256, dtype=np.uint8).view(dtype).astype(np.float32)


_FP8_TABLES = {fmt: _fp8_decode_table(fmt) for fmt in FP8_FORMATS}


def fp8_to_f32(codes: np.ndarray, fmt: str) -> np.ndarray:
    """float32 values of fp8 codes (uint8/uint32 array)."""
    return _FP8_TABLES[fmt][np.asarray(codes).astype(np.uint8)]


def f32_to_fp8(x: np.ndarray, fmt: str, saturate: np.ndarray | bool) -> np.ndarray:
    """fp8 codes (uint32) of float32 values, round to nearest even.

    Without saturation a finite value that rounds past the largest finite code gives NaN (the
    OCP e4m3 and both FNUZ formats have no infinity) or infinity (e5m2); with ``saturate``
    (MODE.FP16_OVFL set) it clamps to the largest finite code of its sign. NaN inputs give the
    format's NaN; infinities give NaN (e4m3, FNUZ) or infinity (e5m2) either way.
    """
    dtype, top = FP8_FORMATS[fmt]
    x = np.asarray(x, np.float32)
    with np.errstate(all="ignore"):
        codes = x.astype(dtype).view(np.uint8).astype(np.uint32)
        if np.any(saturate):
            finite = np.isfinite(x)
            clamped = np.clip(x, -top, top).astype(dtype).view(np.uint8).astype(np.uint32)
            codes = np.where(np.asarray(saturate) & finite, clamped, codes)
    return codes


FP4_VALUES = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                       -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], np.float32)


def fp4_to_f32(codes: np.ndarray) -> np.ndarray:
    """float32 values of e2m1 codes (low 4 bits of each element)."""
    return FP4_VALUES[np.asarray(codes).astype(np.uint8) & 15]


def e8m0_scale(exponent: np.ndarray) -> np.ndarray:
    """2**(e-127) as float64 for biased exponents e (0..254); e = 255 gives NaN."""
    e = np.asarray(exponent).astype(np.int64)
    return np.where(e == 255, np.nan, np.ldexp(1.0, (e - 127).astype(np.int32)))


def f32_exponent_field(bits: np.ndarray) -> np.ndarray:
    """The biased exponent bits [30:23] of fp32 bit patterns (the ISA's ``exponent()``)."""
    return (np.asarray(bits, np.uint32) >> 23) & np.uint32(0xFF)


def scale_to_f32(values64: np.ndarray) -> np.ndarray:
    """A float64 product of a narrow-format value and a power of two, rounded to float32
    (exact whenever representable; denormal results kept)."""
    with np.errstate(all="ignore"):
        return np.asarray(values64, np.float64).astype(np.float32)
