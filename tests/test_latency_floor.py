"""bench/latency_floor.py, the device's floor for short attention calls, checked without a GPU:
its probe kernels compile for sm_90 with the grids the attention lowering would use (each
launch's parameters are what its kernel takes: ``Launch.attributes`` checks them), and the
chain and merge probes, run on the CDNA emulator through ``launch.call`` under ``jax.jit``,
fold exactly the pages the context reaches (numpy's xor of their words); likewise the one-row
index probes (``index_launches``). Mutation: the chain probe loading its page unmasked past
the context fails the second test; the index chain probe's table row taken as the program's
row instead of the row's request fails the last."""

from __future__ import annotations

import bench_scripts
import numpy as np
import pytest

pytest.importorskip("triton")


@pytest.fixture(scope="module")
def probes():
    return bench_scripts.load("latency_floor")


def test_probe_launches_compile_for_sm90(probes):
    steps = probes.launches(rows=8, num_pages=1024)
    assert [len(steps[k]) for k in ("empty", "chain", "chain+merge")] == [1, 1, 2]
    chain, merge = (launch for launch, _ in steps["chain+merge"])
    assert chain.grid == (8, probes.PAGES, 1) and merge.grid == (8, 4, 1)
    for launch, _ in (*steps["empty"], *steps["chain+merge"]):
        attrs = launch.attributes()
        assert attrs["symbol"] and attrs["code_size"] > 0


def test_chain_and_merge_fold_the_live_pages(probes, rng):
    import jax
    import jax.numpy as jnp

    from jax_mxfp4._src.core import targets
    from jax_mxfp4._src.dispatch import emulated

    emulated.install()
    rows, num_pages = 2, 40
    steps = probes.launches(rows, num_pages, targets.emulated("gfx942"))["chain+merge"]
    pool = rng.integers(0, 256, (num_pages, 8704)).astype(np.uint8)
    table = rng.integers(0, num_pages, rows * probes.PAGES).astype(np.int32)
    ctx = np.array([probes.PAGES * 128 - 200, 300], np.int32)

    def run(*inputs):
        return probes.run_steps(steps, inputs)[0]

    got = np.asarray(jax.jit(run)(jnp.asarray(ctx), jnp.asarray(table), jnp.asarray(pool)))
    words = pool.view(np.uint32).reshape(num_pages, -1)
    for r in range(rows):
        live = [p for p in range(probes.PAGES) if p * 128 < ctx[r]]
        want = np.bitwise_xor.reduce(words[table[r * probes.PAGES + np.array(live)]].ravel())
        assert (got[r * 4:(r + 1) * 4].view(np.uint32) == want).all(), r


def test_index_probe_launches_compile_for_sm90(probes):
    steps = probes.index_launches(rows=32, blocks=64)
    grids = {name: steps[name][0][0].grid for name in steps}
    assert grids == {"index chain": (32, 64, 1), "index pages": (32, 64, 1),
                     "index pages x4": (32, 16, 1)}
    for name in steps:
        attrs = steps[name][0][0].attributes()
        assert attrs["symbol"] and attrs["code_size"] > 0


def test_index_probes_fold_the_pages_they_read(probes, rng):
    import jax
    import jax.numpy as jnp

    from jax_mxfp4._src.core import targets
    from jax_mxfp4._src.dispatch import emulated

    emulated.install()
    rows, blocks = 3, 4
    steps = probes.index_launches(rows, blocks, targets.emulated("gfx942"))
    pool = rng.integers(0, 256, (rows * blocks, 8704)).astype(np.uint8)
    table = rng.permutation(rows * blocks).reshape(rows, blocks).astype(np.int32)
    positions = np.array([blocks * 128 - 1, 300, -1], np.int32)
    requests = np.array([2, 0, 1], np.int32)  # row r reads request requests[r]'s table row
    words = pool.view(np.uint32).reshape(rows * blocks, -1)
    folds = np.bitwise_xor.reduce(words, axis=1)

    def run(name, *inputs):
        return np.asarray(jax.jit(lambda *a: probes.run_steps(steps[name], a)[0])(*inputs))

    chain = run("index chain", *map(jnp.asarray, (positions, requests, table, pool)))
    for r in range(rows):
        for j in range(blocks):
            want = folds[table[requests[r], j]] if j * 128 <= positions[r] else 0
            assert chain.view(np.uint32)[r * blocks + j] == want, (r, j)
    for name in ("index pages", "index pages x4"):
        reached = jnp.asarray(np.zeros(rows, np.int32))
        np.testing.assert_array_equal(run(name, reached, jnp.asarray(pool)).view(np.uint32),
                                      folds)
