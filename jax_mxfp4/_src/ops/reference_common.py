"""Pieces the reference operations share: reading tokens out of pages, chunked row loops."""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from jax_mxfp4._src.core import formats
from jax_mxfp4._src.core._bits import mul_pow2
from jax_mxfp4._src.core.formats import HEAD_DIM
from jax_mxfp4._src.core.pages import split_pages

# Rows handled per step of the chunked loops: bounds the size of per-row intermediates
# (a row's gathered and unpacked pages) so memory stays proportional to the chunk, not to T.
_CHUNK_BYTES = 48 << 20


def row_is_live(positions, requests, num_requests: int) -> jnp.ndarray:
    """Rows that score and select: a position >= 0 and a request inside the block table."""
    return (positions >= 0) & (requests >= 0) & (requests < num_requests)


def token_keys(pages: jnp.ndarray) -> tuple[jnp.ndarray, jnp.ndarray]:
    """Keys of every token of ``pages uint8[..., 8704]``, normalized per token.

    Returns ``(keys f32[..., 128, 128], exponent int32[..., 128])`` with
    ``dequantized key = keys * 2**exponent`` exactly: each token is divided by its largest
    scale (``exponent = max scale byte - 127``), so dot products stay at logit scale whatever
    the e8m0 bytes are (no overflow for byte 254, no underflow for byte 1). A token with a
    scale byte 255 gets NaN keys.
    """
    data, scales = split_pages(pages)
    max_byte = jnp.max(scales, axis=-1).astype(jnp.int32)
    codes = formats.unpack_e2m1(data).reshape(*data.shape[:-1], 4, formats.MX_BLOCK)
    relative = scales.astype(jnp.int32) - max_byte[..., None] + 127
    bits = formats.mxfp4_f32_bits(codes, relative[..., None])
    bits = jnp.where((scales == formats.E8M0_NAN)[..., None], jnp.uint32(0x7FC00000), bits)
    keys = jax.lax.bitcast_convert_type(bits, jnp.float32).reshape(*data.shape[:-1], HEAD_DIM)
    return keys, max_byte - 127


def token_values(pages: jnp.ndarray) -> jnp.ndarray:
    """Exactly dequantized tokens of ``pages uint8[..., 8704]``: ``f32[..., 128, 128]``."""
    data, scales = split_pages(pages)
    return formats.dequantize_mxfp4(data, scales, jnp.float32)


def scale_by_exponent(x: jnp.ndarray, exponent: jnp.ndarray) -> jnp.ndarray:
    """``x * 2**exponent`` for fp32 ``x`` (exact for normal results)."""
    return mul_pow2(x, exponent)


def rows_per_chunk(bytes_per_row: int, num_rows) -> int:
    """How many rows one step of a chunked loop takes: at least 1, and at most ``num_rows``
    when that is known (a symbolic row count, from ``jax.export``, gets the full chunk)."""
    chunk = max(1, _CHUNK_BYTES // max(1, bytes_per_row))
    if jax.export.is_symbolic_dim(num_rows):
        return int(chunk)
    return int(max(1, min(num_rows, chunk)))


def map_row_chunks(fn: Callable, row_args: tuple, chunk: int) -> jnp.ndarray | tuple:
    """Apply ``fn`` to consecutive chunks of ``chunk`` rows (axis 0 of every ``row_args``).

    Equivalent to ``fn(*row_args)`` but with intermediates of ``chunk`` rows at a time; the rows
    are padded to a multiple of ``chunk`` with copies of row 0 and the padding is dropped. A
    symbolic row count (``jax.export``) always takes the chunked loop, its step count and
    padding symbolic too: memory stays bounded whatever size the exported function gets.
    """
    num_rows = row_args[0].shape[0]
    symbolic = jax.export.is_symbolic_dim(num_rows)
    if not symbolic and (num_rows == 0 or chunk >= num_rows):
        return fn(*row_args)
    steps = -(-num_rows // chunk)
    pad = steps * chunk - num_rows

    def chunked(a: jnp.ndarray) -> jnp.ndarray:
        if symbolic or pad:
            a = jnp.concatenate([a, jnp.broadcast_to(a[:1], (pad, *a.shape[1:]))])
        return a.reshape(steps, chunk, *a.shape[1:])

    out = jax.lax.map(lambda args: fn(*args), tuple(chunked(a) for a in row_args))
    return jax.tree.map(lambda o: o.reshape(steps * chunk, *o.shape[2:])[:num_rows], out)
