"""Reference ``select_blocks``: top-k blocks per (index head, row) and the sparse page table.

SPEC §6, with §6.1's page table and §2.5's padding rows. Per index head ``h`` and row ``t`` with
position ``p``: ``valid = min(p // 128 + 1, NB)`` blocks are candidates. The forced blocks come
first, by construction rather than by sentinel scores (no score can outrank them): the init
blocks ``0 .. min(init_blocks, valid) - 1``, then the local blocks (the last ``local_blocks``
candidates that are not init blocks), ascending. The rest of the ``min(topk, valid)`` selections
are the other candidates by score, descending in the order ``+inf > finite > NaN > -inf``
(``-0 < +0``), ties to the lower block index.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from jax_mxfp4._src.core.formats import PAGE_TOKENS
from jax_mxfp4._src.core.metadata import as_int32
from jax_mxfp4._src.core.selection import SparseSelection
from jax_mxfp4._src.ops.reference_common import row_is_live

INT32_MIN = -(2**31)
NEG_INF_KEY = -2139095042
"""Rank of a ``-inf`` score: one below the rank of ``-inf``'s bit pattern (:func:`score_rank`),
which NaN takes, so that NaN ranks above ``-inf`` and below every finite score."""


def score_rank(scores: jnp.ndarray) -> jnp.ndarray:
    """int32 ranks with the order of the selection (SPEC §6): the float order of the scores
    (``-0 < +0``), NaN just above ``-inf`` and below every finite score. The ranks of finite
    scores and infinities are their order-preserving bit patterns (``bits ^ 0x7FFFFFFF`` for
    negative ones); ``-inf`` moves one below its pattern, which NaN takes."""
    bits = lax.bitcast_convert_type(scores, jnp.int32)
    rank = jnp.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
    rank = jnp.where(scores == -jnp.inf, NEG_INF_KEY, rank)
    return jnp.where(jnp.isnan(scores), NEG_INF_KEY + 1, rank)


def forced_blocks(valid, *, init_blocks: int, local_blocks: int):
    """The forced blocks of rows with ``valid`` candidates, in selection order.

    Returns ``(count int32[T], first_local int32[T], init int32[T])``: the row's forced blocks
    are ``0 .. init - 1`` then ``first_local .. valid - 1`` (``count`` of them); every other
    candidate is in ``[init, first_local)``.
    """
    init = jnp.minimum(valid, init_blocks)
    first_local = jnp.maximum(valid - local_blocks, init)
    return init + valid - first_local, first_local, init


def _selection(scores, valid, forced, first_local, init, topk: int) -> jnp.ndarray:
    """``int32[H, T, topk]``: the forced blocks, then the best of the rest, -1 padded."""
    num_blocks = scores.shape[-1]
    blocks = jnp.arange(num_blocks, dtype=jnp.int32)
    rest = (blocks[None, :] >= init[:, None]) & (blocks[None, :] < first_local[:, None])
    keys = jnp.where(rest[None], score_rank(scores), INT32_MIN)
    if topk > num_blocks:  # lax.top_k needs k <= width; the extra columns never win.
        keys = jnp.pad(keys, ((0, 0), (0, 0), (0, topk - num_blocks)),
                       constant_values=INT32_MIN)
    _, best = lax.top_k(keys, topk)  # ties: lower index first
    rank = jnp.arange(topk, dtype=jnp.int32)[None, :]
    forced_id = jnp.where(rank < init[:, None], rank, first_local[:, None] + rank - init[:, None])
    from_rest = jnp.take_along_axis(best, jnp.maximum(rank - forced[:, None], 0)[None], axis=-1)
    ids = jnp.where((rank < forced[:, None])[None], forced_id[None], from_rest)
    count = jnp.minimum(valid, topk)[None, :, None]
    return jnp.where(rank[None] < count, ids, -1).astype(jnp.int32)


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
    scores = jnp.asarray(scores)
    block_table = as_int32(block_table, "block_table", "id")  # SPEC §2.4
    positions = as_int32(positions, "positions", "id")
    requests = as_int32(requests, "requests", "id")
    num_blocks = scores.shape[-1]
    num_requests = block_table.shape[0]
    # Static counts past the block count mean all blocks (and keep Python ints from
    # overflowing int32 in the graph).
    init_blocks, local_blocks = min(init_blocks, num_blocks), min(local_blocks, num_blocks)
    # A row whose request is not in the table is a padding row, as in index_scores.
    positions = jnp.where(row_is_live(positions, requests, num_requests), positions, -1)
    valid = jnp.where(positions >= 0, jnp.minimum(positions // PAGE_TOKENS + 1, num_blocks), 0)
    forced, first_local, init = forced_blocks(valid, init_blocks=init_blocks,
                                              local_blocks=local_blocks)
    block_ids = _selection(scores, valid, forced, first_local, init, topk)

    # Attention order: full blocks (in selection order), the tail block, then padding.
    by_row = jnp.transpose(block_ids, (1, 0, 2))  # [T, H, k]
    self_block = jnp.where(positions >= 0, positions // PAGE_TOKENS, -2)[:, None, None]
    is_tail = by_row == self_block
    order_key = jnp.where(by_row < 0, 2, is_tail.astype(jnp.int32))
    order = jnp.argsort(order_key, axis=-1, stable=True)
    ordered = jnp.take_along_axis(by_row, order, axis=-1)

    if block_table.shape[1]:
        request = jnp.clip(requests, 0, num_requests - 1)[:, None, None]
        pages = block_table[request, jnp.maximum(ordered, 0)]
    else:  # no blocks at all: nothing is selected, and there is nothing to gather from
        pages = jnp.zeros(ordered.shape, jnp.int32)
    page_table = jnp.where(ordered >= 0, pages, 0).astype(jnp.int32)

    selected = jnp.sum(by_row >= 0, axis=-1)
    has_tail = jnp.any(is_tail, axis=-1)
    tail_tokens = (positions % PAGE_TOKENS + 1)[:, None]
    # min(selected * 128, p + 1), written so that p = INT32_MAX does not wrap.
    context_lens = jnp.where(
        has_tail,
        (selected - 1) * PAGE_TOKENS + tail_tokens,
        jnp.minimum(selected * PAGE_TOKENS - 1, positions[:, None]) + 1,
    )
    context_lens = jnp.maximum(context_lens, 0).astype(jnp.int32)
    return SparseSelection(block_ids, page_table, context_lens)
