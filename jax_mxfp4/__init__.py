"""jax_mxfp4: MXFP4 sparse attention (MiniMax-M3.1 style) for JAX.

    import jax_mxfp4 as jm
    pool = jm.write_cache(pool, k, slots)
    scores = jm.index_scores(q_index, index_pool, block_table, positions, requests,
                             num_blocks=nb, sm_scale=128 ** -0.5)
    sel = jm.select_blocks(scores, block_table, positions, requests, topk=16)
    out = jm.sparse_attention(q, k_pool, v_pool, sel.page_table, sel.context_lens,
                              sm_scale=128 ** -0.5)

docs/spec.md (in the repository) says what each operation computes, bit for bit; ``jm.reference``
holds the plain-jnp versions.
"""

from jax_mxfp4 import metadata, reference
from jax_mxfp4._src.core.formats import (
    HEAD_DIM,
    PAGE_BYTES,
    PAGE_TOKENS,
    dequantize_mxfp4,
    dequantize_mxfp8,
    quantize_mxfp4,
    quantize_mxfp8,
)
from jax_mxfp4._src.core.metadata_checks import MetadataError, check_metadata
from jax_mxfp4._src.core.pages import dequantize_pool, new_pool
from jax_mxfp4._src.core.rows import decode_rows, prefill_rows, slot_mapping
from jax_mxfp4._src.core.selection import SparseSelection
from jax_mxfp4._src.dispatch import emulated  # noqa: F401  (registers the emulated ROCm backends)
from jax_mxfp4._src.dispatch.backend import (
    backend_scope,
    backends,
    check_environment,
    get_backend,
    lowering_options,
    set_backend,
)
from jax_mxfp4._src.explain import explain
from jax_mxfp4._src.exporting import EXPORT_CHECKS, deserialize, export
from jax_mxfp4._src.ops.index_scores.api import index_scores
from jax_mxfp4._src.ops.select_blocks.api import select_blocks
from jax_mxfp4._src.ops.sparse_attention.api import sparse_attention
from jax_mxfp4._src.ops.write_cache.api import write_cache, write_kv_cache

check_environment()  # an unknown JAX_MXFP4_BACKEND fails here, once every backend registered

__version__ = "0.1.0"

__all__ = [
    "EXPORT_CHECKS",
    "HEAD_DIM",
    "PAGE_BYTES",
    "PAGE_TOKENS",
    "MetadataError",
    "SparseSelection",
    "backend_scope",
    "backends",
    "check_metadata",
    "decode_rows",
    "dequantize_mxfp4",
    "dequantize_mxfp8",
    "dequantize_pool",
    "deserialize",
    "explain",
    "export",
    "get_backend",
    "index_scores",
    "lowering_options",
    "metadata",
    "new_pool",
    "prefill_rows",
    "quantize_mxfp4",
    "quantize_mxfp8",
    "reference",
    "select_blocks",
    "set_backend",
    "slot_mapping",
    "sparse_attention",
    "write_cache",
    "write_kv_cache",
]
