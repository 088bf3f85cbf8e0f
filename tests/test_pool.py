"""Paged pools: write_cache, dequantize_pool, prefill_rows, decode_rows (SPEC §2, §3, §2.3,
§1.4, §2.5) against the float64 oracle and hand-computed expectations.

Mutation check: each mutation below was applied to a copy of the package, one edit at a
time, and the tests named after it failed (count of failing parametrizations in brackets;
the listed tests are those that failed, not just the ones meant to catch it).

  * reference write_cache: scale bytes at 8192 + off*4 + 1 -> test_write_cache_matches_oracle
    [24], test_round_trip [4], default_round_mode [2], int64_slots_beyond_int32 [2], and
    test_properties::test_write_read_round_trip.
  * data at off*68 instead of off*64 -> test_write_cache_matches_oracle [24], test_round_trip
    [4], default_round_mode [2], int64_slots_beyond_int32 [2].
  * negative slots not skipped -> test_write_cache_matches_oracle [24], test_round_trip [4],
    default_round_mode [2], int64_slots_beyond_int32 [1], test_write_read_round_trip.
  * slots >= P*128 clamped onto the last page -> the same tests.
  * int64 slots narrowed to int32 before the range check
    -> test_write_cache_int64_slots_beyond_int32[reference] (the only test that can see it).
  * pages.split_pages reading the next token's scales -> test_round_trip [4].
  * prefill_rows: padding rows position 0 -> test_prefill_rows [2],
    test_prefill_rows_trailing_empty [2].
  * decode_rows: negative positions kept -> test_decode_rows [2].
  Only the reference was mutated; the [public] cases run the C++ CPU kernel for write_cache
  and so (correctly) stayed green where the kernel is not affected.
"""

from __future__ import annotations

import jax
import numpy as np
import oracle
import pytest
from conftest import BF16, call

import jax_mxfp4 as jm

P = 4  # pages
T = 16  # token rows written per call


def _slots(rng, dtype):
    """T slots: distinct in-range ones, negatives and ones past the pool."""
    valid = rng.choice(P * 128, T, replace=False)
    slots = valid.astype(np.int64)
    slots[[1, 6]] = [-1, -200]
    slots[[3, 9]] = [P * 128, P * 128 + 77]
    slots[12] = 2**31 - 1
    slots[2] = P * 128 - 1  # last slot of the pool
    slots[4] = 0
    return slots.astype(dtype)


def _rows(rng, shape, dtype):
    magnitudes = np.exp2(rng.integers(-8, 8, (shape[0],) + (1,) * (len(shape) - 1)))
    x = rng.standard_normal(shape) * magnitudes
    x[0] = 0.0
    return x.astype(dtype)


@pytest.mark.emulated  # also on emulated-gfx950 / -gfx942 (conftest)
@pytest.mark.parametrize("heads", [None, 2], ids=["no_head", "heads2"])
@pytest.mark.parametrize("slot_dtype", ["int32", "int64"])
@pytest.mark.parametrize("round_mode", ["up", "even", "down"])
def test_write_cache_matches_oracle(impl, heads, slot_dtype, round_mode, rng):
    shape = (P, 8704) if heads is None else (P, heads, 8704)
    pool = rng.integers(0, 256, shape, dtype=np.uint8)  # pre-existing bytes must survive
    x_shape = (T, 128) if heads is None else (T, heads, 128)
    x = _rows(rng, x_shape, np.float32 if round_mode == "even" else BF16)
    slots = _slots(rng, np.dtype(slot_dtype))
    got = call(impl, "write_cache", pool, x, slots, round_mode=round_mode)
    want = oracle.write_cache(pool, x, slots, round_mode)
    assert got.dtype == np.uint8 and got.shape == pool.shape
    diff = np.argwhere(got != want)
    assert diff.size == 0, f"{len(diff)} bytes differ, first at {diff[:3].tolist()}"


@pytest.mark.emulated  # also on emulated-gfx950 / -gfx942 (conftest)
def test_write_cache_default_round_mode(impl, rng):
    pool = np.zeros((P, 8704), np.uint8)
    x = _rows(rng, (T, 128), np.float32)
    slots = _slots(rng, np.int32)
    got = call(impl, "write_cache", pool, x, slots)
    np.testing.assert_array_equal(got, oracle.write_cache(pool, x, slots, "up"))


@pytest.mark.emulated  # also on emulated-gfx950 / -gfx942 (conftest)
def test_write_cache_int64_slots_beyond_int32(impl, rng):
    """int64 slots past 2**31 are out of the pool: not written, not wrapped onto a page."""
    pool = rng.integers(0, 256, (P, 8704), dtype=np.uint8)
    x = _rows(rng, (T, 128), BF16)
    slots = _slots(rng, np.int64)
    slots[[5, 7, 8]] = [2**32 + 5, 2**32 + 130, -(2**32) + 3]  # wrap to 5, 130, 3 in int32
    with jax.enable_x64(True):
        got = call(impl, "write_cache", pool, x, slots)
    want = oracle.write_cache(pool, x, slots)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("heads", [None, 2], ids=["no_head", "heads2"])
def test_round_trip(impl, heads, rng):
    """dequantize_pool(write_cache(x)) at the slots == dequantize_mxfp4(quantize_mxfp4(x))."""
    pool = jm.new_pool(P, heads)
    x_shape = (T, 128) if heads is None else (T, heads, 128)
    x = _rows(rng, x_shape, np.float32)
    slots = _slots(rng, np.int32)
    written = call(impl, "write_cache", pool, x, slots)
    back = call(impl, "dequantize_pool", written, dtype=np.float32)
    assert back.shape == ((P, 128, 128) if heads is None else (P, heads, 128, 128))
    packed, scales = call(impl, "quantize_mxfp4", x)
    direct = call(impl, "dequantize_mxfp4", packed, scales, dtype=np.float32)
    ok = (slots >= 0) & (slots < P * 128)
    s = slots[ok]
    at_slots = back[s // 128, ..., s % 128, :] if heads is None else back[s // 128, :, s % 128]
    assert oracle.bits_equal(at_slots, direct[ok]).all()
    # and against the oracle, for the whole pool (untouched slots stay exact zeros)
    want = oracle.dequant_pool(oracle.write_cache(np.asarray(pool), x, slots)).astype(np.float32)
    assert oracle.bits_equal(back, want).all()
    bf = call(impl, "dequantize_pool", written, dtype=BF16)
    assert oracle.bits_equal(bf, oracle.round_bf16(want).astype(BF16)).all()


def test_new_pool():
    assert np.asarray(jm.new_pool(3)).shape == (3, 8704)
    p = np.asarray(jm.new_pool(2, 4))
    assert p.shape == (2, 4, 8704) and p.dtype == np.uint8 and not p.any()
    assert jm.PAGE_BYTES == 8704 and jm.PAGE_TOKENS == 128 and jm.HEAD_DIM == 128


# ---------------------------------------------------------------------------------------------
# Query rows
# ---------------------------------------------------------------------------------------------


def test_prefill_rows(impl):
    # request 0: 3 rows after 10 cached tokens; request 1: empty; request 2: 2 rows after 128;
    # rows 5..7 are padding.
    pos, req = call(impl, "prefill_rows", np.array([0, 3, 3, 5], np.int32),
                    np.array([10, 7, 128], np.int32), num_rows=8)
    assert pos.dtype == np.int32 and req.dtype == np.int32
    assert pos.tolist() == [10, 11, 12, 128, 129, -1, -1, -1]
    assert req.tolist() == [0, 0, 0, 2, 2, 0, 0, 0]
    want = oracle.prefill_rows([0, 3, 3, 5], [10, 7, 128], 8)
    assert pos.tolist() == want[0].tolist() and req.tolist() == want[1].tolist()


def test_prefill_rows_trailing_empty(impl):
    pos, req = call(impl, "prefill_rows", np.array([0, 2, 2], np.int32),
                    np.array([0, 500], np.int32), num_rows=3)
    assert pos.tolist() == [0, 1, -1]
    assert req.tolist() == [0, 0, 0]


def test_decode_rows(impl):
    # S = 2: seq 5 -> 3, 4; seq 1 -> -1, 0; seq 0 -> -1, -1; seq 130 -> 128, 129
    pos, req = call(impl, "decode_rows", np.array([5, 1, 0, 130], np.int32),
                    tokens_per_request=2)
    assert pos.dtype == np.int32 and req.dtype == np.int32
    assert pos.tolist() == [3, 4, -1, 0, -1, -1, 128, 129]
    assert req.tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    want = oracle.decode_rows([5, 1, 0, 130], 2)
    assert pos.tolist() == want[0].tolist() and req.tolist() == want[1].tolist()


def test_decode_rows_single_token(impl):
    pos, req = call(impl, "decode_rows", np.array([1, 300], np.int32), tokens_per_request=1)
    assert pos.tolist() == [0, 299] and req.tolist() == [0, 1]


# ---------------------------------------------------------------------------------------------
# Rejections (public API)
# ---------------------------------------------------------------------------------------------


def _rejects(exc, name, fn, *args, **kwargs):
    with pytest.raises(exc) as info:
        fn(*args, **kwargs)
    assert name in str(info.value), str(info.value)


def test_write_cache_rejections():
    pool = np.zeros((P, 8704), np.uint8)
    hpool = np.zeros((P, 2, 8704), np.uint8)
    x = np.zeros((T, 128), np.float32)
    slots = np.zeros(T, np.int32)
    _rejects(ValueError, "pool", jm.write_cache, np.zeros((P, 8700), np.uint8), x, slots)
    _rejects(TypeError, "pool", jm.write_cache, np.zeros((P, 8704), np.int8), x, slots)
    _rejects(ValueError, "x", jm.write_cache, hpool, x, slots)  # head axis missing
    _rejects(ValueError, "x", jm.write_cache, hpool, np.zeros((T, 3, 128), np.float32), slots)
    _rejects(ValueError, "x", jm.write_cache, pool, np.zeros((T, 96), np.float32), slots)
    _rejects(TypeError, "x", jm.write_cache, pool, np.zeros((T, 128), np.int32), slots)
    _rejects(TypeError, "slots", jm.write_cache, pool, x, np.zeros(T, np.float32))
    _rejects(ValueError, "slots", jm.write_cache, pool, x, np.zeros(T + 1, np.int32))
    _rejects(ValueError, "round_mode", jm.write_cache, pool, x, slots, round_mode="ceil")


def test_rows_rejections():
    _rejects(ValueError, "cu_seqlens_q", jm.prefill_rows, np.array([0, 1], np.int32),
             np.array([0, 0], np.int32), 4)
    _rejects(TypeError, "cu_seqlens_q", jm.prefill_rows, np.array([0.0, 1.0]),
             np.array([0], np.int32), 4)
    _rejects(ValueError, "tokens_per_request", jm.decode_rows, np.array([3], np.int32), 0)
