"""Integer metadata arguments and the one rule for values wider than int32 (SPEC §2.4).

Every metadata argument (slots, page ids in block and page tables, positions, requests,
context lengths, sequence lengths, prefix lengths, ``cu_seqlens_q``) is accepted as int32 or
int64; anything else is a ``TypeError`` naming the argument. The kernels take int32, so an
int64 value is range-checked *before* it is narrowed, and one that does not fit int32 takes
the out-of-range meaning SPEC §2.3 gives its kind instead of wrapping onto another value:

* an **id** (a slot, a page id, a position, a request) becomes -1: a slot that is not written,
  a page with no live tokens, a padding row, a request outside ``[0, B)``;
* a **length** (context, sequence and prefix lengths, ``cu_seqlens_q``) saturates to
  ``[INT32_MIN, INT32_MAX]``; each operation then clips it as SPEC says (a context longer
  than the page table covers is clipped to it).

Host arrays (numpy arrays, lists) are mapped on the host, before ``jnp.asarray`` could narrow
them (with ``jax_enable_x64`` off it wraps 2**32 + 5 to 5); int64 JAX arrays (x64 on, possibly
traced) are mapped in the graph. The two give the same int32 values.

A function the caller jits gets its arguments through JAX's own conversion at the jit
boundary, which with x64 off wraps host int64 arrays before any code here runs: such a caller
maps them first with :func:`as_int32` (public as ``jm.metadata.as_int32``), passes int32, or
enables x64.
"""

from __future__ import annotations

from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np

INT32_MIN = -(2**31)
INT32_MAX = 2**31 - 1
METADATA_DTYPES = (np.dtype(np.int32), np.dtype(np.int64))
"""The integer dtypes every metadata argument accepts."""

Kind = Literal["id", "length"]
OUT_OF_RANGE_ID = -1
"""What an id that does not fit int32 becomes (skip / padding / no page)."""


def _on_device(x) -> bool:
    """Whether ``x`` is a JAX array or tracer (else a host value: numpy array, list...)."""
    return isinstance(x, jax.Array)


def check_dtype(x, name: str) -> np.dtype:
    """``x``'s dtype if it is int32 or int64, else a ``TypeError`` naming ``name``."""
    dtype = np.dtype(x.dtype)
    if dtype not in METADATA_DTYPES:
        raise TypeError(f"{name} must be int32 or int64, got {dtype.name}{list(np.shape(x))}")
    return dtype


def as_int32(x, name: str, kind: Kind) -> jnp.ndarray:
    """The int32 JAX array of metadata argument ``x`` (int32 or int64, any shape).

    int32 passes through unchanged; an int64 value outside int32 becomes -1 (``kind="id"``)
    or saturates (``kind="length"``), never a wrapped value. Raises ``TypeError`` (naming
    ``name``) for any other dtype.
    """
    if not _on_device(x):
        x = np.asarray(x)
    if check_dtype(x, name) == np.int32:
        return jnp.asarray(x)
    xp = jnp if _on_device(x) else np
    if kind == "id":
        fits = (x >= INT32_MIN) & (x <= INT32_MAX)
        narrowed = xp.where(fits, x, OUT_OF_RANGE_ID)
    else:
        narrowed = xp.clip(x, INT32_MIN, INT32_MAX)
    return jnp.asarray(narrowed.astype(np.int32))


def table_and_rows(block_table, positions, requests) -> tuple[jnp.ndarray, ...]:
    """The block table and row metadata as int32 (SPEC §2.4: an int64 page id, position or
    request outside int32 becomes -1)."""
    return (as_int32(block_table, "block_table", "id"), as_int32(positions, "positions", "id"),
            as_int32(requests, "requests", "id"))


__all__ = ["INT32_MAX", "INT32_MIN", "METADATA_DTYPES", "OUT_OF_RANGE_ID", "as_int32",
           "check_dtype", "table_and_rows"]
