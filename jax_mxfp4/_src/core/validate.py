"""Trace-time checks of operands and options, shared by the public API and the primitives.

Each check raises ``TypeError`` (wrong dtype) or ``ValueError`` (wrong shape or option) with a
message that names the argument and says what was expected. They look only at shapes, dtypes
and static options, so they run at trace time and cost nothing at run time.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from jax_mxfp4._src.core.formats import HEAD_DIM, PAGE_BYTES
from jax_mxfp4._src.core.scaling import FLT_MIN, LOG2E_LITERAL

QUERY_DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float8_e4m3fn))
Q_ROUNDS = ("e4m3", "none")
OUTPUTS = ("bf16", "mxfp8")


def describe(x) -> str:
    return f"{jnp.dtype(x.dtype).name}{list(x.shape)}"


def dtype_is(x, name: str, expected, what: str | None = None) -> None:
    expected = expected if isinstance(expected, tuple) else (expected,)
    if jnp.dtype(x.dtype) not in tuple(jnp.dtype(e) for e in expected):
        names = " or ".join(jnp.dtype(e).name for e in expected)
        raise TypeError(f"{name} must be {what or names}, got {describe(x)}")


def rank_is(x, name: str, ndim: int, layout: str) -> None:
    if x.ndim != ndim:
        raise ValueError(f"{name} must have shape {layout}, got {describe(x)}")


def dim_is(x, name: str, axis: int, size: int, layout: str) -> None:
    if x.shape[axis] != size:
        raise ValueError(
            f"{name} must have shape {layout} with axis {axis} of size {size}, got {describe(x)}"
        )


def query(q, name: str = "q") -> None:
    """``bfloat16 | float8_e4m3fn [T, H, 128]``."""
    if jnp.dtype(q.dtype) not in QUERY_DTYPES:
        raise TypeError(f"{name} must be bfloat16 or float8_e4m3fn, got {describe(q)}")
    rank_is(q, name, 3, f"[T, H, {HEAD_DIM}]")
    dim_is(q, name, 2, HEAD_DIM, f"[T, H, {HEAD_DIM}]")


def pool(p, name: str, *, heads: bool) -> None:
    """``uint8[P, 8704]`` (``heads=False``) or ``uint8[P, Hkv, 8704]``."""
    layout = f"[P, Hkv, {PAGE_BYTES}]" if heads else f"[P, {PAGE_BYTES}]"
    dtype_is(p, name, jnp.uint8, f"uint8 pages {layout}")
    rank_is(p, name, 3 if heads else 2, layout)
    dim_is(p, name, -1, PAGE_BYTES, layout)
    if p.shape[0] < 1:
        raise ValueError(f"{name} must hold at least one page, got {describe(p)}")
    if heads and p.shape[1] < 1:
        raise ValueError(f"{name} must have at least one kv head, got {describe(p)}")


def int32_vector(x, name: str, length: int) -> None:
    dtype_is(x, name, jnp.int32, "int32")
    rank_is(x, name, 1, f"[{length}]")
    dim_is(x, name, 0, length, f"[{length}]")


def rows(positions, requests, num_rows: int) -> None:
    int32_vector(positions, "positions", num_rows)
    int32_vector(requests, "requests", num_rows)


def block_table(table, num_blocks: int) -> None:
    dtype_is(table, "block_table", jnp.int32, "int32")
    rank_is(table, "block_table", 2, "[B, >= num_blocks]")
    if table.shape[0] < 1:
        raise ValueError(f"block_table must have at least one request row, got {describe(table)}")
    if table.shape[1] < num_blocks:
        raise ValueError(
            f"block_table must have at least num_blocks={num_blocks} columns, got "
            f"{describe(table)}"
        )


def static(value, name: str) -> None:
    """A traced value where a static option belongs: say so, not "got JitTracer(...)"."""
    if isinstance(value, jax.core.Tracer):
        raise TypeError(f"{name} must be static (a Python number known when tracing), got a "
                        f"traced value; under jax.jit pass it through static_argnames")


def positive_int(value, name: str, minimum: int = 1) -> int:
    static(value, name)
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def scale(value, name: str = "sm_scale") -> float:
    """A static softmax scale whose fp32 value is finite, positive and normal (SPEC §9.3)."""
    static(value, name)
    try:
        f = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a Python float, got {value!r}") from None
    with np.errstate(over="ignore"):
        f32 = np.float32(f)
    if not (math.isfinite(f) and np.isfinite(f32) and f32 > 0):
        raise ValueError(f"{name} must be finite and positive in fp32, got {value!r}")
    if f32 < FLT_MIN:  # SPEC §9.3: XLA's CPU flushes a subnormal scale to zero
        raise ValueError(
            f"{name} must be a normal fp32, at least {FLT_MIN!r} (the smallest normal), got "
            f"{value!r}, which is subnormal in fp32 (SPEC §9.3)"
        )
    return f


def score_scale(value, name: str = "sm_scale") -> float:
    """:func:`scale`, and ``fp32(sm_scale * 1.4426950409)`` (the scorers' folded scale, SPEC
    §4) finite and positive too."""
    f = scale(value, name)
    with np.errstate(over="ignore"):
        folded = np.float32(f * LOG2E_LITERAL)
    if not (np.isfinite(folded) and folded > 0):
        raise ValueError(
            f"{name} must make {name} * log2(e) a finite positive fp32, got {value!r}"
        )
    return f


def static_shapes(operands, where: str) -> None:
    """``operands``: ``(name, array or aval)`` pairs. A symbolic dimension (``jax.export``
    with ``jax.export.symbolic_shape``) where ``where``'s kernels need every size when the call
    is lowered (their launch grids and plans are sized from the shapes): ``ValueError`` naming
    the operand and the dimension, instead of JAX's ``InconclusiveDimensionOperation`` from
    deep inside a launch plan."""
    for name, x in operands:
        for axis, size in enumerate(x.shape):
            if jax.export.is_symbolic_dim(size):
                raise ValueError(
                    f"{name}: dimension {axis} ({str(size)!r}) must be static for {where}: its "
                    f"kernels launch grids sized from the shapes when the call is lowered. "
                    f"Export with concrete sizes, or with backend 'auto' on the CPU (the C++ "
                    f"handlers) or backend 'reference', which take symbolic dimensions"
                )


def option(value, name: str, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")
    return value
