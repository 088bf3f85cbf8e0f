"""bench/latency_floor.py, the device's floor for short attention calls, checked without a GPU:
its probe kernels compile for sm_90 with the grids the attention lowering would use (each
launch's parameters are what its kernel takes: ``Launch.attributes`` checks them), and the
chain and merge probes, run on the CDNA emulator through ``launch.call`` under ``jax.jit``,
fold exactly the pages the context reaches (numpy's xor of their words). Mutation: the chain
probe loading its page unmasked past the context fails the second test."""

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

    from jax_mxfp4 import emulated, targets

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
