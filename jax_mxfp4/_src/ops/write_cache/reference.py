"""Reference ``write_cache``: quantize rows to MXFP4 and store them into pool pages (SPEC §3)."""

from __future__ import annotations

import jax.numpy as jnp

from jax_mxfp4._src.core import formats
from jax_mxfp4._src.core.formats import (
    PAGE_SCALE_OFFSET,
    PAGE_TOKENS,
    TOKEN_DATA_BYTES,
    TOKEN_SCALE_BYTES,
)
from jax_mxfp4._src.core.metadata import as_int32
from jax_mxfp4._src.core.pages import last_writer_slots


def scatter_targets(slots, num_pages: int) -> tuple[jnp.ndarray, jnp.ndarray]:
    """Where each row is written: ``(page int32[T], offset int32[T])``, page ``num_pages`` (out
    of bounds: dropped) for a row that is skipped.

    Slots outside the pool are skipped (an int64 slot outside int32 included, SPEC §2.4),
    and of several rows with one slot only the last is written (SPEC §3.1): resolved here, so
    no two rows target the same bytes and the scatter gives the same bits on every platform
    (XLA's GPU scatter applies conflicting updates in any order).
    """
    slots = as_int32(slots, "slots", "id")
    inside = (slots >= 0) & (slots // PAGE_TOKENS < num_pages)
    slots = last_writer_slots(jnp.where(inside, slots, -1))
    inside = slots >= 0
    page = jnp.where(inside, slots // PAGE_TOKENS, num_pages)
    return page, jnp.where(inside, slots % PAGE_TOKENS, 0)


def write_cache(
    pool: jnp.ndarray, x: jnp.ndarray, slots: jnp.ndarray, *, round_mode: str = "up"
) -> jnp.ndarray:
    """Write token rows into an MXFP4 pool.

    Args:
      pool: ``uint8[P, 8704]`` (index cache) or ``uint8[P, Hkv, 8704]`` (K or V cache).
      x: ``[T, 128]`` for a pool without a head axis, ``[T, Hkv, 128]`` otherwise; any float
        dtype, rounded to bfloat16 before quantization (SPEC §1.4).
      slots: int32 | int64 ``[T]``, ``slot = page * 128 + offset``. Slots < 0 or >= P*128 are
        skipped; of several rows naming one slot, the last is written.
      round_mode: the e8m0 scale rounding, ``"up"`` | ``"even"`` | ``"down"`` (SPEC §1.4).
    Returns:
      The pool with the rows written (same shape and dtype).
    """
    pool, x = jnp.asarray(pool), jnp.asarray(x)
    with_heads = pool.ndim == 3
    pool3 = pool if with_heads else pool[:, None, :]
    x3 = x if with_heads else x[:, None, :]
    num_pages, num_heads = pool3.shape[0], pool3.shape[1]

    packed, scales = formats.quantize_mxfp4(x3, round_mode=round_mode)
    row_bytes = jnp.concatenate([packed, scales], axis=-1)  # [T, H, 68]

    page, offset = scatter_targets(slots, num_pages)
    columns = jnp.concatenate(
        [
            offset[:, None] * TOKEN_DATA_BYTES + jnp.arange(TOKEN_DATA_BYTES),
            PAGE_SCALE_OFFSET + offset[:, None] * TOKEN_SCALE_BYTES + jnp.arange(TOKEN_SCALE_BYTES),
        ],
        axis=-1,
    )  # [T, 68]
    heads = jnp.arange(num_heads)
    out = pool3.at[page[:, None, None], heads[None, :, None], columns[:, None, :]].set(
        row_bytes, mode="drop"
    )
    return out if with_heads else out[:, 0, :]
