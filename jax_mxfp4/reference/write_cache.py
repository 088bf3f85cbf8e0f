"""Reference ``write_cache``: quantize rows to MXFP4 and store them into pool pages (SPEC §3)."""

from __future__ import annotations

import jax.numpy as jnp

from jax_mxfp4 import formats
from jax_mxfp4.formats import PAGE_SCALE_OFFSET, PAGE_TOKENS, TOKEN_DATA_BYTES, TOKEN_SCALE_BYTES


def write_cache(
    pool: jnp.ndarray, x: jnp.ndarray, slots: jnp.ndarray, *, round_mode: str = "up"
) -> jnp.ndarray:
    """Write token rows into an MXFP4 pool.

    Args:
      pool: ``uint8[P, 8704]`` (index cache) or ``uint8[P, Hkv, 8704]`` (K or V cache).
      x: ``[T, 128]`` for a pool without a head axis, ``[T, Hkv, 128]`` otherwise; any float
        dtype, rounded to bfloat16 before quantization (SPEC §15.10).
      slots: int ``[T]``, ``slot = page * 128 + offset``. Slots < 0 or >= P*128 are skipped.
      round_mode: the e8m0 scale rounding, ``"up"`` | ``"even"`` | ``"down"`` (SPEC §1.4).
    Returns:
      The pool with the rows written (same shape and dtype).
    """
    with_heads = pool.ndim == 3
    pool3 = pool if with_heads else pool[:, None, :]
    x3 = x if with_heads else x[:, None, :]
    num_pages, num_heads = pool3.shape[0], pool3.shape[1]

    packed, scales = formats.quantize_mxfp4(x3, round_mode=round_mode)
    row_bytes = jnp.concatenate([packed, scales], axis=-1)  # [T, H, 68]

    # Range-check in the caller's integer width before narrowing, so an int64 slot past 2**31
    # is skipped rather than wrapped onto a live page.
    inside = slots >= 0
    if num_pages * PAGE_TOKENS <= jnp.iinfo(slots.dtype).max:
        inside = inside & (slots < num_pages * PAGE_TOKENS)
    slots = jnp.where(inside, slots, 0).astype(jnp.int32)
    # An out-of-range slot targets page P, which mode="drop" discards.
    page = jnp.where(inside, slots // PAGE_TOKENS, num_pages)
    offset = jnp.where(inside, slots % PAGE_TOKENS, 0)
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
