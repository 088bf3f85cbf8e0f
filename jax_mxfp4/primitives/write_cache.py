"""The ``mxfp4_write_cache`` primitive: quantize rows into pool pages, in place (SPEC §3)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax.core import ShapedArray

from jax_mxfp4 import ffi_targets, reference, validate
from jax_mxfp4.backend import current_config
from jax_mxfp4.formats import PAGE_TOKENS, ROUND_MODE_CODES
from jax_mxfp4.lowering import CpuHandler, flydsl, triton
from jax_mxfp4.metadata import as_int32
from jax_mxfp4.primitives import _batching as batch
from jax_mxfp4.primitives._operation import Operation, ShardingRule, define
from jax_mxfp4.primitives._sharding import Ids


def _abstract_eval(pool, x, slots, *, round_mode):
    validate.write_cache_args(pool, x, slots, round_mode)
    if x.dtype != jnp.bfloat16 or slots.dtype != jnp.int32:
        raise TypeError(
            f"the write_cache kernel takes bfloat16 rows and int32 slots, got {x.dtype} and "
            f"{slots.dtype} (the public write_cache converts them)"
        )
    return ShapedArray(pool.shape, pool.dtype)


def _batching_rule(bind, args, dims, **params):
    """Fold the vmapped axis into pages and rows: N pools become one of N*P pages and each
    problem's slots are offset into its own pages (a slot outside its pool stays skipped)."""
    n, (pool, x, slots) = batch.all_to_front(args, dims)
    num_pages = pool.shape[1]
    slots = batch.offset_ids(slots, num_pages * PAGE_TOKENS)
    out = bind(batch.fold(pool), batch.fold(x), batch.fold(slots), **params)
    return out.reshape(n, num_pages, *out.shape[1:]), 0


def _sharding(shapes) -> ShardingRule:
    """kv heads shard (pool and rows together); pages shard too, each shard writing the slots
    it holds (global slots, made local per shard: ``_sharding.Ids``), with the rows sharded
    like the pages or on every shard."""
    slots = (Ids(2, "p", unit=PAGE_TOKENS, write=True),)
    if len(shapes[0]) == 3:
        return ShardingRule(
            operands=("p h c", "t h d", "t"), results=("p h c",), replicated=("c", "d"),
            ids=slots,
        )
    return ShardingRule(
        operands=("p c", "t d", "t"), results=("p c",), replicated=("c", "d"), ids=slots
    )


def _cpu_attributes(*, round_mode):
    return {"round_mode": np.int32(ROUND_MODE_CODES[round_mode])}


mxfp4_write_cache_p = define(
    Operation(
        name="mxfp4_write_cache",
        abstract_eval=_abstract_eval,
        batching_rule=_batching_rule,
        reference=reference.write_cache,
        sharding=_sharding,
        operands=("pool", "x", "slots"),
        lowerings=(
            CpuHandler(ffi_targets.WRITE_CACHE, _cpu_attributes, aliases={0: 0}),
            flydsl("write_cache"),
            triton("write_cache"),
        ),
    )
)


def write_cache(pool, x, slots, *, round_mode: str = "up") -> jnp.ndarray:
    """Bind the primitive: rows go in as bfloat16 (SPEC §1.4), slots as int32 (an int64 slot
    that does not fit int32 cannot address the pool and is skipped: SPEC §2.4)."""
    x = x.astype(jnp.bfloat16)
    slots = as_int32(slots, "slots", "id")
    return mxfp4_write_cache_p.bind(pool, x, slots, round_mode=round_mode,
                                    config=current_config())
