"""The row helpers never wrap (SPEC §2.4, §2.6): ``prefill_rows``, ``decode_rows`` and
``slot_mapping`` over the whole int32 and int64 range (hypothesis), against exact Python
integer models, with ``jax_enable_x64`` off (int64 host arrays) and on (traced int64 arrays).

The property that matters: a slot ``s >= 0`` that ``slot_mapping`` gives a row lies in the
page the row's own request maps its position's block to (``s // 128 == table[request,
position // 128]`` and ``s % 128 == position % 128``, all in exact integers), and every row
whose page and slot fit gets its slot.

Seen failing before the fix: page 2**25 + 1 mapped to slot 128 (page 1); int64 positions
narrowed by ``astype(int32)`` (2**32 + 5 gave slot 5 of the row's page 0); decode_rows with
seq_len -2**31 gave positions near INT32_MAX; prefill_rows with prefix 2**31 - 2 wrapped to
negative positions, and with zero requests raised instead of returning padding rows.
"""

from __future__ import annotations

import contextlib
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import jax_mxfp4 as jm

I32_MIN, I32_MAX = -(2**31), 2**31 - 1
I64_MIN, I64_MAX = -(2**63), 2**63 - 1
EDGES32 = [I32_MIN, I32_MIN + 1, -129, -128, -2, -1, 0, 1, 127, 128, 2**24 - 1, 2**24,
           2**25 + 1, I32_MAX - 128, I32_MAX - 1, I32_MAX]
EDGES64 = [*EDGES32, I32_MAX + 1, I32_MIN - 1, 2**32, 2**32 + 5, -(2**32) + 7, 2**40 + 7,
           I64_MIN, I64_MAX]
T, B, W = 8, 3, 4
SETTINGS = settings(max_examples=60, deadline=None, derandomize=True)


def values(dtype):
    """Integers of ``dtype``'s whole range, biased to the edges and to small values."""
    lo, hi = (I32_MIN, I32_MAX) if dtype == np.int32 else (I64_MIN, I64_MAX)
    edges = EDGES32 if dtype == np.int32 else EDGES64
    return st.one_of(st.sampled_from(edges), st.integers(-3, 700), st.integers(lo, hi))


def arrays(dtype, n):
    return st.lists(values(dtype), min_size=n, max_size=n).map(lambda v: np.array(v, dtype))


dtypes = st.sampled_from([np.int32, np.int64])


@contextlib.contextmanager
def x64_mode(mode: str):
    with jax.enable_x64(mode == "x64_on"):
        yield


@functools.cache
def _jitted(fn, static: tuple):
    return jax.jit(lambda *a: fn(*a, **dict(static)))


def run(mode: str, fn, *args, **static):
    """``fn`` eagerly on host arrays (x64 off), or jitted on device arrays (x64 on)."""
    with x64_mode(mode):
        if mode == "x64_on":
            out = _jitted(fn, tuple(sorted(static.items())))(*map(jnp.asarray, args))
        else:
            out = fn(*args, **static)
        return jax.tree.map(lambda o: np.asarray(o).astype(np.int64), out)


def sat(v: int) -> int:
    return min(max(int(v), I32_MIN), I32_MAX)


def exact_slot(table, position: int, request: int) -> int:
    """The slot of one row in exact integers, -1 where it does not exist or fit int32."""
    if not (0 <= position <= I32_MAX and 0 <= request < table.shape[0]):
        return -1
    if position // 128 >= table.shape[1]:
        return -1
    page = int(table[request, position // 128])
    if not 0 <= page or page * 128 + 127 > I32_MAX:
        return -1
    return page * 128 + position % 128


@pytest.mark.parametrize("mode", ["x64_off", "x64_on"])
@SETTINGS
@given(data=st.data(), table_dtype=dtypes, row_dtype=dtypes)
def test_slot_mapping_lands_only_in_the_rows_own_page(mode, data, table_dtype, row_dtype):
    table = data.draw(arrays(table_dtype, B * W)).reshape(B, W)
    positions = data.draw(arrays(row_dtype, T))
    requests = data.draw(st.lists(st.one_of(st.integers(-1, B), values(row_dtype)),
                                  min_size=T, max_size=T).map(lambda v: np.array(v, row_dtype)))
    got = run(mode, jm.slot_mapping, table, positions, requests)
    for n in range(T):
        assert got[n] == exact_slot(table, int(positions[n]), int(requests[n])), n
        if got[n] >= 0:  # in the page the row's own request maps its block to
            assert got[n] // 128 == table[requests[n], positions[n] // 128]


@pytest.mark.parametrize("mode", ["x64_off", "x64_on"])
@SETTINGS
@given(seq=st.one_of(arrays(np.int32, B), arrays(np.int64, B)), s=st.sampled_from([1, 2, 8]))
def test_decode_rows_never_wrap(mode, seq, s):
    positions, requests = run(mode, jm.decode_rows, seq, tokens_per_request=s)
    for b in range(B):
        for i in range(s):
            want = sat(seq[b]) - s + i  # a length saturates (SPEC §2.4), then exact
            assert positions[b * s + i] == (want if want >= 0 else -1)
            assert requests[b * s + i] == b


def exact_prefill(cu, prefix, num_rows):
    """prefill_rows in exact integers, lengths saturated first."""
    cu, prefix = [sat(v) for v in cu], [sat(v) for v in prefix]
    positions, requests = [], []
    for n in range(num_rows):
        b = sum(1 for end in cu[1:] if end <= n)
        if b >= len(prefix):
            positions.append(-1)
            requests.append(0)
            continue
        p = prefix[b] + n - cu[b]
        ok = 0 <= cu[b] <= n and prefix[b] >= 0 and p <= I32_MAX
        positions.append(p if ok else -1)
        requests.append(b)
    return positions, requests


@pytest.mark.parametrize("mode", ["x64_off", "x64_on"])
@SETTINGS
@given(data=st.data(), dtype=dtypes)
def test_prefill_rows_never_wrap(mode, data, dtype):
    small = st.integers(0, T + 2)
    cu = data.draw(st.lists(st.one_of(small, values(dtype)), min_size=B + 1, max_size=B + 1))
    prefix = data.draw(arrays(dtype, B))
    cu = np.array(cu, dtype)
    positions, requests = run(mode, jm.prefill_rows, cu, prefix, num_rows=T)
    want_positions, want_requests = exact_prefill(cu, prefix, T)
    assert positions.tolist() == want_positions
    assert requests.tolist() == want_requests


def _decode_slots(table, seq, s):
    positions, requests = jm.decode_rows(seq, s)
    return jm.slot_mapping(table, positions, requests)


@pytest.mark.parametrize("mode", ["x64_off", "x64_on"])
@SETTINGS
@given(data=st.data(), dtype=dtypes, s=st.sampled_from([1, 3]))
def test_decode_slots_land_in_the_requests_pages(mode, data, dtype, s):
    """decode_rows then slot_mapping: every written slot is in its own request's page."""
    seq = data.draw(arrays(dtype, B))
    table = data.draw(arrays(dtype, B * W)).reshape(B, W)

    got = run(mode, _decode_slots, table, seq, s=s)
    for b in range(B):
        for i in range(s):
            position = sat(seq[b]) - s + i
            want = exact_slot(table, position, b) if position >= 0 else -1
            assert got[b * s + i] == want


def test_prefill_rows_with_zero_requests_are_padding():
    positions, requests = jm.prefill_rows(np.zeros(1, np.int32), np.zeros(0, np.int32), 5)
    assert np.asarray(positions).tolist() == [-1] * 5
    assert np.asarray(requests).tolist() == [0] * 5
    assert positions.dtype == requests.dtype == jnp.int32
