"""The ``mxfp4_index_scores`` primitive: block scores of query rows (SPEC §4, §5)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax.core import ShapedArray

from jax_mxfp4 import ffi_targets, reference, validate
from jax_mxfp4.backend import current_config
from jax_mxfp4.formats import PAGE_BYTES
from jax_mxfp4.lowering import CpuHandler, flydsl, triton
from jax_mxfp4.primitives import _batching as batch
from jax_mxfp4.primitives._operation import Operation, ShardingRule, define
from jax_mxfp4.primitives._sharding import Ids
from jax_mxfp4.scaling import folded_score_scale


def _abstract_eval(q, index_pool, block_table, positions, requests, *, num_blocks, sm_scale,
                   q_round):
    validate.index_scores_args(
        q, index_pool, block_table, positions, requests, num_blocks, sm_scale, q_round
    )
    return ShapedArray((q.shape[1], q.shape[0], num_blocks), jnp.float32)


def _batching_rule(bind, args, dims, **params):
    """Fold the vmapped axis into rows; a batched pool becomes one pool of N*P pages and a
    batched (or per-pool) block table one table of N*B requests, ids offset per problem."""
    n, (q, pool, table, positions, requests) = batch.all_to_front(args, dims)
    pool_batched, table_batched = batch.is_batched(dims[1]), batch.is_batched(dims[2])
    if pool_batched:
        table = batch.offset_ids(table, pool.shape[1])
        pool = batch.fold(pool)
    else:
        pool = pool[0]
    if pool_batched or table_batched:
        requests = batch.offset_ids(requests, table.shape[1])
        table = batch.fold(table)
    else:
        table = table[0]
    scores = bind(batch.fold(q), pool, table, batch.fold(positions), batch.fold(requests), **params)
    num_heads, _, num_blocks = scores.shape
    return scores.reshape(num_heads, n, -1, num_blocks), 1


def _sharding(shapes) -> ShardingRule:
    """Index heads (h) shard; rows (t) shard with the requests (b) and pages (p) they read
    (global request and page ids, made local per shard: ``_sharding.Ids``); blocks stay whole."""
    return ShardingRule(
        operands=("t h d", "p c", "b w", "t", "t"),
        results=("h t n",),
        replicated=("d", "c", "w", "n"),
        ids=(Ids(4, "b"), Ids(2, "p")),
    )


def _cpu_attributes(*, num_blocks, sm_scale, q_round):
    del num_blocks  # the result shape carries it
    return {
        "score_scale": np.float32(folded_score_scale(sm_scale)),
        "round_q": q_round == "e4m3",
    }


mxfp4_index_scores_p = define(
    Operation(
        name="mxfp4_index_scores",
        abstract_eval=_abstract_eval,
        batching_rule=_batching_rule,
        reference=reference.index_scores,
        sharding=_sharding,
        operands=("q", "index_pool", "block_table", "positions", "requests"),
        lowerings=(
            CpuHandler(ffi_targets.INDEX_SCORES, _cpu_attributes),
            flydsl("index_scores"),
            triton("index_scores"),
        ),
    )
)


def index_scores(q, index_pool, block_table, positions, requests, *, num_blocks: int,
                 sm_scale: float, q_round: str = "e4m3") -> jnp.ndarray:
    """Bind the primitive (arguments already validated by the public API)."""
    assert index_pool.shape[-1] == PAGE_BYTES
    return mxfp4_index_scores_p.bind(
        q, index_pool, block_table, positions, requests, num_blocks=int(num_blocks),
        sm_scale=float(sm_scale), q_round=q_round, config=current_config(),
    )
