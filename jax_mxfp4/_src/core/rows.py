"""Query-row metadata: each row has an absolute position (-1 = padding) and a request.

Every operation takes rows in this one form, so prefill (ragged chunks) and decode (S tokens
per request) share the same kernels (SPEC §2.2, §2.5). ``slot_mapping`` turns rows into the
cache slots their keys are written to.
"""

from __future__ import annotations

import jax.numpy as jnp

from jax_mxfp4._src.core.formats import PAGE_TOKENS
from jax_mxfp4._src.core.metadata import INT32_MAX, Kind, as_int32

MAX_SLOT_PAGE = INT32_MAX // PAGE_TOKENS
"""The largest page whose slots ``page * 128 + offset`` all fit int32."""


def _vector(x, name: str, kind: Kind) -> jnp.ndarray:
    """``x`` as an int32 vector (int32 or int64 accepted, SPEC §2.4)."""
    x = as_int32(x, name, kind)
    if x.ndim != 1:
        raise ValueError(f"{name} must be a 1-D array, got shape {list(x.shape)}")
    return x


def prefill_rows(cu_seqlens_q, prefix_lens, num_rows: int) -> tuple[jnp.ndarray, jnp.ndarray]:
    """Rows of a prefill batch.

    Args:
      cu_seqlens_q: int32 | int64 ``[B+1]``, starting at 0: request ``b`` owns rows
        ``cu[b]..cu[b+1]-1``.
      prefix_lens: int32 | int64 ``[B]``, tokens already cached before this chunk.
      num_rows: static ``T`` (>= ``cu[B]``); rows past the last request are padding.
    Returns:
      ``(positions int32[T], requests int32[T])``: row ``cu[b] + r`` has position
      ``prefix_lens[b] + r``; rows past the last request (every row when ``B = 0``) have
      position -1 and request 0. A row whose position would not fit int32, or whose request
      starts at a negative row or after it, or has a negative prefix, gets position -1 (never
      a wrapped value). Lengths wider than int32 saturate first (SPEC §2.4).
    """
    cu = _vector(cu_seqlens_q, "cu_seqlens_q", "length")
    prefix = _vector(prefix_lens, "prefix_lens", "length")
    if cu.shape[0] != prefix.shape[0] + 1:
        raise ValueError(
            f"cu_seqlens_q must have len(prefix_lens) + 1 = {prefix.shape[0] + 1} entries, "
            f"got {cu.shape[0]}"
        )
    num_rows = int(num_rows)
    if not 0 <= num_rows <= INT32_MAX:
        raise ValueError(f"num_rows must be in [0, 2**31 - 1], got {num_rows}")
    num_requests = prefix.shape[0]
    if num_requests == 0:
        return jnp.full((num_rows,), -1, jnp.int32), jnp.zeros((num_rows,), jnp.int32)
    rows = jnp.arange(num_rows, dtype=jnp.int32)
    # The request of row n is the number of requests whose end is <= n.
    requests = jnp.sum(cu[None, 1:] <= rows[:, None], axis=1).astype(jnp.int32)
    live = requests < num_requests
    safe = jnp.minimum(requests, num_requests - 1)
    start, base = cu[safe], prefix[safe]
    # offset = n - start and base + offset, each computed only where it cannot overflow.
    inside = (start >= 0) & (start <= rows)
    offset = jnp.where(inside, rows - start, 0)
    fits = inside & (base >= 0) & (offset <= INT32_MAX - jnp.maximum(base, 0))
    positions = jnp.where(live & fits, base + offset, -1).astype(jnp.int32)
    return positions, jnp.where(live, requests, 0).astype(jnp.int32)


def decode_rows(seq_lens, tokens_per_request: int) -> tuple[jnp.ndarray, jnp.ndarray]:
    """Rows of a decode step: ``S`` tokens per request, request-major (row = b*S + s).

    Args:
      seq_lens: int32 | int64 ``[B]``, cached tokens per request including this step's
        tokens (an int64 length past int32 saturates: SPEC §2.4).
      tokens_per_request: static ``S`` (1, or 1 + speculative tokens).
    Returns:
      ``(positions int32[B*S], requests int32[B*S])`` with position ``seq_lens[b] - S + s``,
      or -1 where that would be negative (computed without overflow: a length near
      ``INT32_MIN`` never wraps to a large position).
    """
    seq = _vector(seq_lens, "seq_lens", "length")
    s = int(tokens_per_request)
    if not 1 <= s <= INT32_MAX:
        raise ValueError(f"tokens_per_request must be in [1, 2**31 - 1], got {tokens_per_request}")
    back = s - jnp.arange(s, dtype=jnp.int32)  # token s sits S - s tokens before the end
    valid = seq[:, None] >= back[None, :]
    positions = jnp.where(valid, seq[:, None] - back[None, :], -1).reshape(-1)
    requests = jnp.repeat(jnp.arange(seq.shape[0], dtype=jnp.int32), s)
    return positions.astype(jnp.int32), requests


def slot_mapping(block_table, positions, requests) -> jnp.ndarray:
    """The cache slot of each row, for ``write_cache``: ``int32[T]``.

    Args:
      block_table: int32 | int64 ``[B, W]``, logical block -> page of each request.
      positions, requests: int32 | int64 ``[T]`` from ``prefill_rows`` / ``decode_rows``.
    Returns:
      ``block_table[requests, positions // 128] * 128 + positions % 128``, and -1 (not
      written) for padding rows (position < 0), requests outside ``[0, B)``, blocks past the
      table's width, negative pages and pages past ``MAX_SLOT_PAGE`` (whose slots do not fit
      int32), so that a bad row never lands in another row's page. int64 values outside
      int32 are out of range (SPEC §2.4).
    """
    table = as_int32(block_table, "block_table", "id")
    if table.ndim != 2:
        raise ValueError(f"block_table must be a 2-D array [B, W], got shape "
                         f"{list(table.shape)}")
    pos = _vector(positions, "positions", "id")
    req = _vector(requests, "requests", "id")
    if pos.shape != req.shape:
        raise ValueError(f"positions and requests must have the same length, got "
                         f"{pos.shape[0]} and {req.shape[0]}")
    num_requests, width = table.shape
    if num_requests == 0 or width == 0:
        return jnp.full(pos.shape, -1, jnp.int32)
    blocks = pos // PAGE_TOKENS
    ok = (pos >= 0) & (req >= 0) & (req < num_requests) & (blocks < width)
    pages = table[jnp.clip(req, 0, num_requests - 1), jnp.clip(blocks, 0, width - 1)]
    ok = ok & (pages >= 0) & (pages <= MAX_SLOT_PAGE)
    return jnp.where(ok, pages * PAGE_TOKENS + pos % PAGE_TOKENS, -1).astype(jnp.int32)
