"""The public operations: validate at trace time, then run the implementation.

Shapes: ``T`` query rows, ``B`` requests, ``P`` pages, ``H`` index heads (= kv heads on a rank),
``Hq`` query heads, ``D = 128``. See SPEC.md for what each operation computes.
"""

from __future__ import annotations

import jax.numpy as jnp

from jax_mxfp4 import primitives, validate
from jax_mxfp4.reference import SparseSelection


def write_cache(pool, x, slots, *, round_mode: str = "up") -> jnp.ndarray:
    """Quantize rows to MXFP4 and store them into their slots of ``pool``.

    Args:
      pool: ``uint8[P, 8704]`` (index cache) or ``uint8[P, Hkv, 8704]`` (K or V cache).
      x: float ``[T, 128]`` or ``[T, Hkv, 128]`` (rounded to bfloat16 first).
      slots: ``int32 | int64 [T]``, ``slot = page * 128 + offset``; slots < 0 or >= P*128 are
        not written.
      round_mode: e8m0 scale rounding, ``"up"`` (default), ``"even"`` or ``"down"``.
    Returns:
      The updated pool. Under ``jit`` with the pool donated, the update happens in place.
    """
    pool, x, slots = jnp.asarray(pool), jnp.asarray(x), jnp.asarray(slots)
    validate.write_cache_args(pool, x, slots, round_mode)
    return primitives.write_cache(pool, x, slots, round_mode=round_mode)


def index_scores(
    q, index_pool, block_table, positions, requests, *, num_blocks: int, sm_scale: float,
    q_round: str = "e4m3",
) -> jnp.ndarray:
    """Score every 128-token block of each row's request: ``float32[H, T, num_blocks]``.

    Args:
      q: ``bfloat16 | float8_e4m3fn [T, H, 128]`` index queries.
      index_pool: ``uint8[P, 8704]``.
      block_table: ``int32[B, >= num_blocks]``.
      positions, requests: ``int32[T]`` from ``prefill_rows`` / ``decode_rows``.
      num_blocks: static number of blocks scored per row.
      sm_scale: softmax scale; scores are ``max logit * fp32(sm_scale * 1.4426950409)``.
      q_round: ``"e4m3"`` (default) rounds a bf16 query to e4m3 first; ``"none"`` keeps bf16.
    """
    args = tuple(map(jnp.asarray, (q, index_pool, block_table, positions, requests)))
    validate.index_scores_args(*args, num_blocks, sm_scale, q_round)
    return primitives.index_scores(
        *args, num_blocks=int(num_blocks), sm_scale=float(sm_scale), q_round=q_round
    )


def select_blocks(
    scores, block_table, positions, requests, *, topk: int = 16, init_blocks: int = 0,
    local_blocks: int = 1,
) -> SparseSelection:
    """Top-k blocks per (index head, row) and the sparse page table (SPEC §6).

    Returns ``SparseSelection(block_ids int32[H, T, topk], page_table int32[T, H, topk],
    context_lens int32[T, H])``. Index head ``h`` drives kv head ``h``.
    """
    args = tuple(map(jnp.asarray, (scores, block_table, positions, requests)))
    validate.select_blocks_args(*args, topk, init_blocks, local_blocks)
    return primitives.select_blocks(
        *args, topk=int(topk), init_blocks=int(init_blocks), local_blocks=int(local_blocks)
    )


def sparse_attention(
    q, k_pool, v_pool, page_table, context_lens, *, sm_scale: float, output: str = "bf16"
):
    """Sparse paged attention over MXFP4 K/V pages (SPEC §7, §8).

    Args:
      q: ``bfloat16 | float8_e4m3fn [T, Hq, 128]``.
      k_pool, v_pool: ``uint8[P, Hkv, 8704]``.
      page_table: ``int32[T, Hkv, n]``; context_lens: ``int32[T, Hkv]`` (from select_blocks).
      sm_scale: softmax scale.
      output: ``"bf16"`` -> ``bfloat16[T, Hq, 128]``; ``"mxfp8"`` -> ``(float8_e4m3fn[T,
        Hq*128], uint8[T, Hq*4])``.
    """
    args = tuple(map(jnp.asarray, (q, k_pool, v_pool, page_table, context_lens)))
    validate.sparse_attention_args(*args, sm_scale, output)
    return primitives.sparse_attention(*args, sm_scale=float(sm_scale), output=output)
