"""Reference ``select_blocks``: top-k blocks per (index head, row) and the sparse page table.

SPEC §6 with the decisions of §15.8 and §15.11. Per index head ``h`` and row ``t`` with
position ``p``: ``valid = min(p // 128 + 1, NB)`` blocks are candidates; their keys are the
scores with NaN -> -1e30, the first ``init_blocks`` forced to 1e30 and the last
``local_blocks`` forced to 1e29 (local wins over init). The ``min(topk, valid)`` largest keys
are selected, ties to the lower block index.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from jax_mxfp4.formats import PAGE_TOKENS
from jax_mxfp4.reference._common import row_is_live
from jax_mxfp4.selection import SparseSelection

INIT_KEY = 1e30
LOCAL_KEY = 1e29
NAN_KEY = -1e30


def selection_keys(scores, positions, *, init_blocks: int, local_blocks: int):
    """Keys ``f32[H, T, NB]`` (``-inf`` outside the candidates) and ``valid int32[T]``."""
    num_blocks = scores.shape[-1]
    blocks = jnp.arange(num_blocks, dtype=jnp.int32)
    valid = jnp.where(positions >= 0, jnp.minimum(positions // PAGE_TOKENS + 1, num_blocks), 0)
    keys = jnp.where(jnp.isnan(scores), jnp.float32(NAN_KEY), scores)
    keys = jnp.where(blocks < init_blocks, jnp.float32(INIT_KEY), keys)
    local = blocks[None, :] >= (valid[:, None] - local_blocks)
    keys = jnp.where(local[None], jnp.float32(LOCAL_KEY), keys)
    keys = jnp.where((blocks[None, :] < valid[:, None])[None], keys, -jnp.inf)
    return keys, valid


def select_blocks(
    scores: jnp.ndarray,
    block_table: jnp.ndarray,
    positions: jnp.ndarray,
    requests: jnp.ndarray,
    *,
    topk: int = 16,
    init_blocks: int = 0,
    local_blocks: int = 1,
) -> SparseSelection:
    """Select the top-k blocks of every (index head, row) and emit the sparse page table.

    Args:
      scores: ``f32[H, T, NB]`` from ``index_scores``.
      block_table: ``int32[B, >= NB]`` logical block -> physical page per request.
      positions, requests: ``int32[T]`` row metadata (position -1 = padding row).
      topk, init_blocks, local_blocks: static selection parameters.
    """
    num_blocks = scores.shape[-1]
    num_requests = block_table.shape[0]
    # A row whose request is not in the table is a padding row, as in index_scores.
    positions = jnp.where(row_is_live(positions, requests, num_requests), positions, -1)
    keys, valid = selection_keys(
        scores, positions, init_blocks=init_blocks, local_blocks=local_blocks
    )
    if topk > num_blocks:  # lax.top_k needs k <= width; the extra columns never win.
        keys = jnp.pad(keys, ((0, 0), (0, 0), (0, topk - num_blocks)), constant_values=-jnp.inf)
    _, ids = lax.top_k(keys, topk)  # ties: lower index first
    rank = jnp.arange(topk, dtype=jnp.int32)
    count = jnp.minimum(valid, topk)
    block_ids = jnp.where(rank[None, None, :] < count[None, :, None], ids, -1).astype(jnp.int32)

    # Attention order: full blocks (in selection order), the tail block, then padding.
    by_row = jnp.transpose(block_ids, (1, 0, 2))  # [T, H, k]
    self_block = jnp.where(positions >= 0, positions // PAGE_TOKENS, -2)[:, None, None]
    is_tail = by_row == self_block
    order_key = jnp.where(by_row < 0, 2, is_tail.astype(jnp.int32))
    order = jnp.argsort(order_key, axis=-1, stable=True)
    ordered = jnp.take_along_axis(by_row, order, axis=-1)

    request = jnp.clip(requests, 0, num_requests - 1)[:, None, None]
    pages = block_table[request, jnp.maximum(ordered, 0)]
    page_table = jnp.where(ordered >= 0, pages, 0).astype(jnp.int32)

    selected = jnp.sum(by_row >= 0, axis=-1)
    has_tail = jnp.any(is_tail, axis=-1)
    tail_tokens = (positions + 1 - (positions // PAGE_TOKENS) * PAGE_TOKENS)[:, None]
    context_lens = jnp.where(
        has_tail,
        (selected - 1) * PAGE_TOKENS + tail_tokens,
        jnp.minimum(selected * PAGE_TOKENS, (positions + 1)[:, None]),
    )
    context_lens = jnp.maximum(context_lens, 0).astype(jnp.int32)
    return SparseSelection(block_ids, page_table, context_lens)
