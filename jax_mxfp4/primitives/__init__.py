"""One JAX primitive per operation (see ``_operation`` for how each is put together)."""

from jax_mxfp4.primitives.index_scores import index_scores, mxfp4_index_scores_p
from jax_mxfp4.primitives.select_blocks import mxfp4_select_blocks_p, select_blocks
from jax_mxfp4.primitives.sparse_attention import (
    mxfp4_sparse_attention_mxfp8_p,
    mxfp4_sparse_attention_p,
    sparse_attention,
)
from jax_mxfp4.primitives.write_cache import mxfp4_write_cache_p, write_cache

PRIMITIVES = (
    mxfp4_write_cache_p,
    mxfp4_index_scores_p,
    mxfp4_select_blocks_p,
    mxfp4_sparse_attention_p,
    mxfp4_sparse_attention_mxfp8_p,
)

__all__ = [
    "PRIMITIVES",
    "index_scores",
    "select_blocks",
    "sparse_attention",
    "write_cache",
]
