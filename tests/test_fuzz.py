"""Metadata fuzzing: the public API (the C++ handlers, both kernel flavours) against the
reference and the float64 oracle, with metadata drawn from the whole int32 and int64 ranges
(edges, out-of-range ids, values that wrap), int64 given as host arrays with x64 off and as
traced arrays with x64 on (SPEC §6, §2.3, §3.1, §2.4, §9.2).

A few examples per case run in the test-suite; ``pytest -m fuzz`` runs the long version
(``JAX_MXFP4_FUZZ_EXAMPLES`` examples per case, 400 by default), and ``make fuzz`` runs that
with the handlers built with AddressSanitizer, so a write or read outside a pool is reported
where it happens (the write cases put slots at and past the last one of the pool).
"""

from __future__ import annotations

import contextlib
import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
import oracle
import pytest
from conftest import SM_SCALE, random_pages
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import jax_mxfp4 as jm
from jax_mxfp4._src import ffi_targets as ft

pytestmark = pytest.mark.skipif(not ft.register_cpu_targets(),
                                reason="the C++ extension jax_mxfp4._ffi_cpu is not built")

I32_MIN, I32_MAX = -(2**31), 2**31 - 1
P, H, T, B, W, NB = 5, 2, 8, 3, 5, 4
_RNG = np.random.default_rng(2024)
POOL = random_pages(_RNG, (P,), 1, 254, per_token=True)
POOL[1, 8192 + 4 * 9] = 255  # a NaN key (SPEC §9.2)
KV = random_pages(_RNG, (P, H), 110, 135)
Q_INDEX = oracle.to_e4m3(_RNG.standard_normal((T, H, 128)))
Q = oracle.to_bf16(_RNG.standard_normal((T, H * 2, 128)))
X = oracle.to_bf16(_RNG.standard_normal((T, H, 128)))

QUICK = settings(max_examples=6, deadline=None, derandomize=True,
                 suppress_health_check=[HealthCheck.function_scoped_fixture])
LONG = settings(max_examples=int(os.environ.get("JAX_MXFP4_FUZZ_EXAMPLES", "400")),
                deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def ints(edges, small):
    """Values of the whole int64 range: edges of int32 and of the operation, small ones,
    anything."""
    wide = [I32_MIN - 1, I32_MAX + 1, 2**32, 2**32 + 5, -(2**32) + 7, 2**40 + 3, -(2**63),
            2**63 - 1, I32_MIN, I32_MAX]
    return st.one_of(st.sampled_from(edges + wide), small, st.integers(I32_MIN, I32_MAX),
                     st.integers(-(2**63), 2**63 - 1))


SLOTS = ints([-1, 0, P * 128 - 1, P * 128, P * 128 + 1], st.integers(-3, P * 128 + 3))
PAGES = ints([-1, 0, P - 1, P, P + 1], st.integers(-2, P + 1))
POSITIONS = ints([-1, 0, 127, 128, NB * 128 - 1, NB * 128], st.integers(-2, 700))
REQUESTS = ints([-1, 0, B - 1, B], st.integers(-1, B))
CONTEXTS = ints([0, 1, 128, 3 * 128, 3 * 128 + 1], st.integers(-5, 400))


def vector(elements, n, shape=None):
    """An int32 or int64 array of ``n`` drawn values (int32 only if they all fit)."""
    return st.tuples(st.lists(elements, min_size=n, max_size=n), st.booleans()).map(
        lambda v: _array(v[0], v[1], shape or (n,)))


def _array(values, prefer_int32, shape):
    fits = all(I32_MIN <= x <= I32_MAX for x in values)
    return np.array(values, np.int32 if fits and prefer_int32 else np.int64).reshape(shape)


def as_id(x):
    """The int32 ``x`` means (SPEC §2.4): ids outside int32 are -1."""
    x = np.asarray(x, np.int64)
    return np.where((x >= I32_MIN) & (x <= I32_MAX), x, -1).astype(np.int32)


def as_length(x):
    return np.clip(np.asarray(x, np.int64), I32_MIN, I32_MAX).astype(np.int32)


@functools.cache
def _jitted(fn, static):
    return jax.jit(lambda *a: fn(*a, **dict(static)))


def call(name, mode, *args, **static):
    """``jm.<name>`` (the C++ handlers) on host arrays with x64 off (``"host"``), or jitted on
    device arrays with x64 on (``"traced"``); numpy results."""
    fn = getattr(jm, name)
    with jax.enable_x64(True) if mode == "traced" else contextlib.nullcontext():
        if mode == "traced":  # metadata all int64 (one compile per operation)
            args = [jnp.asarray(a, jnp.int64 if a.dtype.kind == "i" else a.dtype) for a in args]
            out = _jitted(fn, tuple(sorted(static.items())))(*args)
        else:
            out = fn(*args, **static)
        return jax.tree.map(np.asarray, out)


def reference(name, *args, **static):
    """``jm.reference.<name>`` jitted, on int32 metadata (what the int64 means, as_id /
    as_length: tests/test_metadata.py checks the reference's own narrowing)."""
    fn = getattr(jm.reference, name)
    return jax.tree.map(np.asarray, _jitted(fn, tuple(sorted(static.items())))(*args))


def assert_same(got, want):
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape, (g.dtype, g.shape, w.dtype, w.shape)
        if g.dtype.kind in "fV":
            assert oracle.bits_equal(g, w).all()
        else:
            np.testing.assert_array_equal(g, w)


def spec_rows(positions, requests):
    """Rows as the oracle takes them: positions and requests outside their ranges (after the
    int64 rule) make padding rows."""
    positions, requests = as_id(positions), as_id(requests)
    live = (positions >= 0) & (requests >= 0) & (requests < B)
    return np.where(live, positions, -1).astype(np.int32), np.where(live, requests, 0)


# ---------------------------------------------------------------------------------------------
# One check per operation (the quick and the long tests share them)
# ---------------------------------------------------------------------------------------------


def check_write(data, mode):
    """Slots anywhere, repeated ones included: bit for bit with the reference and the oracle
    (which writes the rows in order, so the last one wins)."""
    slots = data.draw(vector(SLOTS, T))
    got = call("write_cache", mode, KV, X, slots)
    assert_same(got, reference("write_cache", KV, X, as_id(slots)))
    np.testing.assert_array_equal(got, oracle.write_cache(KV, X, slots))


def check_index_and_select(data, mode):
    table = data.draw(vector(PAGES, B * W, (B, W)))
    positions, requests = data.draw(vector(POSITIONS, T)), data.draw(vector(REQUESTS, T))
    # A few static combinations (each one compiles): topk below, at and above the forced count.
    topk, init_blocks, local_blocks = data.draw(st.sampled_from([(1, 1, 1), (2, 1, 1),
                                                                 (5, 0, 2)]))
    meant = (as_id(table), as_id(positions), as_id(requests))
    static = dict(num_blocks=NB, sm_scale=SM_SCALE)
    scores = call("index_scores", mode, Q_INDEX, POOL, table, positions, requests, **static)
    assert_same(scores, reference("index_scores", Q_INDEX, POOL, *meant, **static))
    rows = spec_rows(positions, requests)
    assert_same(scores, oracle.index_scores(Q_INDEX, POOL, meant[0], *rows, **static))
    static = dict(topk=topk, init_blocks=init_blocks, local_blocks=local_blocks)
    selection = call("select_blocks", mode, scores, table, positions, requests, **static)
    assert_same(selection, reference("select_blocks", scores, *meant, **static))
    assert_same(selection, tuple(oracle.select_blocks(scores, meant[0], *rows, **static)))


def check_attention(data, mode):
    """Page tables and contexts anywhere: the same classes (NaN, +-inf) as the reference and
    the oracle, the finite rest within SPEC §10 of both."""
    table = data.draw(vector(PAGES, T * H * 3, (T, H, 3)))
    context = data.draw(vector(CONTEXTS, T * H, (T, H)))
    meant = (as_id(table), as_length(context))
    got = call("sparse_attention", mode, Q, KV, KV, table, context, sm_scale=SM_SCALE)
    ref = reference("sparse_attention", Q, KV, KV, *meant, sm_scale=SM_SCALE)
    spec = oracle.sparse_attention(Q, KV, KV, *meant, sm_scale=SM_SCALE)
    for want in (ref, spec):
        g, w = got.astype(np.float64), want.astype(np.float64)
        np.testing.assert_array_equal(np.isnan(g), np.isnan(w))
        finite = np.isfinite(w)
        ok, why = oracle.attention_close(g[finite], w[finite])
        assert ok, why


CHECKS = {"write": check_write, "index_and_select": check_index_and_select,
          "attention": check_attention}


@pytest.mark.parametrize("mode", ["host", "traced"])
@pytest.mark.parametrize("check", list(CHECKS))
@QUICK
@given(data=st.data())
def test_fuzz(isa, check, mode, data):
    CHECKS[check](data, mode)


@pytest.mark.fuzz
@pytest.mark.parametrize("mode", ["host", "traced"])
@pytest.mark.parametrize("check", list(CHECKS))
@LONG
@given(data=st.data())
def test_fuzz_long(isa, check, mode, data):
    CHECKS[check](data, mode)
