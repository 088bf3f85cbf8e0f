"""Every operation in plain ``jax.numpy``, exactly per SPEC: the oracle the kernels are tested
against, and the lowering used where no kernel exists (or under ``set_backend("reference")``).

These functions do not validate their arguments (but for ``sm_scale``, which must be a normal
fp32 here too: SPEC §9.3); the public API (``jax_mxfp4.write_cache``...) does, then calls a
primitive whose reference lowering is these functions. Each is written beside its operation,
in ``jax_mxfp4._src.ops.<op>.reference``.
"""

from jax_mxfp4._src.core.formats import (
    dequantize_mxfp4,
    dequantize_mxfp8,
    quantize_mxfp4,
    quantize_mxfp8,
)
from jax_mxfp4._src.core.pages import dequantize_pool, new_pool
from jax_mxfp4._src.core.rows import decode_rows, prefill_rows, slot_mapping
from jax_mxfp4._src.core.selection import SparseSelection
from jax_mxfp4._src.ops.index_scores.reference import index_scores
from jax_mxfp4._src.ops.select_blocks.reference import select_blocks
from jax_mxfp4._src.ops.sparse_attention.reference import sparse_attention
from jax_mxfp4._src.ops.write_cache.reference import write_cache

__all__ = [
    "SparseSelection",
    "decode_rows",
    "dequantize_mxfp4",
    "dequantize_mxfp8",
    "dequantize_pool",
    "index_scores",
    "new_pool",
    "prefill_rows",
    "quantize_mxfp4",
    "quantize_mxfp8",
    "select_blocks",
    "slot_mapping",
    "sparse_attention",
    "write_cache",
]
