"""MXFP4 / MXFP8 codecs (SPEC §1, §1.4, §1.8) against the float64 oracle.

Mutation check: each mutation below was applied to a copy of the package, one edit at a
time, and the tests named after it failed (count of failing parametrizations in brackets;
the listed tests are those that failed, not just the ones meant to catch it).

  * formats.mxfp4_f32_bits: e8m0 byte 0 decoded as 0 instead of 2**-127
    -> test_dequantize_every_byte [4], test_subnormal_inputs [8].
  * formats.unpack_e2m1: nibble order swapped -> test_dequantize_every_byte [4],
    test_dequantize_known_values [2], test_quantize_mxfp4_random [18], test_subnormal_inputs
    [12] (and 84 pool / index-score tests).
  * byte 255 not NaN -> test_dequantize_every_byte [4].
  * subnormal results flushed to 0 -> test_dequantize_every_byte [4], test_subnormal_inputs
    [12].
  * e2m1 tie 0.75 rounded down to 0.5 -> test_quantize_ties [6], test_quantize_mxfp4_random
    [18], test_all_zero_blocks [4], test_subnormal_inputs [12], default_is_up [2].
  * e2m1 tie 2.5 rounded up to 3 -> test_quantize_ties [6], test_quantize_mxfp4_random [18],
    test_all_zero_blocks [6], default_is_up [2].
  * RoundUp "+1" also when amax/6 is an exact power of two (amax = 6*2**k)
    -> test_quantize_ties[up] [2], test_quantize_mxfp4_random[up] [6], default_is_up [2].
  * all-zero block given byte 1 -> test_all_zero_blocks[up] [2], test_subnormal_inputs[up] [4].
  * even mode 0x200000 -> 0x400000 -> test_quantize_ties[even] [2],
    test_quantize_mxfp4_random[even] [6], test_all_zero_blocks [2], test_subnormal_inputs [4].
  * down mode exponent - 1 instead of - 2 -> same four tests [down] [2, 6, 2, 4].
  * quantize_mxfp4 input not rounded to bf16 (fp32 bits used)
    -> test_quantize_mxfp4_random[float32/float16] [12].
  * MXFP8 scale threshold M7 > 96 -> >= 96 -> test_mxfp8_scale_every_bf16_amax [2],
    test_mxfp8_edge_blocks [4], test_mxfp8_random_blocks [2].
  * MXFP8 values scaled by 2**(126-sb) -> the same three tests [2, 4, 2].
  (e4m3 saturation is checked through index_scores: see test_index_scores.py.)
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import oracle
import pytest
from conftest import BF16, E4M3, call

import jax_mxfp4 as jm

SCALE_BYTES = [0, 1, 2, 100, 119, 127, 133, 150, 253, 254, 255]
ROUND_MODES = ["up", "even", "down"]
DTYPES = {"float32": np.float32, "bfloat16": BF16}


# ---------------------------------------------------------------------------------------------
# Dequantization: every data byte x a spread of scale bytes, bit for bit
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_dequantize_every_byte(impl, dtype):
    # 256 data bytes = 4 token rows of 64 bytes; one uniform scale byte per case ...
    packed = np.tile(np.arange(256, dtype=np.uint8).reshape(4, 64), (len(SCALE_BYTES), 1, 1))
    scales = np.repeat(np.array(SCALE_BYTES, np.uint8)[:, None, None], 4, 1).repeat(4, 2)
    # ... plus rows where every 32-block of a row has its own byte (scale/block alignment).
    mixed_scales = np.resize(np.array(SCALE_BYTES, np.uint8), 11 * 4 * 4).reshape(11, 4, 4)
    packed = np.concatenate([packed, packed])
    scales = np.concatenate([scales, mixed_scales])
    got = call(impl, "dequantize_mxfp4", packed, scales, dtype=DTYPES[dtype])
    want = oracle.dequant_mxfp4_as(packed, scales, DTYPES[dtype])
    assert got.dtype == want.dtype and got.shape == (22, 4, 128)
    same = oracle.bits_equal(got, want)
    assert same.all(), (
        f"{(~same).sum()} mismatches, first at {np.argwhere(~same)[0]}: "
        f"got {got[~same][:4]} want {want[~same][:4]}"
    )


def test_dequantize_known_values(impl):
    # Hand-computed: byte 0x71 = code 1 (0.5) low, code 7 (6) high; scale 128 -> x2.
    packed = np.zeros((1, 64), np.uint8)
    packed[0, 0] = 0x71
    packed[0, 16] = 0x8F  # code 15 (-6) low, code 8 (-0) high; block 1
    scales = np.array([[128, 1, 127, 127]], np.uint8)
    got = call(impl, "dequantize_mxfp4", packed, scales, dtype=np.float32)
    assert got[0, 0] == 1.0 and got[0, 1] == 12.0
    assert got[0, 32] == -6.0 * 2.0**-126
    assert got[0, 33] == 0 and np.signbit(got[0, 33])
    assert got[0, 2:32].tolist() == [0.0] * 30


# ---------------------------------------------------------------------------------------------
# MXFP4 quantization
# ---------------------------------------------------------------------------------------------

# (input in units of the block scale, expected e2m1 value) — SPEC §1.4 item 5.
TIES = [(0.25, 0.0), (0.75, 1.0), (1.25, 1.0), (1.75, 2.0), (2.5, 2.0), (3.5, 4.0), (5.0, 4.0),
        (5.5, 6.0), (0.5, 0.5), (3.0, 3.0), (0.1875, 0.0), (0.3125, 0.5), (2.25, 2.0), (4.5, 4.0)]


@pytest.mark.parametrize("round_mode", ROUND_MODES)
def test_quantize_ties(impl, round_mode):
    # Each block: amax 6 * 2**k (scale byte 127 + k in every mode) then the tie values.
    ks = [0, -3, 5, -100]
    rows = []
    for k in ks:
        vals = [6.0] + [v for v, _ in TIES] + [-v for v, _ in TIES] + [0.0, -0.25, 1.0]
        vals += [0.0] * (32 - len(vals))
        rows.append(np.array(vals) * 2.0**k)
    x = np.stack(rows).reshape(1, -1)  # [1, 128]
    x = x.astype(BF16)
    assert (x.astype(np.float64) == np.stack(rows).reshape(1, -1)).all()  # bf16-exact inputs
    packed, scales = call(impl, "quantize_mxfp4", x, round_mode=round_mode)
    assert scales.tolist() == [[127 + k for k in ks]]
    want_packed, want_scales = oracle.quantize_mxfp4(x, round_mode)
    np.testing.assert_array_equal(scales, want_scales)
    np.testing.assert_array_equal(packed, want_packed)
    codes = oracle.unpack(packed).reshape(4, 32)
    values = oracle.decode_e2m1(codes)
    expected = [6.0] + [e for _, e in TIES] + [-e for _, e in TIES] + [0.0, -0.0, 1.0]
    n = len(expected)
    for block in range(4):
        assert values[block, :n].tolist() == expected
        assert codes[block, 1 + 2 * len(TIES) + 1] == 8  # -0.25 -> code 8 (-0)


@pytest.mark.parametrize("round_mode", ROUND_MODES)
def test_all_zero_blocks(impl, round_mode):
    rng = np.random.default_rng(7)
    x = oracle.to_bf16(rng.standard_normal((3, 128)))
    x[0] = 0  # a whole row of zeros
    x[1, 32:64] = 0  # one zero block among non-zero ones
    x[2, 96:] = 0
    packed, scales = call(impl, "quantize_mxfp4", x, round_mode=round_mode)
    assert scales[0].tolist() == [0, 0, 0, 0]
    assert scales[1, 1] == 0 and scales[2, 3] == 0
    assert (packed[0] == 0).all() and (packed[1, 16:32] == 0).all()
    assert (packed[2, 48:] == 0).all()
    if round_mode == "up":  # byte 0 only for all-zero blocks
        assert (np.delete(scales.reshape(-1), [0, 1, 2, 3, 5, 11]) >= 1).all()
    want = oracle.quantize_mxfp4(x, round_mode)
    np.testing.assert_array_equal(packed, want[0])
    np.testing.assert_array_equal(scales, want[1])
    back = call(impl, "dequantize_mxfp4", packed, scales, dtype=np.float32)
    assert (back[0].view(np.uint32) == 0).all()  # exact +0.0
    assert (back[1, 32:64].view(np.uint32) == 0).all()


@pytest.mark.parametrize("round_mode", ROUND_MODES)
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_subnormal_inputs(impl, round_mode, dtype):
    rng = np.random.default_rng(11)
    # bf16 subnormals 2**-133 .. 2**-127 and the smallest normals, block amax 2**-127 etc.
    exps = rng.integers(-133, -124, (8, 128))
    x = np.ldexp(rng.choice([-1.0, 1.0, 1.5, -1.75], (8, 128)), exps)
    x[0, :32] = 2.0**-133
    x[0, 32:64] = 0.0
    x[0, 64] = 2.0**-127
    x[0, 65:96] = 2.0**-133 * 3
    x[1, :32] = np.ldexp(1.0, rng.integers(-133, -127, 32))
    x[1, 0] = 2.0**-127
    x = oracle.to_bf16(x).astype(DTYPES[dtype])
    packed, scales = call(impl, "quantize_mxfp4", x, round_mode=round_mode)
    want_packed, want_scales = oracle.quantize_mxfp4(x, round_mode)
    np.testing.assert_array_equal(scales, want_scales)
    np.testing.assert_array_equal(packed, want_packed)
    back = call(impl, "dequantize_mxfp4", packed, scales, dtype=np.float32)
    want_back = oracle.dequant_mxfp4_as(want_packed, want_scales, np.float32)
    assert oracle.bits_equal(back, want_back).all()


def random_mx_input(rng, shape, lo=-30, hi=30):
    """Normal data with one random magnitude per 32-block and a few per-element outliers."""
    blocks = rng.standard_normal((*shape[:-1], shape[-1] // 32, 32))
    blocks *= np.exp2(rng.integers(lo, hi, (*shape[:-1], shape[-1] // 32, 1)))
    blocks *= np.where(rng.random(blocks.shape) < 0.05, 8.0, 1.0)
    return blocks.reshape(shape)


@pytest.mark.parametrize("round_mode", ROUND_MODES)
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_quantize_mxfp4_random(impl, round_mode, dtype):
    rng = np.random.default_rng(3)
    np_dtype = {"float32": np.float32, "float16": np.float16, "bfloat16": BF16}[dtype]
    lo, hi = (-10, 10) if dtype == "float16" else (-60, 60)
    x = random_mx_input(rng, (4, 8, 128), lo, hi)
    if dtype == "float32":
        # values that are not bf16-representable, incl. near-ties of the bf16 rounding
        x = x * (1 + 2.0**-9 + 2.0**-20 * rng.standard_normal(x.shape))
    x = x.astype(np_dtype)
    packed, scales = call(impl, "quantize_mxfp4", x, round_mode=round_mode)
    assert packed.dtype == np.uint8 and packed.shape == (4, 8, 64)
    assert scales.dtype == np.uint8 and scales.shape == (4, 8, 4)
    want_packed, want_scales = oracle.quantize_mxfp4(x, round_mode)
    np.testing.assert_array_equal(scales, want_scales)
    np.testing.assert_array_equal(packed, want_packed)
    back = call(impl, "dequantize_mxfp4", packed, scales, dtype=np.float32)
    assert oracle.bits_equal(back, oracle.dequant_mxfp4_as(want_packed, want_scales,
                                                           np.float32)).all()


def test_quantize_mxfp4_default_is_up(impl):
    rng = np.random.default_rng(5)
    x = oracle.to_bf16(random_mx_input(rng, (4, 8, 128)))
    got = call(impl, "quantize_mxfp4", x)
    want = oracle.quantize_mxfp4(x, "up")
    np.testing.assert_array_equal(got[1], want[1])
    np.testing.assert_array_equal(got[0], want[0])


# ---------------------------------------------------------------------------------------------
# MXFP8
# ---------------------------------------------------------------------------------------------


def test_mxfp8_scale_every_bf16_amax(impl):
    # One block per positive finite bf16 value (0x0001..0x7F7F) and zero: the block holds the
    # value (or its negative) once, the rest smaller-or-equal values.
    amax = np.arange(0, 0x7F80, dtype=np.uint16).view(BF16)
    x = np.zeros((amax.size, 32), BF16)
    x[:, 5] = amax
    x[1::2, 5] = -amax[1::2]
    x[:, 9] = amax  # ties of |x| inside a block
    values, scales = call(impl, "quantize_mxfp8", x)
    want_values, want_scales = oracle.quantize_mxfp8(x)
    assert scales.shape == (amax.size, 1)
    bad = np.flatnonzero(scales[:, 0] != want_scales[:, 0])
    assert bad.size == 0, f"{bad.size} scale mismatches, e.g. amax {amax[bad[:4]]}"
    assert oracle.bits_equal(values, want_values).all()


def test_mxfp8_random_blocks(impl):
    rng = np.random.default_rng(13)
    x = random_mx_input(rng, (5000, 4, 128), -60, 60).astype(np.float32)  # 20000 blocks
    values, scales = call(impl, "quantize_mxfp8", x)
    want_values, want_scales = oracle.quantize_mxfp8(x)
    assert values.dtype == E4M3 and values.shape == x.shape
    np.testing.assert_array_equal(scales, want_scales)
    same = oracle.bits_equal(values, want_values)
    assert same.all(), f"{(~same).sum()} value mismatches"
    back = call(impl, "dequantize_mxfp8", values, scales, dtype=np.float32)
    want_back = (want_values.astype(np.float64)
                 * np.exp2(want_scales.astype(np.float64) - 127).repeat(32, -1))
    assert oracle.bits_equal(back, want_back.astype(np.float32)).all()


def _edge_blocks():
    blocks = []
    for amax in [447.0, 448.0, 449.0, 446.0, 450.0, 1.75, 1.7578125, 1.7421875, 3.5, 3.515625,
                 7.0, 1.0, 2.0**-133, 2.0**-127, 2.0**-126, 3 * 2.0**-133, 2.0**127,
                 1.75 * 2.0**127, 1.9921875 * 2.0**127, 448 * 2.0**-130, 0.0]:
        b = np.linspace(-1, 1, 32) * amax
        b[7] = amax
        blocks.append(b)
        b2 = np.zeros(32)
        b2[31] = -amax
        blocks.append(b2)
    x = np.stack(blocks)
    return x.reshape(-1, 128) if x.shape[0] % 4 == 0 else x[: x.shape[0] // 4 * 4].reshape(-1, 128)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_mxfp8_edge_blocks(impl, dtype):
    x = oracle.to_bf16(_edge_blocks()).astype(DTYPES[dtype])
    values, scales = call(impl, "quantize_mxfp8", x)
    want_values, want_scales = oracle.quantize_mxfp8(x)
    np.testing.assert_array_equal(scales, want_scales)
    assert oracle.bits_equal(values, want_values).all()
    assert not np.isnan(values.astype(np.float32)).any()
    # spot checks straight from SPEC §1.6: amax 448 -> byte 127 (447 and 449 round to 448 in
    # bf16); 450 (mantissa fraction > 0.75) -> 128
    flat = scales.reshape(-1)
    assert flat[0] == flat[2] == flat[4] == 127 and flat[8] == 128


# ---------------------------------------------------------------------------------------------
# Rejections (public API only: jm.reference does not validate)
# ---------------------------------------------------------------------------------------------


def _rejects(exc, name, fn, *args, **kwargs):
    with pytest.raises(exc) as info:
        fn(*args, **kwargs)
    assert name in str(info.value), str(info.value)


def test_rejections():
    x = np.zeros((2, 128), np.float32)
    _rejects(ValueError, "round_mode", jm.quantize_mxfp4, x, round_mode="nearest")
    _rejects(ValueError, "x", jm.quantize_mxfp4, np.zeros((2, 100), np.float32))
    _rejects(TypeError, "x", jm.quantize_mxfp4, np.zeros((2, 128), np.int32))
    _rejects(ValueError, "x", jm.quantize_mxfp8, np.zeros((2, 48), np.float32))
    _rejects(TypeError, "packed", jm.dequantize_mxfp4, np.zeros((2, 64), np.int8),
             np.zeros((2, 4), np.uint8))
    _rejects(ValueError, "scales", jm.dequantize_mxfp4, np.zeros((2, 64), np.uint8),
             np.zeros((2, 3), np.uint8))
    _rejects(TypeError, "values", jm.dequantize_mxfp8, np.zeros((2, 128), np.float32),
             np.zeros((2, 4), np.uint8))


def test_oracle_self_check():
    """The oracle's own rounding against ml_dtypes' conversions (guards the guard)."""
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(20000) * np.exp2(rng.integers(-140, 120, 20000))).astype(np.float32)
    assert oracle.bits_equal(oracle.to_bf16(x), x.astype(BF16)).all()
    y = np.clip(x.astype(np.float64), -448, 448)
    assert oracle.bits_equal(oracle.to_e4m3(y), y.astype(np.float32).astype(E4M3)).all()
    assert ml_dtypes.finfo(E4M3).max == 448
