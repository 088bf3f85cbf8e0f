"""Integer metadata: int32 or int64, and the one rule for values wider than int32 (SPEC §2.4).

``jm.metadata.as_int32(x, name, kind)`` maps a host or JAX array to int32 the way every
operation does: an ``"id"`` that does not fit int32 becomes -1, a ``"length"`` saturates. A
caller that jits its own function with ``jax_enable_x64`` off maps host int64 arrays with it
first. The rule is written in ``jax_mxfp4._src.core.metadata``.
"""

from jax_mxfp4._src.core.metadata import (
    INT32_MAX,
    INT32_MIN,
    METADATA_DTYPES,
    OUT_OF_RANGE_ID,
    as_int32,
    check_dtype,
)

__all__ = ["INT32_MAX", "INT32_MIN", "METADATA_DTYPES", "OUT_OF_RANGE_ID", "as_int32",
           "check_dtype"]
