"""The ``write_cache`` operation: quantize rows into MXFP4 pool pages, in place (SPEC §3).

Its public functions (``write_cache``, ``write_kv_cache``) check their arguments at trace
time and bind the ``mxfp4_write_cache`` primitive: abstract eval, batching rule, sharding rule
and the ordered lowerings (C++ on the CPU, FlyDSL on gfx950, Triton elsewhere).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax.core import ShapedArray

from jax_mxfp4._src.core import validate
from jax_mxfp4._src.core.formats import HEAD_DIM, PAGE_TOKENS, ROUND_MODE_CODES, ROUND_MODES
from jax_mxfp4._src.core.metadata import METADATA_DTYPES, as_int32
from jax_mxfp4._src.dispatch import batching as batch
from jax_mxfp4._src.dispatch.backend import current_config
from jax_mxfp4._src.dispatch.lowering import CpuHandler, flydsl, triton
from jax_mxfp4._src.dispatch.operation import Operation, ShardingRule, check_static_shapes, define
from jax_mxfp4._src.dispatch.sharding import Ids
from jax_mxfp4._src.ops.write_cache import reference


def check_arguments(pool, x, slots, round_mode, names=("pool", "x", "slots")) -> None:
    """``names``: what the caller calls the pool, the rows and the slots (errors name them)."""
    pool_name, x_name, slots_name = names
    heads = pool.ndim == 3
    validate.pool(pool, pool_name, heads=heads)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise TypeError(f"{x_name} must be a floating-point array, got {validate.describe(x)}")
    layout = f"[T, Hkv={pool.shape[1]}, {HEAD_DIM}]" if heads else f"[T, {HEAD_DIM}]"
    if x.ndim != pool.ndim or x.shape[-1] != HEAD_DIM or (heads and x.shape[1] != pool.shape[1]):
        raise ValueError(
            f"{x_name} must have shape {layout} to match {pool_name}, got {validate.describe(x)}"
        )
    validate.dtype_is(slots, slots_name, METADATA_DTYPES, "int32 or int64")
    validate.rank_is(slots, slots_name, 1, "[T]")
    validate.dim_is(slots, slots_name, 0, x.shape[0], f"[T={x.shape[0]}]")
    validate.option(round_mode, "round_mode", ROUND_MODES)


def _abstract_eval(pool, x, slots, *, round_mode):
    check_arguments(pool, x, slots, round_mode)
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
    it holds (global slots, made local per shard: ``sharding.Ids``), with the rows sharded
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
            CpuHandler(_cpu_attributes, aliases={0: 0}),
            flydsl("write_cache"),
            triton("write_cache"),
        ),
    )
)


def _bind(pool, x, slots, *, round_mode: str = "up") -> jnp.ndarray:
    """Bind the primitive: rows go in as bfloat16 (SPEC §1.4), slots as int32 (an int64 slot
    that does not fit int32 cannot address the pool and is skipped: SPEC §2.4)."""
    x = x.astype(jnp.bfloat16)
    slots = as_int32(slots, "slots", "id")
    return mxfp4_write_cache_p.bind(pool, x, slots, round_mode=round_mode,
                                    config=current_config())


def write_cache(pool, x, slots, *, round_mode: str = "up") -> jnp.ndarray:
    """Quantize rows to MXFP4 and store them into their slots of ``pool``.

    Args:
      pool: ``uint8[P, 8704]`` (index cache) or ``uint8[P, Hkv, 8704]`` (K or V cache).
      x: float ``[T, 128]`` or ``[T, Hkv, 128]`` (rounded to bfloat16 first).
      slots: ``int32 | int64 [T]``, ``slot = page * 128 + offset``; slots < 0 or >= P*128 are
        not written (an int64 slot outside int32 included: SPEC §2.4).
      round_mode: e8m0 scale rounding, ``"up"`` (default), ``"even"`` or ``"down"``.
    Returns:
      The updated pool. Under ``jit`` with the pool donated, the update happens in place.
    """
    pool, x, slots = jnp.asarray(pool), jnp.asarray(x), as_int32(slots, "slots", "id")
    check_arguments(pool, x, slots, round_mode)
    check_static_shapes(("pool", "x", "slots"), (pool, x, slots))
    return _bind(pool, x, slots, round_mode=round_mode)


def write_kv_cache(
    k_pool, v_pool, index_pool, k, v, index_k, slots, *, index_slots=None,
    round_mode: str = "up",
) -> tuple[jnp.ndarray, jnp.ndarray, jnp.ndarray | None]:
    """One step's keys, values and index keys into their MXFP4 caches (SPEC §3).

    Args:
      k_pool, v_pool: ``uint8[P, Hkv, 8704]``.
      index_pool: ``uint8[P_index, 8704]``, or ``None`` for a layer that reuses another
        layer's block selection and keeps no index cache (then ``index_k`` is ``None`` too).
      k, v: float ``[T, Hkv, 128]``; index_k: float ``[T, 128]`` or ``None``.
      slots: ``int32 | int64 [T]`` K/V cache slots (``slot_mapping``); slots < 0 or past the
        pool are not written.
      index_slots: the index cache's slots, ``slots`` by default.
      round_mode: e8m0 scale rounding, ``"up"`` (default), ``"even"`` or ``"down"``.
    Returns:
      ``(k_pool, v_pool, index_pool)`` updated (``index_pool`` stays ``None``). Under ``jit``
      with the pools donated, every update happens in place. Each cache is one
      ``write_cache`` launch.
    """
    if (index_pool is None) != (index_k is None):
        raise ValueError("index_pool and index_k must be given together (or both None for a "
                         "layer without an index cache)")
    if index_pool is None and index_slots is not None:
        raise ValueError("index_slots needs index_pool and index_k")
    k_pool, v_pool, k, v = map(jnp.asarray, (k_pool, v_pool, k, v))
    slots = as_int32(slots, "slots", "id")
    check_arguments(k_pool, k, slots, round_mode, ("k_pool", "k", "slots"))
    check_arguments(v_pool, v, slots, round_mode, ("v_pool", "v", "slots"))
    if k_pool.ndim != 3:
        raise ValueError(f"k_pool must be uint8[P, Hkv, 8704], got shape {list(k_pool.shape)}")
    check_static_shapes(("k_pool", "v_pool", "k", "v", "slots"),
                            (k_pool, v_pool, k, v, slots))
    k_pool = _bind(k_pool, k, slots, round_mode=round_mode)
    v_pool = _bind(v_pool, v, slots, round_mode=round_mode)
    if index_pool is None:
        return k_pool, v_pool, None
    index_pool, index_k = jnp.asarray(index_pool), jnp.asarray(index_k)
    index_slots = slots if index_slots is None else as_int32(index_slots, "index_slots", "id")
    if index_pool.ndim != 2:
        raise ValueError(f"index_pool must be uint8[P, 8704], got shape "
                         f"{list(index_pool.shape)}")
    if index_k.ndim < 1 or index_k.shape[0] != k.shape[0]:
        raise ValueError(f"index_k must have T={k.shape[0]} rows like k, got shape "
                         f"{list(index_k.shape)}")
    check_arguments(index_pool, index_k, index_slots, round_mode,
                              ("index_pool", "index_k", "index_slots"))
    check_static_shapes(("index_pool", "index_k", "index_slots"),
                            (index_pool, index_k, index_slots))
    index_pool = _bind(index_pool, index_k, index_slots, round_mode=round_mode)
    return k_pool, v_pool, index_pool
