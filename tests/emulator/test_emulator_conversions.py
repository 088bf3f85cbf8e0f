"""Conversion and packing instructions of the emulator, run as assembly snippets through its
parser and checked against ml_dtypes (and IEEE float64 arithmetic) over every input class.

"Every input class": all 256 fp4 byte pairs at every byte select and every e8m0 scale byte;
all 65536 fp8 words; every bf16/f16 high half with each low half that decides a rounding
(0, 1, 0x7fff, 0x8000, 0x8001, 0xffff), plus random fp32 values.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from snippets import as_f32, f32_bits, run_snippet

E4M3 = {"gfx950": ml_dtypes.float8_e4m3fn, "gfx942": ml_dtypes.float8_e4m3fnuz}
E5M2 = {"gfx950": ml_dtypes.float8_e5m2, "gfx942": ml_dtypes.float8_e5m2fnuz}
ROUNDING_LOWS = np.array([0, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF], np.uint32)


def rounding_set(rng, extra=4096) -> np.ndarray:
    """fp32 bit patterns: every high half with each deciding low half, then random ones."""
    highs = np.arange(65536, dtype=np.uint32) << np.uint32(16)
    grid = (highs[:, None] | ROUNDING_LOWS[None, :]).reshape(-1)
    return np.concatenate([grid, rng.integers(0, 2**32, extra, dtype=np.uint64).astype(
        np.uint32)])


def same_bits_or_both_nan(got_f32, want_f32):
    got, want = np.asarray(got_f32, np.float32), np.asarray(want_f32, np.float32)
    both_nan = np.isnan(got) & np.isnan(want)
    return (got.view(np.uint32) == want.view(np.uint32)) | both_nan


def test_cvt_scalef32_pk_f32_fp4_every_byte_select_and_scale(rng):
    """v_cvt_scalef32_pk_f32_fp4 vD[0:1], vS, vScale [op_sel:[x,y,0]]: byte x + 2y of vS,
    low nibble to D.lo, each e2m1 times 2**(exponent(vScale) - 127); only the scale's exponent
    field counts (random sign and mantissa here). ml_dtypes' e2m1 decode is the reference.
    (Mutation: taking the high nibble first fails here.)"""
    b, e = np.meshgrid(np.arange(256), np.arange(256), indexing="ij")
    b, e = b.ravel().astype(np.uint32), e.ravel().astype(np.uint32)
    src = b | ((b + 1) % 256) << 8 | ((b + 2) % 256) << 16 | ((b + 3) % 256) << 24
    noise = rng.integers(0, 2**23, b.size, dtype=np.uint32) | (
        rng.integers(0, 2, b.size, dtype=np.uint32) << 31)
    scale = (e << np.uint32(23)) | noise
    body = """
        v_cvt_scalef32_pk_f32_fp4 v[10:11], v2, v3
        v_cvt_scalef32_pk_f32_fp4 v[12:13], v2, v3 op_sel:[1,0,0]
        v_cvt_scalef32_pk_f32_fp4 v[14:15], v2, v3 op_sel:[0,1,0]
        v_cvt_scalef32_pk_f32_fp4 v[16:17], v2, v3 op_sel:[1,1,0]
        v_cvt_scalef32_pk_f32_fp4 v[18:19], v2, 1.0
    """
    out = run_snippet(body, [src, scale], [f"v{i}" for i in range(10, 20)])
    factor = np.where(e == 255, np.nan, np.ldexp(1.0, e.astype(np.int32) - 127))
    for sel in range(4):
        byte = (b + sel) % 256
        for half in range(2):
            code = ((byte >> (4 * half)) & 15).astype(np.uint8)
            value = code.view(ml_dtypes.float4_e2m1fn).astype(np.float64)
            with np.errstate(over="ignore"):
                want = (value * factor).astype(np.float32)
            assert same_bits_or_both_nan(as_f32(out[2 * sel + half]), want).all(), (sel, half)
    plain = (b & 15).astype(np.uint8).view(ml_dtypes.float4_e2m1fn).astype(np.float32)
    assert same_bits_or_both_nan(as_f32(out[8]), plain).all()


@pytest.mark.parametrize("arch", ["gfx950", "gfx942"])
@pytest.mark.parametrize("fp16_overflow", [0, 1])
def test_cvt_pk_fp8_f32_rounding_words_and_saturation(rng, arch, fp16_overflow):
    """v_cvt_pk_fp8_f32 vD, a, b [op_sel:[0,0,1]]: {fp8(b), fp8(a)} into the low (high) word
    of vD, the other word kept; RNE; OCP e4m3fn on gfx950, e4m3fnuz on gfx942. MODE.FP16_OVFL
    clear: overflow gives NaN (ml_dtypes' non-saturating cast); set: finite values saturate to
    +-max. (Mutation: writing the high word for the plain form fails here.)"""
    x = rounding_set(rng)
    x = x[: x.size // 2 * 2]
    a, b = x[0::2], x[1::2]
    old = rng.integers(0, 2**32, a.size, dtype=np.uint64).astype(np.uint32)
    body = """
        v_mov_b32_e32 v10, v4
        v_cvt_pk_fp8_f32 v10, v2, v3
        v_mov_b32_e32 v11, v4
        v_cvt_pk_fp8_f32 v11, v2, v3 op_sel:[0,0,1]
    """
    lo, hi = run_snippet(body, [a, b, old], ["v10", "v11"], arch=arch,
                         fp16_overflow=fp16_overflow)
    fmt = E4M3[arch]
    top = float(ml_dtypes.finfo(fmt).max)

    def fp8(bits):
        v = as_f32(bits)
        if fp16_overflow:
            v = np.where(np.isfinite(v), np.clip(v, -top, top), v).astype(np.float32)
        with np.errstate(invalid="ignore", over="ignore"):
            return v.astype(fmt).view(np.uint8).astype(np.uint32)
    word = fp8(a) | fp8(b) << 8
    finite = np.isfinite(as_f32(a)) & np.isfinite(as_f32(b))
    check = finite if fp16_overflow else np.ones(a.size, bool)
    np.testing.assert_array_equal(lo[check], ((old & 0xFFFF0000) | word)[check])
    np.testing.assert_array_equal(hi[check], ((old & 0xFFFF) | word << 16)[check])


def test_cvt_pk_bf16_f32_rounds_to_nearest_even(rng):
    """v_cvt_pk_bf16_f32 vD, a, b: {bf16(b), bf16(a)}, RNE, against ml_dtypes' bfloat16 cast
    (NaN inputs: a NaN out, payload not compared). (Mutation: truncating instead of rounding
    fails here.)"""
    x = rounding_set(rng)
    x = x[: x.size // 2 * 2]
    a, b = x[0::2], x[1::2]
    (out,) = run_snippet("v_cvt_pk_bf16_f32 v10, v2, v3", [a, b], ["v10"])
    for half, src in ((0, a), (1, b)):
        got = ((out >> (16 * half)) & 0xFFFF).astype(np.uint16).view(ml_dtypes.bfloat16)
        with np.errstate(invalid="ignore"):
            want = as_f32(src).astype(ml_dtypes.bfloat16)
        same = got.view(np.uint16) == want.view(np.uint16)
        assert (same | (np.isnan(got.astype(np.float32)) & np.isnan(want.astype(np.float32)))
                ).all()


def test_cvt_f16_f32_and_back(rng):
    """v_cvt_f16_f32 (RNE, high half zeroed on gfx9) and v_cvt_f32_f16 over every f16 pattern
    and the fp32 rounding set, against numpy's float16."""
    x = rounding_set(rng)
    halves = np.arange(65536, dtype=np.uint32)
    n = max(x.size, halves.size)
    xs = np.resize(x, n)
    hs = np.resize(halves, n)
    body = """
        v_cvt_f16_f32_e32 v10, v2
        v_cvt_f32_f16_e32 v11, v3
    """
    to_half, to_single = run_snippet(body, [xs, hs], ["v10", "v11"])
    with np.errstate(over="ignore", invalid="ignore"):
        want_h = as_f32(xs).astype(np.float16).view(np.uint16).astype(np.uint32)
    nan = np.isnan(as_f32(xs))
    np.testing.assert_array_equal(to_half[~nan], want_h[~nan])
    assert np.isnan(to_half[nan].astype(np.uint16).view(np.float16)).all()
    want_s = hs.astype(np.uint16).view(np.float16).astype(np.float32)
    assert same_bits_or_both_nan(as_f32(to_single), want_s).all()


@pytest.mark.parametrize("arch", ["gfx950", "gfx942"])
def test_scaled_fp8_word_conversions(arch):
    """v_cvt_scalef32_pk_f32_fp8 / _pk_f16_fp8 / _pk_bf16_fp8 (word OPSEL[0], scale 1.0; the
    bf16 form is Triton's gfx950 fp8 -> bf16 widening) over all 65536
    words, and v_cvt_scalef32_pk_fp8_f32 back (dst word OPSEL[3]); the architecture's fp8."""
    words = np.arange(65536, dtype=np.uint32)
    src = words | (words[::-1] << 16)
    body = """
        v_cvt_scalef32_pk_f32_fp8 v[10:11], v2, 1.0
        v_cvt_scalef32_pk_f32_fp8 v[12:13], v2, 1.0 op_sel:[1,0,0]
        v_cvt_scalef32_pk_f16_fp8 v14, v2, 1.0
        v_cvt_scalef32_pk_f16_fp8 v15, v2, 1.0 op_sel:[1,0,0]
        v_mov_b32_e32 v16, 0
        v_cvt_scalef32_pk_fp8_f32 v16, v10, v11, 1.0
        v_cvt_scalef32_pk_fp8_f32 v16, v12, v13, 1.0 op_sel:[0,0,0,1]
        v_cvt_scalef32_pk_bf16_fp8 v17, v2, 1.0
        v_cvt_scalef32_pk_bf16_fp8 v18, v2, 1.0 op_sel:[1,0,0]
    """
    out = run_snippet(body, [src], [f"v{i}" for i in range(10, 19)], arch=arch)
    fmt = E4M3[arch]
    for word_sel, (lo_reg, hi_reg, half_reg) in enumerate(((0, 1, 4), (2, 3, 5))):
        word = (src >> (16 * word_sel)) & 0xFFFF
        for byte, reg in ((0, lo_reg), (1, hi_reg)):
            code = ((word >> (8 * byte)) & 0xFF).astype(np.uint8)
            want = code.view(fmt).astype(np.float32)
            assert same_bits_or_both_nan(as_f32(out[reg]), want).all()
            half = ((out[half_reg] >> (16 * byte)) & 0xFFFF).astype(np.uint16).view(np.float16)
            assert same_bits_or_both_nan(half.astype(np.float32), want).all()
            brain = (out[7 + word_sel] >> (16 * byte)) & 0xFFFF
            assert same_bits_or_both_nan(as_f32(brain << 16), want).all()
    finite = np.isfinite(as_f32(out[0])) & np.isfinite(as_f32(out[1])) & np.isfinite(
        as_f32(out[2])) & np.isfinite(as_f32(out[3]))
    if arch == "gfx950":  # -0 has no FNUZ code, so only the OCP format round-trips exactly
        np.testing.assert_array_equal(out[6][finite], src[finite])


def test_division_idiom_is_ieee_division(rng):
    """LLVM's fp32 division expansion (v_div_scale x2, v_rcp, fma Newton steps, v_div_fmas,
    v_div_fixup; as the FlyDSL kernels contain it) equals IEEE fp32 division on random bit
    patterns (every exponent range: denormal, huge and tiny quotients) and special values.
    (Mutation: applying v_div_fmas' 2**64 post-scale after rounding instead of before fails
    here on denormal quotients.)"""
    n = 32768
    num = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)
    den = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)
    special = f32_bits(np.array([0, -0.0, 1, 3, 448, 2**-149, 2**-126, 3e38, np.inf, -np.inf,
                                 np.nan, 1e-40], np.float32))
    num[: special.size**2] = np.repeat(special, special.size)
    den[: special.size**2] = np.tile(special, special.size)
    body = """
        v_div_scale_f32 v20, s[10:11], v3, v3, v2
        v_rcp_f32_e32 v21, v20
        v_div_scale_f32 v22, vcc, v2, v3, v2
        v_fma_f32 v23, -v20, v21, 1.0
        v_fmac_f32_e32 v21, v23, v21
        v_mul_f32_e32 v23, v22, v21
        v_fma_f32 v24, -v20, v23, v22
        v_fmac_f32_e32 v23, v24, v21
        v_fma_f32 v20, -v20, v23, v22
        v_div_fmas_f32 v20, v20, v21, v23
        v_div_fixup_f32 v25, v20, v3, v2
    """
    (out,) = run_snippet(body, [num, den], ["v25"])
    with np.errstate(all="ignore"):
        want = (as_f32(num).astype(np.float64) / as_f32(den).astype(np.float64)).astype(
            np.float32)
    assert same_bits_or_both_nan(as_f32(out), want).all()


def test_transcendentals_are_correctly_rounded(rng):
    """v_rcp_f32 and v_sqrt_f32 correctly rounded (exact midpoint test), v_exp_f32 = 2**x
    rounded from float64 with denormal results flushed to +0 (LLVM: "v_exp_f32 ... doesn't
    handle denormals"), v_log_f32 = log2 with denormal inputs read as 0."""
    x = rng.integers(0, 2**32, 65536, dtype=np.uint64).astype(np.uint32)
    small = f32_bits(rng.uniform(-160, 10, 65536).astype(np.float32))
    body = """
        v_rcp_f32_e32 v10, v2
        v_sqrt_f32_e32 v11, v2
        v_exp_f32_e32 v12, v3
        v_log_f32_e32 v13, v2
    """
    rcp, sqrt, exp2, log2 = run_snippet(body, [x, small], ["v10", "v11", "v12", "v13"])
    with np.errstate(all="ignore"):
        xs = as_f32(x).astype(np.float64)
        assert same_bits_or_both_nan(as_f32(rcp), (1.0 / xs).astype(np.float32)).all()
        assert same_bits_or_both_nan(as_f32(sqrt), np.sqrt(xs).astype(np.float32)).all()
        want = np.exp2(as_f32(small).astype(np.float64)).astype(np.float32)
        want = np.where(np.abs(want) < np.float32(2.0**-126), np.float32(0), want)
        assert same_bits_or_both_nan(as_f32(exp2), want).all()
        denormal = (np.abs(as_f32(x)) < 2.0**-126) & (as_f32(x) != 0)
        want_log = np.where(denormal, -np.inf, np.log2(xs)).astype(np.float32)
        assert same_bits_or_both_nan(as_f32(log2), want_log).all()


def test_maximum3_and_minimum3_propagate_nan():
    """v_maximum3_f32 / v_minimum3_f32 (IEEE 754-2019 maximum / minimum, what LLVM lowers
    ``llvm.maximum`` to on gfx950; the FlyDSL kernels' NaN-keeping max): any NaN input gives
    NaN; else the max / min with ``+0 > -0``. (Mutation: taking v_max3_f32's rule, which
    ignores a quiet NaN, fails here.)"""
    nan, inf = np.float32(np.nan), np.float32(np.inf)
    a = np.array([1, nan, 3, -0.0, 0.0, -inf, 2, 5], np.float32)
    b = np.array([2, 1, nan, 0.0, -0.0, -inf, 2, -7], np.float32)
    c = np.array([0, 0, 0, -0.0, -0.0, nan, 1, inf], np.float32)
    got_max, got_min = run_snippet("v_maximum3_f32 v10, v2, v3, v4\nv_minimum3_f32 v11, v2, v3, v4",
                                   [a.view(np.uint32), b.view(np.uint32), c.view(np.uint32)],
                                   ["v10", "v11"])
    got_max, got_min = got_max[:8].view(np.float32), got_min[:8].view(np.float32)
    nan_in = np.isnan(a) | np.isnan(b) | np.isnan(c)
    assert (np.isnan(got_max) == nan_in).all() and (np.isnan(got_min) == nan_in).all()
    ok = ~nan_in
    want_max = np.maximum(np.maximum(a, b), c)[ok]
    want_min = np.minimum(np.minimum(a, b), c)[ok]
    np.testing.assert_array_equal(got_max[ok], want_max)
    np.testing.assert_array_equal(got_min[ok], want_min)
    signs = np.signbit(got_max[ok]), np.signbit(got_min[ok])
    assert not signs[0][2] and signs[1][2]  # rows 3 and 4: max +0, min -0


def test_pk_mov_b32_takes_each_half_from_op_sel():
    """v_pk_mov_b32 vD[0:1], vA[0:1], vB[0:1] op_sel:[x,y]: D.lo = A's dword x, D.hi = B's dword
    y; op_sel_hi plays no part (LLVM copies a pair as op_sel:[0,1] and swaps its halves as
    op_sel:[1,0]). (Mutation: taking D.hi from B's dword op_sel_hi[1], the rule of the other
    v_pk_*_f32, fails the swap rows; that bug poisoned the FlyDSL index scorer's NaN flags.)"""
    a0, a1, b0, b1 = (np.arange(8, dtype=np.uint32) + 100 * k for k in range(1, 5))
    outs = run_snippet("""
        v_pk_mov_b32 v[10:11], v[2:3], v[4:5] op_sel:[1,0]
        v_pk_mov_b32 v[12:13], v[2:3], v[4:5] op_sel:[0,1]
        v_pk_mov_b32 v[14:15], v[2:3], v[4:5]
        v_pk_mov_b32 v[16:17], v[2:3], v[2:3] op_sel:[1,0]""",
                       [a0, a1, b0, b1], ["v10", "v11", "v12", "v13", "v14", "v15", "v16", "v17"])
    want = [a1, b0, a0, b1, a0, b0, a1, a0]
    for got, expected in zip(outs, want, strict=True):
        np.testing.assert_array_equal(got[:8], expected)


def test_cmp_class_f32_names_every_class():
    """v_cmp_class_f32 vcc, x, mask: set where x's class bit is in the mask (bit 0 signaling
    NaN, 1 quiet NaN, 2 -inf, 3 -normal, 4 -denormal, 5 -0, 6 +0, 7 +denormal, 8 +normal,
    9 +inf); Triton's NaN checks use it. Each of the ten values is tested against every
    single-bit mask and one mixed mask. (Mutation: swapping the quiet and signaling NaN bits
    fails here.)"""
    values = np.array([0x7F800001, 0x7FC00000, 0xFF800000, 0xBF800000, 0x80000001, 0x80000000,
                       0x00000000, 0x00000001, 0x3F800000, 0x7F800000], np.uint32)
    x = np.tile(values, 11)
    masks = np.concatenate([np.repeat(1 << np.arange(10, dtype=np.uint32), 10),
                            np.full(10, 0b1000000011, np.uint32)])  # NaNs and +inf
    got, = run_snippet("""
        v_cmp_class_f32_e64 s[10:11], v2, v3
        v_cndmask_b32_e64 v10, 0, 1, s[10:11]""", [x, masks], ["v10"])
    want = np.concatenate([np.eye(10, dtype=np.uint32).reshape(-1),
                           np.array([1, 1, 0, 0, 0, 0, 0, 0, 0, 1], np.uint32)])
    np.testing.assert_array_equal(got[:110], want)


def test_cndmask_abs_and_neg_act_on_the_sign_bit():
    """v_cndmask_b32_e64 with |x| / -x sources (Triton's NaN-aware max emits them): the fp32
    sign bit cleared / flipped, NaN payloads kept, before the select."""
    x = np.array([0xBF800000, 0x3F800000, 0xFFC00001, 0x80000000] * 2, np.uint32)
    cond = np.array([1, 1, 1, 1, 0, 0, 0, 0], np.uint32)
    got_abs, got_neg = run_snippet("""
        v_cmp_ne_u32_e64 s[10:11], 0, v3
        v_cndmask_b32_e64 v10, 7, |v2|, s[10:11]
        v_cndmask_b32_e64 v11, -v2, 7, s[10:11]""", [x, cond], ["v10", "v11"])
    sign = np.uint32(0x80000000)
    np.testing.assert_array_equal(got_abs[:8], np.where(cond == 1, x & ~sign, 7))
    np.testing.assert_array_equal(got_neg[:8], np.where(cond == 1, 7, x ^ sign))


def test_bfi_b32_inserts_bits_under_the_mask(rng):
    """v_bfi_b32 D, mask, a, b = (mask & a) | (~mask & b) (CDNA4 ISA V_BFI_B32; Triton's
    gfx942 copysign). (Mutation: (mask & a) | b fails here.)"""
    mask, a, b = (rng.integers(0, 2**32, 64, dtype=np.uint64).astype(np.uint32)
                  for _ in range(3))
    got, = run_snippet("v_bfi_b32 v10, v2, v3, v4", [mask, a, b], ["v10"])
    np.testing.assert_array_equal(got[:64], (mask & a) | (~mask & b))
