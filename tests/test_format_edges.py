"""MX format edge cases found by comparing with independent implementations (SPEC §1.8,
§1.9): MXFP8 dequantization of every (e4m3 byte, scale byte) pair against ``ml_dtypes``, and
blocks holding Inf or NaN in MXFP4 and MXFP8 (scale byte 255, the block dequantizes to NaN).

Mutation checks (each applied to ``jax_mxfp4/_src/core/formats.py`` alone, the tests run, restored):
  * ``dequantize_mxfp8`` back to the multiply (``exact_scaled_f32``, which flushes fp32
    subnormal results on XLA's CPU) -> test_dequantize_mxfp8_every_byte_pair fails for both
    dtypes (568 float32 results, every one with scale byte <= 9).
  * ``mxfp8_scale_byte`` without its non-finite case -> test_mxfp8_non_finite_blocks fails
    (scale byte 247 or 248 instead of 255).
  * the values of a non-finite MXFP8 block kept as their scaled e4m3 roundings instead of NaN
    -> test_mxfp8_non_finite_blocks fails.
"""

from __future__ import annotations

import numpy as np
import oracle
import pytest
from conftest import BF16, E4M3, call

DTYPES = {"float32": np.float32, "bfloat16": BF16}
E4M3_NAN_BYTE = 0x7F


def _every_pair() -> tuple[np.ndarray, np.ndarray]:
    """Values ``e4m3[256, 256]`` (row s: every e4m3 byte) and scales ``uint8[256, 8]`` (row s:
    byte s for all 8 blocks of 32): each (e4m3 byte, scale byte) pair once."""
    values = np.tile(np.arange(256, dtype=np.uint8), (256, 1)).view(E4M3)
    scales = np.repeat(np.arange(256, dtype=np.uint8)[:, None], 8, axis=1)
    return values, scales


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_dequantize_mxfp8_every_byte_pair(impl, dtype):
    values, scales = _every_pair()
    got = call(impl, "dequantize_mxfp8", values, scales, dtype=DTYPES[dtype])
    exact = values.astype(np.float64) * np.exp2(scales.astype(np.float64) - 127).repeat(32, 1)
    exact[scales.repeat(32, 1) == 255] = np.nan  # byte 255 is NaN (SPEC §1.3)
    with np.errstate(over="ignore"):  # past the fp32 range: inf, as it should
        want = exact.astype(DTYPES[dtype])  # one correct rounding of the exact value
    assert got.dtype == want.dtype
    same = oracle.bits_equal(got, want)
    bad = np.argwhere(~same)
    assert same.all(), (f"{bad.shape[0]} of 65536 pairs differ, e.g. (scale byte, e4m3 byte) "
                        f"{[tuple(b) for b in bad[:4]]}: got {got[~same][:4]}, "
                        f"want {want[~same][:4]}")
    if dtype == "float32":  # e4m3 0x01 (2**-9) with scale byte 0 (2**-127): 2**-136
        assert float(got[0, 1]) == 2.0**-136


def _non_finite_blocks(dtype) -> np.ndarray:
    """Rows of 4 blocks: block 0 finite, block 1 with one Inf, -Inf or NaN among finite
    values, block 2 all non-finite, block 3 finite (neighbours must be unaffected)."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((6, 128)) * 4
    for row, bad in enumerate([np.inf, -np.inf, np.nan, np.inf, np.nan, -np.inf]):
        x[row, 32 + 5 * row] = bad
        x[row, 64:96] = [np.inf, np.nan, -np.inf][row % 3]
    x[3, 40] = np.nan  # Inf and NaN in one block
    return oracle.to_bf16(x).astype(dtype)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_mxfp8_non_finite_blocks(impl, dtype):
    x = _non_finite_blocks(DTYPES[dtype])
    values, scales = call(impl, "quantize_mxfp8", x)
    want_values, want_scales = oracle.quantize_mxfp8(x)
    np.testing.assert_array_equal(scales, want_scales)
    assert (scales[:, 1:3] == 255).all() and (scales[:, [0, 3]] < 255).all()
    np.testing.assert_array_equal(values.view(np.uint8), want_values.view(np.uint8))
    assert (values.view(np.uint8)[:, 32:96] == E4M3_NAN_BYTE).all()
    back = call(impl, "dequantize_mxfp8", values, scales, dtype=np.float32)
    assert np.isnan(back[:, 32:96]).all()
    assert np.isfinite(back[:, :32]).all() and np.isfinite(back[:, 96:]).all()


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_mxfp4_non_finite_blocks(impl, dtype):
    x = _non_finite_blocks(DTYPES[dtype])
    packed, scales = call(impl, "quantize_mxfp4", x)
    want_packed, want_scales = oracle.quantize_mxfp4(x)
    np.testing.assert_array_equal(scales, want_scales)
    assert (scales[:, 1:3] == 255).all() and (scales[:, [0, 3]] < 255).all()
    back = call(impl, "dequantize_mxfp4", packed, scales, dtype=np.float32)
    assert np.isnan(back[:, 32:96]).all()
    np.testing.assert_array_equal(back[:, :32], oracle.dequant_mxfp4(want_packed, want_scales)
                                  [:, :32].astype(np.float32))


def test_oracle_non_finite_rule_is_its_own():
    """The oracle decides a non-finite block from the float64 block amax (not from bits)."""
    x = np.zeros((1, 64))
    x[0, 3], x[0, 40] = np.inf, np.nan
    values, scales = oracle.quantize_mxfp8(x)
    assert scales.tolist() == [[255, 255]]
    assert (values.view(np.uint8) == E4M3_NAN_BYTE).all()
    assert oracle.quantize_mxfp4(x)[1].tolist() == [[255, 255]]

