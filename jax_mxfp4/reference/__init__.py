"""Every operation in plain ``jax.numpy``, exactly per SPEC: the oracle the kernels are tested
against, and the lowering used where no kernel exists (or under ``set_backend("reference")``).

These functions do not validate their arguments (but for ``sm_scale``, which must be a normal
fp32 here too: SPEC §9.3); the public API (``jax_mxfp4.write_cache``...) does, then calls a
primitive whose reference lowering is this module.
"""

from jax_mxfp4.formats import (
    dequantize_mxfp4,
    dequantize_mxfp8,
    quantize_mxfp4,
    quantize_mxfp8,
)
from jax_mxfp4.pages import dequantize_pool, new_pool
from jax_mxfp4.reference.index_scores import index_scores
from jax_mxfp4.reference.select_blocks import select_blocks
from jax_mxfp4.reference.sparse_attention import sparse_attention
from jax_mxfp4.reference.write_cache import write_cache
from jax_mxfp4.rows import decode_rows, prefill_rows, slot_mapping
from jax_mxfp4.selection import SparseSelection

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
