"""Helpers for batching rules that fold a vmapped axis into a kernel's own dimensions."""

from __future__ import annotations

import jax.numpy as jnp

NOT_MAPPED = None  # how JAX marks an argument that vmap does not batch


def batch_size(args, dims) -> int:
    return next(a.shape[d] for a, d in zip(args, dims, strict=True) if d is not NOT_MAPPED)


def to_front(x: jnp.ndarray, dim, size: int) -> jnp.ndarray:
    """``x`` with its batch axis first; an unbatched ``x`` is broadcast to ``size`` copies."""
    if dim is NOT_MAPPED:
        return jnp.broadcast_to(x, (size, *x.shape))
    return jnp.moveaxis(x, dim, 0)


def all_to_front(args, dims) -> tuple[int, list[jnp.ndarray]]:
    """The batch size, and every argument with its batch axis first (broadcast if unbatched)."""
    n = batch_size(args, dims)
    return n, [to_front(a, d, n) for a, d in zip(args, dims, strict=True)]


def is_batched(dim) -> bool:
    return dim is not NOT_MAPPED


def fold(x: jnp.ndarray) -> jnp.ndarray:
    """``[N, A, ...]`` -> ``[N*A, ...]``."""
    return x.reshape(x.shape[0] * x.shape[1], *x.shape[2:])


def offset_ids(ids: jnp.ndarray, extent: int) -> jnp.ndarray:
    """Ids ``[N, ...]`` into a per-problem range ``[0, extent)`` -> ids into the folded range
    ``[0, N*extent)``; an id outside its problem's range becomes -1 (still out of range)."""
    problem = jnp.arange(ids.shape[0], dtype=ids.dtype).reshape(-1, *([1] * (ids.ndim - 1)))
    inside = (ids >= 0) & (ids < extent)
    return jnp.where(inside, ids + problem * extent, -1).astype(ids.dtype)
