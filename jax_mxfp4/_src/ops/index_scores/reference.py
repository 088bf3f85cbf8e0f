"""Reference ``index_scores``: block scores of each query row over the MXFP4 index cache.

SPEC §4 (prefill rows) and §5 (decode rows) are one operation here: every row carries its
absolute position and request. Per index head ``h``, row ``t`` and block ``j``::

    out[h, t, j] = fp32(max over live tokens k of  Qe[t, h] . K[page(t, j), k])
                   * fp32(sm_scale * 1.4426950409)

with ``page(t, j) = block_table[requests[t], j]``, token ``k`` live iff ``j*128 + k <=
positions[t]``, and ``-inf`` where no token is live (past the row's reach, padding rows, pages
outside the pool: SPEC §4.1, §2.3); NaN where a live token's logit is not finite (SPEC
§9.2).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from jax_mxfp4._src.core import formats, validate
from jax_mxfp4._src.core._bits import widen_rounded
from jax_mxfp4._src.core.formats import PAGE_TOKENS
from jax_mxfp4._src.core.metadata import as_int32
from jax_mxfp4._src.core.scaling import folded_score_scale
from jax_mxfp4._src.ops.reference_common import (
    map_row_chunks,
    row_is_live,
    rows_per_chunk,
    scale_by_exponent,
    token_keys,
)

# With at most this many (request, head) pairs, scoring every row against every request's
# block as one matmul beats gathering each row's keys.
_DENSE_REQUEST_HEADS = 16


def scoring_query(q: jnp.ndarray, q_round: str) -> jnp.ndarray:
    """The fp32 query a scorer multiplies: bf16 rounded to e4m3 (``q_round="e4m3"``) or kept
    (``"none"``); an e4m3 query as stored (SPEC §4, §5.1)."""
    if q.dtype == jnp.bfloat16 and q_round == "e4m3":
        return widen_rounded(formats.to_e4m3(q))
    return widen_rounded(q)


def _block_maxima_gathered(qe, keys, exponent, requests, live):
    """Per-row max logit of one block, gathering each row's request keys. -> f32[T, H]."""

    def rows(qe, requests, live):
        dots = jnp.einsum("thd,tkd->thk", qe, keys[requests], precision=lax.Precision.HIGHEST)
        logits = scale_by_exponent(dots, exponent[requests][:, None, :])
        return _live_max(logits, live)

    per_row_bytes = 4 * keys.shape[-2] * (keys.shape[-1] + qe.shape[1])
    chunk = rows_per_chunk(per_row_bytes, qe.shape[0])
    return map_row_chunks(rows, (qe, requests, live), chunk)


def _block_maxima_dense(qe, keys, exponent, requests, live):
    """Per-row max logit of one block, scoring rows against every request. -> f32[T, H]."""
    dots = jnp.einsum("thd,bkd->tbhk", qe, keys, precision=lax.Precision.HIGHEST)
    dots = jnp.take_along_axis(dots, requests[:, None, None, None], axis=1)[:, 0]
    logits = scale_by_exponent(dots, exponent[requests][:, None, :])
    return _live_max(logits, live)


def _live_max(logits, live) -> jnp.ndarray:
    """Max over the live tokens (``live [T, 128]``) of ``logits f32[T, H, 128]`` -> ``[T, H]``:
    ``-inf`` with none, NaN where a live logit is not finite (SPEC §9.2: a NaN key or query,
    or an fp32 overflow, whatever the summation order made of it)."""
    seen = live[:, None, :]
    best = jnp.max(jnp.where(seen, logits, -jnp.inf), axis=-1)
    return jnp.where(jnp.any(seen & ~jnp.isfinite(logits), axis=-1), jnp.nan, best)


def index_scores(
    q: jnp.ndarray,
    index_pool: jnp.ndarray,
    block_table: jnp.ndarray,
    positions: jnp.ndarray,
    requests: jnp.ndarray,
    *,
    num_blocks: int,
    sm_scale: float,
    q_round: str = "e4m3",
) -> jnp.ndarray:
    """Block scores ``f32[H, T, num_blocks]``.

    Args:
      q: ``bfloat16 | float8_e4m3fn [T, H, 128]`` index queries.
      index_pool: ``uint8[P, 8704]`` MXFP4 index-key pages.
      block_table: ``int32[B, >= num_blocks]``, logical block -> page of each request.
      positions: ``int32[T]`` absolute position of each row, -1 for padding rows.
      requests: ``int32[T]`` request of each row.
      num_blocks: static number of blocks scored per row.
      sm_scale: softmax scale; the output carries ``fp32(sm_scale * 1.4426950409)``.
      q_round: ``"e4m3"`` rounds a bf16 query to e4m3 first, ``"none"`` keeps it.
    """
    q, index_pool = jnp.asarray(q), jnp.asarray(index_pool)
    block_table = as_int32(block_table, "block_table", "id")  # SPEC §2.4
    positions = as_int32(positions, "positions", "id")
    requests = as_int32(requests, "requests", "id")
    num_rows = q.shape[0]
    num_requests, num_pages = block_table.shape[0], index_pool.shape[0]
    validate.score_scale(sm_scale)  # SPEC §9.3: a normal fp32, as the public API demands
    score_scale = folded_score_scale(sm_scale)
    qe = scoring_query(q, q_round)
    row_ok = row_is_live(positions, requests, num_requests)
    requests = jnp.clip(requests, 0, num_requests - 1)
    offsets = jnp.arange(PAGE_TOKENS, dtype=jnp.int32)
    dense = num_requests * q.shape[1] <= _DENSE_REQUEST_HEADS
    block_maxima = _block_maxima_dense if dense else _block_maxima_gathered

    def one_block(j: jnp.ndarray) -> jnp.ndarray:
        pages = block_table[:, j]
        page_ok = (pages >= 0) & (pages < num_pages)
        keys, exponent = token_keys(index_pool[jnp.clip(pages, 0, num_pages - 1)])
        live = (row_ok & page_ok[requests])[:, None] & (
            j * PAGE_TOKENS + offsets[None, :] <= positions[:, None]
        )
        return block_maxima(qe, keys, exponent, requests, live) * score_scale

    if num_rows == 0 or num_blocks == 0:
        return jnp.zeros((q.shape[1], num_rows, num_blocks), jnp.float32)
    maxima = jax.lax.map(one_block, jnp.arange(num_blocks, dtype=jnp.int32))  # [NB, T, H]
    return jnp.transpose(maxima, (2, 1, 0))
