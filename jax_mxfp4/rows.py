"""Query-row metadata: each row has an absolute position (-1 = padding) and a request.

Every operation takes rows in this one form, so prefill (ragged chunks) and decode (S tokens
per request) share the same kernels (SPEC §2.2, §15.11). ``slot_mapping`` turns rows into the
cache slots their keys are written to.
"""

from __future__ import annotations

import jax.numpy as jnp

from jax_mxfp4.formats import PAGE_TOKENS


def _int_vector(x, name: str) -> jnp.ndarray:
    x = jnp.asarray(x)
    if x.ndim != 1 or not jnp.issubdtype(x.dtype, jnp.integer):
        raise TypeError(f"{name} must be a 1-D integer array, got {x.dtype}{list(x.shape)}")
    return x.astype(jnp.int32)


def prefill_rows(cu_seqlens_q, prefix_lens, num_rows: int) -> tuple[jnp.ndarray, jnp.ndarray]:
    """Rows of a prefill batch.

    Args:
      cu_seqlens_q: int ``[B+1]``, starting at 0: request ``b`` owns rows ``cu[b]..cu[b+1]-1``.
      prefix_lens: int ``[B]``, tokens already cached before this chunk.
      num_rows: static ``T`` (>= ``cu[B]``); rows past the last request are padding.
    Returns:
      ``(positions int32[T], requests int32[T])``: row ``cu[b] + r`` has position
      ``prefix_lens[b] + r``; padding rows have position -1 and request 0.
    """
    cu = _int_vector(cu_seqlens_q, "cu_seqlens_q")
    prefix = _int_vector(prefix_lens, "prefix_lens")
    if cu.shape[0] != prefix.shape[0] + 1:
        raise ValueError(
            f"cu_seqlens_q must have len(prefix_lens) + 1 = {prefix.shape[0] + 1} entries, "
            f"got {cu.shape[0]}"
        )
    if int(num_rows) < 0:
        raise ValueError(f"num_rows must be >= 0, got {num_rows}")
    rows = jnp.arange(int(num_rows), dtype=jnp.int32)
    # The request of row n is the number of requests whose end is <= n.
    requests = jnp.sum(cu[None, 1:] <= rows[:, None], axis=1).astype(jnp.int32)
    num_requests = prefix.shape[0]
    live = requests < num_requests
    safe = jnp.minimum(requests, num_requests - 1)
    positions = prefix[safe] + rows - cu[safe]
    positions = jnp.where(live, positions, -1).astype(jnp.int32)
    return positions, jnp.where(live, requests, 0).astype(jnp.int32)


def decode_rows(seq_lens, tokens_per_request: int) -> tuple[jnp.ndarray, jnp.ndarray]:
    """Rows of a decode step: ``S`` tokens per request, request-major (row = b*S + s).

    Args:
      seq_lens: int ``[B]``, cached tokens per request including this step's tokens.
      tokens_per_request: static ``S`` (1, or 1 + speculative tokens).
    Returns:
      ``(positions int32[B*S], requests int32[B*S])`` with position ``seq_lens[b] - S + s``,
      or -1 where that would be negative.
    """
    seq = _int_vector(seq_lens, "seq_lens")
    s = int(tokens_per_request)
    if s < 1:
        raise ValueError(f"tokens_per_request must be >= 1, got {tokens_per_request}")
    steps = jnp.arange(s, dtype=jnp.int32)
    positions = (seq[:, None] - s + steps[None, :]).reshape(-1)
    requests = jnp.repeat(jnp.arange(seq.shape[0], dtype=jnp.int32), s)
    return jnp.where(positions >= 0, positions, -1).astype(jnp.int32), requests


def slot_mapping(block_table, positions, requests) -> jnp.ndarray:
    """The cache slot of each row, for ``write_cache``: ``int32[T]``.

    Args:
      block_table: int ``[B, W]``, logical block -> page of each request.
      positions, requests: int ``[T]`` from ``prefill_rows`` / ``decode_rows``.
    Returns:
      ``block_table[requests, positions // 128] * 128 + positions % 128``, and -1 (not
      written) for padding rows (position < 0), requests outside ``[0, B)``, blocks past the
      table's width and negative pages, so that a bad row never lands in another row's page.
    """
    table = jnp.asarray(block_table)
    if table.ndim != 2 or not jnp.issubdtype(table.dtype, jnp.integer):
        raise TypeError(f"block_table must be a 2-D integer array, got {table.dtype}"
                        f"{list(table.shape)}")
    pos = _int_vector(positions, "positions")
    req = _int_vector(requests, "requests")
    if pos.shape != req.shape:
        raise ValueError(f"positions and requests must have the same length, got "
                         f"{pos.shape[0]} and {req.shape[0]}")
    num_requests, width = table.shape
    if num_requests == 0 or width == 0:
        return jnp.full(pos.shape, -1, jnp.int32)
    blocks = pos // PAGE_TOKENS
    ok = (pos >= 0) & (req >= 0) & (req < num_requests) & (blocks < width)
    pages = table[jnp.clip(req, 0, num_requests - 1), jnp.clip(blocks, 0, width - 1)]
    ok = ok & (pages >= 0)
    return jnp.where(ok, pages.astype(jnp.int32) * PAGE_TOKENS + pos % PAGE_TOKENS, -1)


def last_writer_slots(slots: jnp.ndarray) -> jnp.ndarray:
    """``slots`` (int32 ``[T]``) with every row that a later row overwrites set to -1, so
    that writing the rows in any order keeps the last writer of each slot (SPEC §15.14).
    O(T log T): a stable sort puts each slot's rows in row order, and the last of each run
    is kept."""
    order = jnp.argsort(slots, stable=True)
    ordered = slots[order]
    last = jnp.append(ordered[1:] != ordered[:-1], True)
    keep = jnp.zeros(slots.shape, jnp.bool_).at[order].set(last)
    return jnp.where(keep, slots, -1)
