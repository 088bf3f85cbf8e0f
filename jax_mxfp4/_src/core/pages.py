"""Paged MXFP4 pools (SPEC §2.1).

One page holds 128 tokens of one head: ``[128 tokens x 64 B e2m1 data][128 tokens x 4 B e8m0
scales]`` = 8704 bytes. The index pool is ``uint8[P, 8704]`` (one shared index head); K and V pools
are ``uint8[P, Hkv, 8704]`` (one page per (page, kv head)).
"""

from __future__ import annotations

import jax.numpy as jnp

from jax_mxfp4._src.core.formats import (
    PAGE_BYTES,
    PAGE_SCALE_OFFSET,
    PAGE_TOKENS,
    TOKEN_DATA_BYTES,
    TOKEN_SCALE_BYTES,
    dequantize_mxfp4,
)


def new_pool(num_pages: int, num_heads: int | None = None) -> jnp.ndarray:
    """A zeroed pool: ``uint8[num_pages, 8704]``, or ``uint8[num_pages, num_heads, 8704]``."""
    if int(num_pages) < 1:
        raise ValueError(f"num_pages must be >= 1, got {num_pages}")
    if num_heads is None:
        return jnp.zeros((int(num_pages), PAGE_BYTES), jnp.uint8)
    if int(num_heads) < 1:
        raise ValueError(f"num_heads must be >= 1 or None, got {num_heads}")
    return jnp.zeros((int(num_pages), int(num_heads), PAGE_BYTES), jnp.uint8)


def last_writer_slots(slots: jnp.ndarray) -> jnp.ndarray:
    """``slots`` (int32 ``[T]``) with every row that a later row overwrites set to -1.

    Writing the rows in any order then keeps the last writer of each slot (SPEC §3.1), which
    is what makes a scatter deterministic where conflicting updates land in any order (XLA's
    GPU scatter, the GPU kernels' programs). O(T log T): a stable sort puts each slot's rows in
    row order, and the last of each run is kept. Rows already skipped (-1) stay -1.
    """
    order = jnp.argsort(slots, stable=True)
    ordered = slots[order]
    last = jnp.append(ordered[1:] != ordered[:-1], True)
    keep = jnp.zeros(slots.shape, jnp.bool_).at[order].set(last)
    return jnp.where(keep, slots, -1)


def check_pool(pool, name: str, *, with_heads: bool | None = None) -> None:
    """Raise TypeError/ValueError unless ``pool`` is a uint8 pool with 8704-byte pages."""
    if pool.dtype != jnp.uint8:
        raise TypeError(f"{name} must be uint8 pages, got dtype {pool.dtype}")
    if pool.ndim not in (2, 3) or pool.shape[-1] != PAGE_BYTES:
        raise ValueError(
            f"{name} must have shape [P, {PAGE_BYTES}] or [P, Hkv, {PAGE_BYTES}], got {pool.shape}"
        )
    if with_heads is True and pool.ndim != 3:
        raise ValueError(f"{name} must have shape [P, Hkv, {PAGE_BYTES}], got {pool.shape}")
    if with_heads is False and pool.ndim != 2:
        raise ValueError(f"{name} must have shape [P, {PAGE_BYTES}], got {pool.shape}")


def split_pages(pages: jnp.ndarray) -> tuple[jnp.ndarray, jnp.ndarray]:
    """``uint8[..., 8704]`` pages -> ``(data uint8[..., 128, 64], scales uint8[..., 128, 4])``."""
    lead = pages.shape[:-1]
    data = pages[..., :PAGE_SCALE_OFFSET].reshape(*lead, PAGE_TOKENS, TOKEN_DATA_BYTES)
    scales = pages[..., PAGE_SCALE_OFFSET:].reshape(*lead, PAGE_TOKENS, TOKEN_SCALE_BYTES)
    return data, scales


def dequantize_pool(pool: jnp.ndarray, dtype=jnp.float32) -> jnp.ndarray:
    """Every token of every page: ``[P, 128, D]`` or ``[P, Hkv, 128, D]`` in ``dtype``."""
    pool = jnp.asarray(pool)
    check_pool(pool, "pool")
    data, scales = split_pages(pool)
    return dequantize_mxfp4(data, scales, dtype)
