"""The ``mxfp4_sparse_attention`` primitive: paged attention over MXFP4 K/V (SPEC §7, §8)."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np
from jax.core import ShapedArray

from jax_mxfp4 import ffi_targets, reference, validate
from jax_mxfp4.backend import current_config
from jax_mxfp4.formats import MX_BLOCK
from jax_mxfp4.lowering import CpuHandler, flydsl, triton
from jax_mxfp4.primitives import _batching as batch
from jax_mxfp4.primitives._operation import Operation, ShardingRule, define
from jax_mxfp4.primitives._sharding import Ids, compound


def _abstract_eval(q, k_pool, v_pool, page_table, context_lens, *, sm_scale, output):
    validate.sparse_attention_args(q, k_pool, v_pool, page_table, context_lens, sm_scale, output)
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
    with the pages (p) they read (global page ids, made local per shard: ``_sharding.Ids``)."""
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
    del output  # chosen by the target name
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
                CpuHandler(
                    ffi_targets.SPARSE_ATTENTION_MXFP8 if mxfp8 else ffi_targets.SPARSE_ATTENTION,
                    _cpu_attributes),
                flydsl("sparse_attention"),
                triton("sparse_attention"),
            ),
            multiple_results=True,
        )
    )


mxfp4_sparse_attention_p = _define("bf16")
mxfp4_sparse_attention_mxfp8_p = _define("mxfp8")


def sparse_attention(q, k_pool, v_pool, page_table, context_lens, *, sm_scale: float,
                     output: str = "bf16"):
    primitive = mxfp4_sparse_attention_mxfp8_p if output == "mxfp8" else mxfp4_sparse_attention_p
    outs = primitive.bind(
        q, k_pool, v_pool, page_table, context_lens, sm_scale=float(sm_scale), output=output,
        config=current_config(),
    )
    return tuple(outs) if output == "mxfp8" else outs[0]
