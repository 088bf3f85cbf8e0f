"""The demo's layer: one MiniMax-M3.1 sparse-attention layer of one rank at TP4 (SPEC §0).

Random bf16 weights, the math around the MXFP4 operations (fused projection, RMSNorm, partial
RoPE, cache slots) and the two ``jax.jit``-compiled steps (prefill and decode) that run it.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

import jax_mxfp4 as jm

NUM_Q_HEADS = 16
NUM_KV_HEADS = 1
NUM_INDEX_HEADS = 1  # index head h drives kv head h
HEAD_DIM = 128
ROTARY_DIM = 64  # partial rotary factor 0.5, NeoX style
ROPE_THETA = 10000.0
PAGE = 128
TOPK = 16
SM_SCALE = HEAD_DIM**-0.5
DENSE_LIMIT = TOPK * PAGE  # contexts up to this many tokens are attended in full

Pools = tuple[jax.Array, jax.Array, jax.Array]
"""K, V and index-K MXFP4 pools: uint8 ``[pages, NUM_KV_HEADS, 8704]`` twice, ``[pages, 8704]``."""

_PROJ_SPLITS = (
    NUM_Q_HEADS * HEAD_DIM,  # q
    NUM_KV_HEADS * HEAD_DIM,  # k
    NUM_KV_HEADS * HEAD_DIM,  # v
    NUM_INDEX_HEADS * HEAD_DIM,  # index q
    HEAD_DIM,  # index k (one shared index-K head)
)


def init_params(key: jax.Array, hidden: int) -> dict[str, jax.Array]:
    """Random bf16 weights: one fused [hidden, q|k|v|index q|index k] projection."""
    width = sum(_PROJ_SPLITS)
    w = jax.random.normal(key, (hidden, width), jnp.float32) * hidden**-0.5
    return {"w_qkv_idx": w.astype(jnp.bfloat16)}


def rms_norm(x: jax.Array, eps: float = 1e-6) -> jax.Array:
    """RMSNorm over the last axis, no weight; float32 out, same shape as ``x``."""
    x = x.astype(jnp.float32)
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps)


def rope(x: jax.Array, positions: jax.Array) -> jax.Array:
    """NeoX-style rotary embedding on the first ROTARY_DIM dims of ``x[T, heads, D]``."""
    half = ROTARY_DIM // 2
    inv_freq = ROPE_THETA ** (-jnp.arange(half, dtype=jnp.float32) / half)
    angle = jnp.maximum(positions, 0).astype(jnp.float32)[:, None] * inv_freq[None, :]
    cos, sin = jnp.cos(angle)[:, None, :], jnp.sin(angle)[:, None, :]
    x1, x2, rest = x[..., :half], x[..., half:ROTARY_DIM], x[..., ROTARY_DIM:]
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest], axis=-1)


def project(
    params: dict[str, jax.Array], x: jax.Array, positions: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array, jax.Array]:
    """Hidden states ``x[T, hidden]`` -> bf16 q, k, v, index q, index k (normed and roped).

    Shapes: q ``[T, NUM_Q_HEADS, D]``, k and v ``[T, NUM_KV_HEADS, D]``, index q
    ``[T, NUM_INDEX_HEADS, D]``, index k ``[T, D]``; ``positions`` is int ``[T]`` (-1: padding).
    """
    y = jnp.dot(x, params["w_qkv_idx"], preferred_element_type=jnp.float32)
    cuts = np.cumsum(_PROJ_SPLITS)[:-1].tolist()
    q, k, v, iq, ik = jnp.split(y, cuts, axis=-1)
    t = x.shape[0]
    q = rope(rms_norm(q.reshape(t, NUM_Q_HEADS, HEAD_DIM)), positions)
    k = rope(rms_norm(k.reshape(t, NUM_KV_HEADS, HEAD_DIM)), positions)
    v = v.reshape(t, NUM_KV_HEADS, HEAD_DIM)
    iq = rope(rms_norm(iq.reshape(t, NUM_INDEX_HEADS, HEAD_DIM)), positions)
    ik = rope(rms_norm(ik.reshape(t, 1, HEAD_DIM)), positions)[:, 0]
    bf = jnp.bfloat16
    return q.astype(bf), k.astype(bf), v.astype(bf), iq.astype(bf), ik.astype(bf)


def _layer(params, k_pool, v_pool, index_pool, x, positions, requests, block_table, num_blocks):
    """The sparse-attention layer on query rows ``x[T, hidden]`` with the given positions/requests.

    Returns the updated pools, the bf16 attention output ``[T, NUM_Q_HEADS, D]`` and the extras
    the accuracy check reads (q, k, v and the selected block ids of kv head 0).
    """
    q, k, v, iq, ik = project(params, x, positions)
    slots = jm.slot_mapping(block_table, positions, requests)
    k_pool, v_pool, index_pool = jm.write_kv_cache(k_pool, v_pool, index_pool, k, v, ik, slots)
    scores = jm.index_scores(
        iq, index_pool, block_table, positions, requests, num_blocks=num_blocks, sm_scale=SM_SCALE
    )
    sel = jm.select_blocks(scores, block_table, positions, requests, topk=TOPK)
    out = jm.sparse_attention(
        q, k_pool, v_pool, sel.page_table, sel.context_lens, sm_scale=SM_SCALE
    )
    # q, k, v and the selected blocks come back too, only so the demo can check the accuracy.
    extras = {"q": q, "k": k[:, 0], "v": v[:, 0], "block_ids": sel.block_ids[0]}
    return (k_pool, v_pool, index_pool), out, extras


def make_step_functions(num_rows: int, num_blocks: int) -> tuple[Callable, Callable]:
    """The two jitted steps; pools (arguments 1-3) are donated and updated in place.

    ``prefill_step(params, k_pool, v_pool, index_pool, x[num_rows, hidden], cu_seqlens_q[B + 1],
    prefix_lens[B], block_table)`` and ``decode_step(params, k_pool, v_pool, index_pool,
    x[B, hidden], seq_lens[B], block_table)`` both return ``(pools, out, extras)`` as ``_layer``.
    """

    def prefill_step(params, k_pool, v_pool, index_pool, x, cu_seqlens_q, prefix_lens, block_table):
        positions, requests = jm.prefill_rows(cu_seqlens_q, prefix_lens, num_rows)
        return _layer(
            params, k_pool, v_pool, index_pool, x, positions, requests, block_table, num_blocks
        )

    def decode_step(params, k_pool, v_pool, index_pool, x, seq_lens, block_table):
        positions, requests = jm.decode_rows(seq_lens, 1)
        return _layer(
            params, k_pool, v_pool, index_pool, x, positions, requests, block_table, num_blocks
        )

    donate = (1, 2, 3)
    return (
        jax.jit(prefill_step, donate_argnums=donate),
        jax.jit(decode_step, donate_argnums=donate),
    )
