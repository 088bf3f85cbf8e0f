"""The ``index_scores`` operation: block scores of query rows (SPEC §4, §5).

Its public function checks the arguments at trace time and binds the ``mxfp4_index_scores``
primitive: abstract eval, batching rule, sharding rule and the ordered lowerings (C++ on the
CPU, FlyDSL on gfx950, Triton elsewhere).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax.core import ShapedArray

from jax_mxfp4._src.core import validate
from jax_mxfp4._src.core.formats import PAGE_BYTES
from jax_mxfp4._src.core.metadata import table_and_rows
from jax_mxfp4._src.core.scaling import folded_score_scale
from jax_mxfp4._src.dispatch import batching as batch
from jax_mxfp4._src.dispatch.backend import current_config
from jax_mxfp4._src.dispatch.lowering import CpuHandler, flydsl, triton
from jax_mxfp4._src.dispatch.operation import Operation, ShardingRule, check_static_shapes, define
from jax_mxfp4._src.dispatch.sharding import Ids
from jax_mxfp4._src.ops.index_scores import reference


def check_arguments(q, index_pool, table, positions, requests, num_blocks, sm_scale, q_round):
    validate.query(q)
    validate.pool(index_pool, "index_pool", heads=False)
    validate.positive_int(num_blocks, "num_blocks")
    validate.block_table(table, num_blocks)
    validate.rows(positions, requests, q.shape[0])
    validate.score_scale(sm_scale)
    validate.option(q_round, "q_round", validate.Q_ROUNDS)


def _abstract_eval(q, index_pool, block_table, positions, requests, *, num_blocks, sm_scale,
                   q_round):
    check_arguments(
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
    (global request and page ids, made local per shard: ``sharding.Ids``); blocks stay whole."""
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
            CpuHandler(_cpu_attributes),
            flydsl("index_scores"),
            triton("index_scores"),
        ),
    )
)


def _bind(q, index_pool, block_table, positions, requests, *, num_blocks: int,
                 sm_scale: float, q_round: str = "e4m3") -> jnp.ndarray:
    """Bind the primitive (arguments already validated by the public API)."""
    assert index_pool.shape[-1] == PAGE_BYTES
    return mxfp4_index_scores_p.bind(
        q, index_pool, block_table, positions, requests, num_blocks=int(num_blocks),
        sm_scale=float(sm_scale), q_round=q_round, config=current_config(),
    )


def index_scores(
    q, index_pool, block_table, positions, requests, *, num_blocks: int, sm_scale: float,
    q_round: str = "e4m3",
) -> jnp.ndarray:
    """Score every 128-token block of each row's request: ``float32[H, T, num_blocks]``.

    Args:
      q: ``bfloat16 | float8_e4m3fn [T, H, 128]`` index queries.
      index_pool: ``uint8[P, 8704]``.
      block_table: ``int32 | int64 [B, >= num_blocks]``.
      positions, requests: ``int32 | int64 [T]`` from ``prefill_rows`` / ``decode_rows``.
      num_blocks: static number of blocks scored per row.
      sm_scale: softmax scale; scores are ``max logit * fp32(sm_scale * 1.4426950409)``.
      q_round: ``"e4m3"`` (default) rounds a bf16 query to e4m3 first; ``"none"`` keeps bf16.
    """
    args = (jnp.asarray(q), jnp.asarray(index_pool), *table_and_rows(block_table, positions,
                                                                      requests))
    check_arguments(*args, num_blocks, sm_scale, q_round)
    check_static_shapes(("q", "index_pool", "block_table", "positions", "requests"), args)
    return _bind(
        *args, num_blocks=int(num_blocks), sm_scale=float(sm_scale), q_round=q_round
    )
