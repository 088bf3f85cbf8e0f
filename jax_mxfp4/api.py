"""The public operations: validate at trace time, then run the implementation.

Shapes: ``T`` query rows, ``B`` requests, ``P`` pages, ``H`` index heads (= kv heads on a rank),
``Hq`` query heads, ``D = 128``. docs/spec.md says what each operation computes ("SPEC §n").
"""

from __future__ import annotations

import jax.numpy as jnp

from jax_mxfp4 import backend, primitives, validate
from jax_mxfp4.metadata import as_int32
from jax_mxfp4.selection import SparseSelection


def _backend_shapes(names: tuple[str, ...], operands) -> None:
    """Trace time: ``validate.static_shapes`` of ``operands`` (called ``names``) where the
    current backend needs static shapes (``Backend.static_shapes``: the emulated ROCm
    backends); for the others, the platform a call is lowered for decides
    (``primitives._operation``)."""
    name = backend.get_backend()
    if backend.backend(name).static_shapes:
        validate.static_shapes(zip(names, operands, strict=True), f"backend {name!r}")


def _table_and_rows(block_table, positions, requests) -> tuple[jnp.ndarray, ...]:
    """The block table and row metadata as int32 (SPEC §2.4: an int64 page id, position or
    request outside int32 becomes -1)."""
    return (as_int32(block_table, "block_table", "id"), as_int32(positions, "positions", "id"),
            as_int32(requests, "requests", "id"))


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
    validate.write_cache_args(pool, x, slots, round_mode)
    _backend_shapes(("pool", "x", "slots"), (pool, x, slots))
    return primitives.write_cache(pool, x, slots, round_mode=round_mode)


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
    validate.write_cache_args(k_pool, k, slots, round_mode, ("k_pool", "k", "slots"))
    validate.write_cache_args(v_pool, v, slots, round_mode, ("v_pool", "v", "slots"))
    if k_pool.ndim != 3:
        raise ValueError(f"k_pool must be uint8[P, Hkv, 8704], got shape {list(k_pool.shape)}")
    _backend_shapes(("k_pool", "v_pool", "k", "v", "slots"),
                            (k_pool, v_pool, k, v, slots))
    k_pool = primitives.write_cache(k_pool, k, slots, round_mode=round_mode)
    v_pool = primitives.write_cache(v_pool, v, slots, round_mode=round_mode)
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
    validate.write_cache_args(index_pool, index_k, index_slots, round_mode,
                              ("index_pool", "index_k", "index_slots"))
    _backend_shapes(("index_pool", "index_k", "index_slots"),
                            (index_pool, index_k, index_slots))
    index_pool = primitives.write_cache(index_pool, index_k, index_slots, round_mode=round_mode)
    return k_pool, v_pool, index_pool


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
    args = (jnp.asarray(q), jnp.asarray(index_pool), *_table_and_rows(block_table, positions,
                                                                      requests))
    validate.index_scores_args(*args, num_blocks, sm_scale, q_round)
    _backend_shapes(("q", "index_pool", "block_table", "positions", "requests"), args)
    return primitives.index_scores(
        *args, num_blocks=int(num_blocks), sm_scale=float(sm_scale), q_round=q_round
    )


def select_blocks(
    scores, block_table, positions, requests, *, topk: int = 16, init_blocks: int = 0,
    local_blocks: int = 1,
) -> SparseSelection:
    """Top-k blocks per (index head, row) and the sparse page table (SPEC §6).

    Returns ``SparseSelection(block_ids int32[H, T, topk], page_table int32[T, H, topk],
    context_lens int32[T, H])``. Index head ``h`` drives kv head ``h``. ``block_table``,
    ``positions`` and ``requests`` are int32 or int64 (SPEC §2.4).
    """
    args = (jnp.asarray(scores), *_table_and_rows(block_table, positions, requests))
    validate.select_blocks_args(*args, topk, init_blocks, local_blocks)
    _backend_shapes(("scores", "block_table", "positions", "requests"), args)
    return primitives.select_blocks(
        *args, topk=int(topk), init_blocks=int(init_blocks), local_blocks=int(local_blocks)
    )


def sparse_attention(
    q, k_pool, v_pool, page_table, context_lens, *, sm_scale: float, output: str = "bf16"
):
    """Sparse paged attention over MXFP4 K/V pages (SPEC §7, §8).

    Args:
      q: ``bfloat16 | float8_e4m3fn [T, Hq, 128]``.
      k_pool, v_pool: ``uint8[P, Hkv, 8704]``.
      page_table: ``int32 | int64 [T, Hkv, n]``; context_lens: ``int32 | int64 [T, Hkv]``
        (from select_blocks; SPEC §2.4 for int64).
      sm_scale: softmax scale.
      output: ``"bf16"`` -> ``bfloat16[T, Hq, 128]``; ``"mxfp8"`` -> ``(float8_e4m3fn[T,
        Hq*128], uint8[T, Hq*4])``.
    """
    args = (jnp.asarray(q), jnp.asarray(k_pool), jnp.asarray(v_pool),
            as_int32(page_table, "page_table", "id"),
            as_int32(context_lens, "context_lens", "length"))
    validate.sparse_attention_args(*args, sm_scale, output)
    _backend_shapes(("q", "k_pool", "v_pool", "page_table", "context_lens"), args)
    return primitives.sparse_attention(*args, sm_scale=float(sm_scale), output=output)
