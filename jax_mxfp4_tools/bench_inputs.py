"""Random inputs the CPU and GPU benchmarks share (``bench``, ``bench_gpu``, bench/ scripts)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

import jax_mxfp4 as jm
from jax_mxfp4._src.core.formats import PAGE_BYTES, PAGE_SCALE_OFFSET, PAGE_TOKENS


def random_pool(rng, pages: int, heads: int | None = None) -> jnp.ndarray:
    """Random pages (scale bytes 118..133): ``uint8[pages, 8704]`` or ``[pages, heads, 8704]``."""
    shape = (pages, PAGE_BYTES) if heads is None else (pages, heads, PAGE_BYTES)
    pool = rng.integers(0, 256, shape, dtype=np.uint8)
    pool[..., PAGE_SCALE_OFFSET:] = rng.integers(118, 134, (*shape[:-1], 512), dtype=np.uint8)
    return jnp.asarray(pool)


def index_inputs(rng, shape: str, requests: int, rows_per_request: int, context: int):
    """An index pool, block table and row metadata: ``requests`` requests of ``context``
    tokens, each with ``rows_per_request`` query rows at its end (decode rows or one prefill
    chunk). Returns ``(pool, block_table, positions, requests)``."""
    blocks = -(-context // PAGE_TOKENS)
    pages = requests * blocks
    pool = random_pool(rng, pages)
    table = jnp.asarray(rng.permutation(pages).reshape(requests, blocks), jnp.int32)
    seq = jnp.full((requests,), context, jnp.int32)
    if shape == "decode":
        positions, reqs = jm.decode_rows(seq, rows_per_request)
    else:
        cu = jnp.arange(requests + 1, dtype=jnp.int32) * rows_per_request
        positions, reqs = jm.prefill_rows(cu, seq - rows_per_request, requests * rows_per_request)
    return pool, table, positions, reqs
