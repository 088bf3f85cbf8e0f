"""The decode-step comparison (``jax_mxfp4_tools.bench_step``) computes what it says, on the CPU at
a small size: the MXFP4 sparse step attends over every block when the context fits in the
top 16, so its output (MXFP8, dequantized) matches plain-jnp attention over the dequantized
MXFP4 pools to the formats' precision (relative L2 about 0.03: MXFP8 output, e4m3 query); the
dense bf16 step runs on its own pools. Mutation: a top-4 selection (half the blocks) gives
0.96 and fails."""

from __future__ import annotations

import jax
import numpy as np

import jax_mxfp4 as jm
from jax_mxfp4_tools import bench_step


def test_the_compared_steps_agree(monkeypatch):
    monkeypatch.setattr(bench_step, "STEPS", 2)
    rng = np.random.default_rng(0)
    p = bench_step.problem(rng, 3, 1000)
    carry = bench_step._mxfp4_carry(rng, p)
    # Keys and values of moderate size (scale bytes 121..124): a smooth softmax, so the e4m3
    # query of the sparse path and the bf16 query of the plain one weigh the tokens alike.
    carry = tuple(np.asarray(pool).copy() for pool in carry)
    for pool in carry:
        pool[..., 8192:] = rng.integers(121, 125, pool[..., 8192:].shape, dtype=np.uint8)
    scan = jax.jit(bench_step._scan, static_argnums=0)
    _, (values, scales) = scan(bench_step.mxfp4_step(p.block_table, p.blocks), carry, p.steps)
    _, plain = scan(bench_step.plain_mxfp4_step(p.block_table), carry[:2], p.steps)
    _, dense = scan(bench_step.dense_step(p.block_table, "xla"),
                    bench_step._dense_carry(rng, p), p.steps)
    sparse = np.asarray(jm.dequantize_mxfp8(values, scales)).reshape(plain.shape)
    plain = np.asarray(plain, np.float32)
    assert np.linalg.norm(sparse - plain) / np.linalg.norm(plain) < 0.05
    assert dense.shape == plain.shape and np.isfinite(np.asarray(dense, np.float32)).all()
