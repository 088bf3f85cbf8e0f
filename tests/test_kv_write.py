"""``slot_mapping`` and ``write_kv_cache`` (SPEC §3): rows to cache slots, and one step's K, V
and index K written into their three caches, against a plain loop and the float64 oracle.

Mutation checks (applied to the package one at a time and seen failing):
  * slot_mapping: blocks past the table width clamped onto the last block (what the demo's
    hand-written slots did) -> test_slot_mapping_matches_a_loop.
  * slot_mapping: negative pages kept -> test_slot_mapping_matches_a_loop.
  * write_kv_cache: the index cache written with ``slots`` even when ``index_slots`` is given
    -> test_write_kv_cache_matches_the_oracle[index_slots].
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import oracle
import pytest
from conftest import random_pages

import jax_mxfp4 as jm


def _slots_by_loop(table, positions, requests):
    out = np.full(len(positions), -1, np.int64)
    for n, (pos, req) in enumerate(zip(positions, requests, strict=True)):
        if pos < 0 or not 0 <= req < table.shape[0] or pos // 128 >= table.shape[1]:
            continue
        page = table[req, pos // 128]
        if page >= 0:
            out[n] = page * 128 + pos % 128
    return out


def test_slot_mapping_matches_a_loop(rng):
    table = rng.integers(0, 50, (3, 4)).astype(np.int32)
    table[1, 2] = -1  # an unmapped block
    positions = np.array([0, 127, 128, 300, 511, 512, 9000, -1, 5, 260, 7], np.int32)
    requests = np.array([0, 0, 0, 1, 2, 2, 1, 0, 3, 1, -1], np.int32)
    got = jax.jit(jm.slot_mapping)(table, positions, requests)
    assert got.dtype == jnp.int32
    np.testing.assert_array_equal(np.asarray(got), _slots_by_loop(table, positions, requests))


def test_slot_mapping_of_decode_rows_lands_each_token_in_its_page():
    table = np.array([[7, 3], [5, 9]], np.int32)
    positions, requests = jm.decode_rows(np.array([130, 1], np.int32), 2)
    assert np.asarray(jm.slot_mapping(table, positions, requests)).tolist() == [
        3 * 128 + 0, 3 * 128 + 1, -1, 5 * 128 + 0]


def test_slot_mapping_rejections():
    with pytest.raises(ValueError, match="block_table"):
        jm.slot_mapping(np.zeros(4, np.int32), np.zeros(2, np.int32), np.zeros(2, np.int32))
    with pytest.raises(ValueError, match="positions and requests"):
        jm.slot_mapping(np.zeros((1, 2), np.int32), np.zeros(2, np.int32),
                        np.zeros(3, np.int32))


def _step(rng, rows=40, heads=2, pages=16):
    k_pool = random_pages(rng, (pages, heads))
    v_pool = random_pages(rng, (pages, heads))
    index_pool = random_pages(rng, (pages,))
    k, v = (oracle.to_bf16(rng.standard_normal((rows, heads, 128))) for _ in range(2))
    index_k = oracle.to_bf16(rng.standard_normal((rows, 128)))
    slots = rng.permutation(pages * 128)[:rows].astype(np.int32)
    slots[3] = -1
    return k_pool, v_pool, index_pool, k, v, index_k, slots


@pytest.mark.parametrize("variant", ["shared_slots", "index_slots"])
def test_write_kv_cache_matches_the_oracle(rng, variant, backend):
    """On this process's backend and on the emulated ROCm ones (``backend`` fixture)."""
    k_pool, v_pool, index_pool, k, v, index_k, slots = _step(rng)
    index_slots = None
    if variant == "index_slots":
        index_slots = np.roll(slots, 5)
    out = jax.jit(lambda *a: jm.write_kv_cache(*a, index_slots=index_slots, round_mode="even"))(
        k_pool, v_pool, index_pool, k, v, index_k, slots)
    want = (oracle.write_cache(k_pool, k, slots, "even"),
            oracle.write_cache(v_pool, v, slots, "even"),
            oracle.write_cache(index_pool, index_k, slots if index_slots is None
                               else index_slots, "even"))
    for got, expected in zip(out, want, strict=True):
        np.testing.assert_array_equal(np.asarray(got), expected)


def test_write_kv_cache_without_an_index_cache(rng):
    k_pool, v_pool, _, k, v, _, slots = _step(rng)
    new_k, new_v, new_index = jm.write_kv_cache(k_pool, v_pool, None, k, v, None, slots)
    assert new_index is None
    np.testing.assert_array_equal(np.asarray(new_k), oracle.write_cache(k_pool, k, slots, "up"))
    np.testing.assert_array_equal(np.asarray(new_v), oracle.write_cache(v_pool, v, slots, "up"))


def test_write_kv_cache_donated_pools_are_updated_in_place(rng):
    """All three donated pools alias their results; nothing pool-sized is copied."""
    args = _step(rng)
    compiled = jax.jit(jm.write_kv_cache, donate_argnums=(0, 1, 2)).lower(*args).compile()
    hlo = compiled.as_text()
    assert hlo.count("may-alias") + hlo.count("must-alias") >= 3, hlo[:2000]
    assert not [line for line in hlo.splitlines() if " copy(" in line and "8704" in line]


def test_write_kv_cache_under_vmap(rng, backend):
    steps = [_step(rng) for _ in range(3)]
    stacked = [np.stack(parts) for parts in zip(*steps, strict=True)]
    out = jax.vmap(jm.write_kv_cache)(*stacked)
    for i, step in enumerate(steps):
        for got, expected in zip(out, jm.write_kv_cache(*step), strict=True):
            np.testing.assert_array_equal(np.asarray(got[i]), np.asarray(expected))


def test_write_kv_cache_rejections(rng):
    k_pool, v_pool, index_pool, k, v, index_k, slots = _step(rng)
    cases = [
        (ValueError, "index_pool and index_k", (k_pool, v_pool, index_pool, k, v, None, slots)),
        (ValueError, "index_slots", (k_pool, v_pool, None, k, v, None, slots), slots),
        (ValueError, "v must", (k_pool, v_pool, index_pool, k, v[:, :1], index_k, slots)),
        (ValueError, "k_pool", (k_pool[:, 0], v_pool, index_pool, k[:, 0], v, index_k, slots)),
        (ValueError, "index_k", (k_pool, v_pool, index_pool, k, v, index_k[:-1], slots)),
        (TypeError, "slots", (k_pool, v_pool, index_pool, k, v, index_k, slots * 1.0)),
        (ValueError, "index_pool", (k_pool, v_pool, k_pool, k, v, index_k, slots)),
    ]
    for exc, name, args, *index_slots in cases:
        kwargs = {"index_slots": index_slots[0]} if index_slots else {}
        with pytest.raises(exc, match=name):
            jm.write_kv_cache(*args, **kwargs)
