"""The ``sparse_attention`` operation: paged attention over MXFP4 K/V (SPEC §7, §8).

Its public function checks the arguments at trace time and binds ``mxfp4_sparse_attention``
(bf16 output) or ``mxfp4_sparse_attention_mxfp8`` (fused MXFP8 output): abstract eval,
batching rule, sharding rule and the ordered lowerings (C++ on the CPU, FlyDSL on gfx950,
Triton elsewhere).
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np
from jax.core import ShapedArray

from jax_mxfp4._src.core import validate
from jax_mxfp4._src.core.formats import MX_BLOCK
from jax_mxfp4._src.core.metadata import as_int32
from jax_mxfp4._src.dispatch import batching as batch
from jax_mxfp4._src.dispatch.backend import current_config
from jax_mxfp4._src.dispatch.lowering import CpuHandler, flydsl, triton
from jax_mxfp4._src.dispatch.operation import Operation, ShardingRule, check_static_shapes, define
from jax_mxfp4._src.dispatch.sharding import Ids, compound
from jax_mxfp4._src.ops.sparse_attention import reference


def check_arguments(q, k_pool, v_pool, page_table, context_lens, sm_scale, output):
    validate.query(q)
    validate.pool(k_pool, "k_pool", heads=True)
    validate.pool(v_pool, "v_pool", heads=True)
    if k_pool.shape != v_pool.shape:
        raise ValueError(
            f"v_pool must have the shape of k_pool {list(k_pool.shape)}, got "
            f"{validate.describe(v_pool)}"
        )
    num_tokens, num_q_heads = q.shape[0], q.shape[1]
    num_kv_heads = k_pool.shape[1]
    if num_q_heads % num_kv_heads:
        raise ValueError(
            f"q heads ({num_q_heads}) must be a multiple of the pools' kv heads ({num_kv_heads})"
        )
    validate.dtype_is(page_table, "page_table", jnp.int32, "int32")
    validate.rank_is(page_table, "page_table", 3, "[T, Hkv, n]")
    if page_table.shape[:2] != (num_tokens, num_kv_heads) or page_table.shape[2] < 1:
        raise ValueError(
            f"page_table must have shape [T={num_tokens}, Hkv={num_kv_heads}, n >= 1], got "
            f"{validate.describe(page_table)}"
        )
    validate.dtype_is(context_lens, "context_lens", jnp.int32, "int32")
    if context_lens.shape != (num_tokens, num_kv_heads):
        raise ValueError(
            f"context_lens must have shape [T={num_tokens}, Hkv={num_kv_heads}], got "
            f"{validate.describe(context_lens)}"
        )
    validate.scale(sm_scale)
    validate.option(output, "output", validate.OUTPUTS)


def _abstract_eval(q, k_pool, v_pool, page_table, context_lens, *, sm_scale, output):
    check_arguments(q, k_pool, v_pool, page_table, context_lens, sm_scale, output)
    num_tokens, num_q_heads, head_dim = q.shape
    if output == "mxfp8":
        width = num_q_heads * head_dim
        return [
            ShapedArray((num_tokens, width), jnp.float8_e4m3fn),
            ShapedArray((num_tokens, width // MX_BLOCK), jnp.uint8),
        ]
    return [ShapedArray(q.shape, jnp.bfloat16)]


def _batching_rule(bind, args, dims, **params):
    """Fold the vmapped axis into rows; batched pools become pools of N*P pages with the page
    table's ids offset per problem."""
    n, (q, k_pool, v_pool, pages, context) = batch.all_to_front(args, dims)
    if batch.is_batched(dims[1]) or batch.is_batched(dims[2]):
        pages = batch.offset_ids(pages, k_pool.shape[1])
        k_pool, v_pool = batch.fold(k_pool), batch.fold(v_pool)
    else:
        k_pool, v_pool = k_pool[0], v_pool[0]
    outs = bind(batch.fold(q), k_pool, v_pool, batch.fold(pages), batch.fold(context), **params)
    return [o.reshape(n, -1, *o.shape[1:]) for o in outs], [0] * len(outs)


def _sharding(shapes) -> ShardingRule:
    """kv heads (h) shard, q heads following their kv head (dim ``(h g)``); tokens (t) shard
    with the pages (p) they read (global page ids, made local per shard: ``sharding.Ids``)."""
    q_shape, k_shape = shapes[0], shapes[1]
    group = q_shape[1] // k_shape[1]
    q_heads = compound(("h", k_shape[1]), ("g", group))
    return ShardingRule(
        operands=(f"t {q_heads} d", "p h c", "p h c", "t h n", "t h"),
        results=(f"t {q_heads} d",),
        replicated=("d", "c", "n", "g"),
        sizes={"g": group},
        ids=(Ids(3, "p"),),
    )


def _mxfp8_sharding(shapes) -> ShardingRule:
    rule = _sharding(shapes)
    heads = (("h", shapes[1][1]), ("g", shapes[0][1] // shapes[1][1]))
    return dataclasses.replace(
        rule,
        results=(
            "t " + compound(*heads, ("e", shapes[0][2])),
            "t " + compound(*heads, ("s", shapes[0][2] // MX_BLOCK)),
        ),
        replicated=(*rule.replicated, "e", "s"),
        sizes={**rule.sizes, "e": shapes[0][2], "s": shapes[0][2] // MX_BLOCK},
    )


def _cpu_attributes(*, sm_scale, output):
    del output  # chosen by the target, named after the primitive
    return {"sm_scale": np.float32(sm_scale)}


def _reference(q, k_pool, v_pool, page_table, context_lens, *, sm_scale, output):
    out = reference.sparse_attention(
        q, k_pool, v_pool, page_table, context_lens, sm_scale=sm_scale, output=output
    )
    return tuple(out) if output == "mxfp8" else (out,)


def _define(output: str):
    mxfp8 = output == "mxfp8"
    return define(
        Operation(
            name="mxfp4_sparse_attention" + ("_mxfp8" if mxfp8 else ""),
            abstract_eval=_abstract_eval,
            batching_rule=_batching_rule,
            reference=_reference,
            sharding=_mxfp8_sharding if mxfp8 else _sharding,
            operands=("q", "k_pool", "v_pool", "page_table", "context_lens"),
            lowerings=(
                CpuHandler(_cpu_attributes),
                flydsl("sparse_attention"),
                triton("sparse_attention"),
            ),
            multiple_results=True,
        )
    )


mxfp4_sparse_attention_p = _define("bf16")
mxfp4_sparse_attention_mxfp8_p = _define("mxfp8")


def _bind(q, k_pool, v_pool, page_table, context_lens, *, sm_scale: float,
                     output: str = "bf16"):
    primitive = mxfp4_sparse_attention_mxfp8_p if output == "mxfp8" else mxfp4_sparse_attention_p
    outs = primitive.bind(
        q, k_pool, v_pool, page_table, context_lens, sm_scale=float(sm_scale), output=output,
        config=current_config(),
    )
    return tuple(outs) if output == "mxfp8" else outs[0]


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
    check_arguments(*args, sm_scale, output)
    check_static_shapes(("q", "k_pool", "v_pool", "page_table", "context_lens"), args)
    return _bind(*args, sm_scale=float(sm_scale), output=output)
