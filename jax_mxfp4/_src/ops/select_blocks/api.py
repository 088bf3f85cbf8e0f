"""The ``select_blocks`` operation: top-k blocks and the sparse page table (SPEC §6).

Its public function checks the arguments at trace time and binds the ``mxfp4_select_blocks``
primitive: abstract eval, batching rule, sharding rule and the ordered lowerings (C++ on the
CPU, Triton on GPUs).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax.core import ShapedArray

from jax_mxfp4._src.core import validate
from jax_mxfp4._src.core.metadata import table_and_rows
from jax_mxfp4._src.core.selection import SparseSelection
from jax_mxfp4._src.dispatch import batching as batch
from jax_mxfp4._src.dispatch.backend import current_config
from jax_mxfp4._src.dispatch.lowering import CpuHandler, triton
from jax_mxfp4._src.dispatch.operation import Operation, ShardingRule, check_static_shapes, define
from jax_mxfp4._src.dispatch.sharding import Ids
from jax_mxfp4._src.ops.select_blocks import reference


def check_arguments(scores, table, positions, requests, topk, init_blocks, local_blocks):
    validate.dtype_is(scores, "scores", jnp.float32)
    validate.rank_is(scores, "scores", 3, "[H, T, num_blocks]")
    validate.block_table(table, scores.shape[2])
    validate.rows(positions, requests, scores.shape[1])
    validate.positive_int(topk, "topk")
    validate.positive_int(init_blocks, "init_blocks", 0)
    validate.positive_int(local_blocks, "local_blocks", 0)


def _abstract_eval(scores, block_table, positions, requests, *, topk, init_blocks,
                   local_blocks):
    check_arguments(
        scores, block_table, positions, requests, topk, init_blocks, local_blocks
    )
    num_heads, num_rows, _ = scores.shape
    return [
        ShapedArray((num_heads, num_rows, topk), jnp.int32),
        ShapedArray((num_rows, num_heads, topk), jnp.int32),
        ShapedArray((num_rows, num_heads), jnp.int32),
    ]


def _batching_rule(bind, args, dims, **params):
    """Fold the vmapped axis into rows; a batched table becomes one table of N*B requests."""
    n, (scores, table, positions, requests) = batch.all_to_front(args, dims)
    if batch.is_batched(dims[1]):
        requests = batch.offset_ids(requests, table.shape[1])
        table = batch.fold(table)
    else:
        table = table[0]
    scores = jnp.moveaxis(scores, 0, 1)  # [H, N, T, NB]
    scores = scores.reshape(scores.shape[0], -1, scores.shape[-1])
    ids, pages, context = bind(scores, table, batch.fold(positions), batch.fold(requests), **params)
    num_heads, _, topk = ids.shape
    return (
        [ids.reshape(num_heads, n, -1, topk), pages.reshape(n, -1, num_heads, topk),
         context.reshape(n, -1, num_heads)],
        [1, 0, 0],
    )


def _sharding(shapes) -> ShardingRule:
    """Heads (h) shard; rows (t) shard with the requests (b) they read (global request ids,
    made local per shard: ``sharding.Ids``). Page ids are copied out of the table, still
    global. Blocks stay whole."""
    return ShardingRule(
        operands=("h t n", "b w", "t", "t"),
        results=("h t k", "t h k", "t h"),
        replicated=("n", "w", "k"),
        ids=(Ids(3, "b"),),
    )


def _cpu_attributes(*, topk, init_blocks, local_blocks):
    del topk  # the result shapes carry it
    return {"init_blocks": np.int64(init_blocks), "local_blocks": np.int64(local_blocks)}


def _reference(scores, block_table, positions, requests, **params):
    return tuple(reference.select_blocks(scores, block_table, positions, requests, **params))


mxfp4_select_blocks_p = define(
    Operation(
        name="mxfp4_select_blocks",
        abstract_eval=_abstract_eval,
        batching_rule=_batching_rule,
        reference=_reference,
        sharding=_sharding,
        operands=("scores", "block_table", "positions", "requests"),
        lowerings=(CpuHandler(_cpu_attributes), triton("select_blocks")),
        multiple_results=True,
    )
)


def _bind(scores, block_table, positions, requests, *, topk: int, init_blocks: int,
                  local_blocks: int) -> SparseSelection:
    """Bind the primitive. Counts of forced blocks past the block count mean every block, so
    they are clipped to it here (every lowering then takes them as int32 or int64 safely)."""
    num_blocks = scores.shape[-1]
    ids, pages, context = mxfp4_select_blocks_p.bind(
        scores, block_table, positions, requests, topk=int(topk),
        init_blocks=min(int(init_blocks), num_blocks),
        local_blocks=min(int(local_blocks), num_blocks), config=current_config(),
    )
    return SparseSelection(ids, pages, context)


def select_blocks(
    scores, block_table, positions, requests, *, topk: int = 16, init_blocks: int = 0,
    local_blocks: int = 1,
) -> SparseSelection:
    """Top-k blocks per (index head, row) and the sparse page table (SPEC §6).

    Returns ``SparseSelection(block_ids int32[H, T, topk], page_table int32[T, H, topk],
    context_lens int32[T, H])``. Index head ``h`` drives kv head ``h``. ``block_table``,
    ``positions`` and ``requests`` are int32 or int64 (SPEC §2.4).
    """
    args = (jnp.asarray(scores), *table_and_rows(block_table, positions, requests))
    check_arguments(*args, topk, init_blocks, local_blocks)
    check_static_shapes(("scores", "block_table", "positions", "requests"), args)
    return _bind(
        *args, topk=int(topk), init_blocks=int(init_blocks), local_blocks=int(local_blocks)
    )
