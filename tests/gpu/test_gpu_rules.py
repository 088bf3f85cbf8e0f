"""The rules every backend keeps (SPEC §6, §15.6, §15.14, §15.16, §15.18), on the GPU: the
Triton kernels and the reference lowering agree bit for bit where SPEC says bit for bit, and
the reference lowering is deterministic there too.

Seen failing before (on the H200, 2026-11-30): the reference lowering of ``write_cache`` gave
20 different results in 20 calls when slots repeat (XLA's GPU scatter applies conflicting
updates in any order); it now resolves duplicates before its scatter.
"""

from __future__ import annotations

import gpu_env
import jax
import numpy as np
import oracle
import pytest
from conftest import random_pages

import jax_mxfp4 as jm
from jax_mxfp4.backend import backend_scope

pytestmark = gpu_env.required()


def run(backend, fn, *args, **static):
    with backend_scope(backend):
        return jax.tree.map(np.asarray, jax.jit(lambda *a: fn(*a, **static))(*args))


def duplicate_slots_case(rng, rows):
    pool = random_pages(rng, (8, 2))
    x = oracle.to_bf16(rng.standard_normal((rows, 2, 128)) * 4)
    slots = rng.integers(-5, 8 * 128 + 5, rows).astype(np.int32)
    slots[rows // 2:] = slots[: rows - rows // 2]  # every slot of the first half recurs
    slots[::7] = slots[0]  # and one slot many times
    return pool, x, slots


@pytest.mark.parametrize("rows", [40, 5000], ids=["kernel_scan", "sorted_slots"])
def test_reference_and_triton_write_cache_agree_on_repeated_slots(rng, rows):
    pool, x, slots = duplicate_slots_case(rng, rows)
    kernel = run("auto", jm.write_cache, pool, x, slots)
    reference = run("reference", jm.write_cache, pool, x, slots)
    np.testing.assert_array_equal(kernel, reference)
    np.testing.assert_array_equal(reference, oracle.write_cache(pool, x, slots))


def test_reference_write_cache_gives_the_same_bits_every_call(rng):
    pool, x, slots = duplicate_slots_case(rng, 3000)
    with backend_scope("reference"):
        step = jax.jit(jm.write_cache)
        first = np.asarray(step(pool, x, slots))
        for _ in range(20):
            np.testing.assert_array_equal(np.asarray(step(pool, x, slots)), first)
    np.testing.assert_array_equal(first, oracle.write_cache(pool, x, slots))


@pytest.mark.parametrize("poison", [1e30, np.inf, np.nan])
@pytest.mark.parametrize("params", [(2, 1, 1), (16, 0, 1), (3, 2, 2)], ids=str)
def test_select_blocks_forced_blocks_cannot_be_outranked(rng, poison, params):
    """Scores of 1e30, +inf or NaN in other blocks: every row keeps its init and local blocks,
    Triton bit for bit with the reference and the oracle (SPEC §6)."""
    topk, init_blocks, local_blocks = params
    num_blocks, rows = 30, 40
    scores = rng.standard_normal((2, rows, num_blocks)).astype(np.float32)
    scores[rng.random(scores.shape) < 0.5] = poison
    table = rng.integers(0, 500, (4, 32)).astype(np.int32)
    positions = rng.integers(-1, num_blocks * 128 + 100, rows).astype(np.int32)
    positions[:2] = [2**31 - 1, 0]
    requests = rng.integers(0, 4, rows).astype(np.int32)
    static = dict(topk=topk, init_blocks=init_blocks, local_blocks=local_blocks)
    kernel = run("auto", jm.select_blocks, scores, table, positions, requests, **static)
    reference = run("reference", jm.select_blocks, scores, table, positions, requests, **static)
    want = oracle.select_blocks(scores, table, positions, requests, **static)
    for k, r, w in zip(kernel, reference, want, strict=True):
        np.testing.assert_array_equal(k, r)
        np.testing.assert_array_equal(k, w)


@pytest.mark.parametrize("backend", ["auto", "reference"])
def test_int64_metadata_on_the_gpu(rng, backend):
    """SPEC §15.16 in the graph on the GPU: traced int64 slots outside int32 are skipped."""
    pool = random_pages(rng, (4,))
    x = oracle.to_bf16(rng.standard_normal((3, 128)))
    with jax.enable_x64(True):
        wide = jax.numpy.asarray(np.array([2**32 + 5, 7, -(2**32) + 9], np.int64))
        got = run(backend, jm.write_cache, pool, x, wide)
    np.testing.assert_array_equal(got, oracle.write_cache(pool, x, np.array([-1, 7, -1])))
