"""The gfx950 lowering of ``sparse_attention``: which calls the FlyDSL kernels of
``jax_mxfp4._src.ops.sparse_attention.flydsl_kernel`` cover, their specialization, and the launch
(``dispatch.lowering.KernelModule``: ``available``, ``covers``, ``kernel_name``, ``lower``).
"""

from __future__ import annotations

import jax.numpy as jnp
from jax.core import ShapedArray

from jax_mxfp4._src.core.plans import PAGES_PER_SPLIT, attention_rows, attention_splits
from jax_mxfp4._src.flydsl import launch as _launch
from jax_mxfp4._src.flydsl.abi import Specialization
from jax_mxfp4._src.flydsl.code_object import code_object
from jax_mxfp4._src.gpu import launch as launcher


def _specs(call) -> tuple[Specialization, Specialization | None, int]:
    """(attention kernel, merge kernel or ``None``, partitions NP) of a call: the direct
    kernel when ``plans.attention_splits`` at ``plans.PAGES_PER_SPLIT`` gives one partition,
    else the split kernel (bf16 partials whatever the output) and the merge."""
    _, group, n, _ = attention_rows(call.avals_in)
    q, output = _launch.q_dtype(call.avals_in[0]), call.params["output"]
    partitions = attention_splits(n, PAGES_PER_SPLIT)
    if partitions == 1:
        return (Specialization("sparse_attention", q=q, group=group, output=output,
                               path="direct"), None, 1)
    return (Specialization("sparse_attention", q=q, group=group, output="bf16", path="split"),
            Specialization("attention_merge", group=group, output=output), partitions)


def available(target, config) -> str | None:
    return _launch.available(target, config)


def covers(call) -> str | None:
    group = attention_rows(call.avals_in)[1]
    if group not in _launch.POWERS:
        return f"the kernels are built for {_launch.POWERS} q heads per kv head, not {group}"
    attention, merge, _ = _specs(call)
    return (_launch.code_object_problem(attention, call.target.arch)
            or (merge and _launch.code_object_problem(merge, call.target.arch)))


def kernel_name(call) -> str:
    attention, merge, partitions = _specs(call)
    if merge is None:
        return attention.symbol
    return f"{attention.symbol}[{partitions} partitions]+{merge.symbol}"


def lower(ctx, call, q, k_pool, v_pool, pages, context):
    """The direct kernel, or the split kernel writing its partials as the results of its
    custom call (``bf16[R, NP, G, 128]`` and ``f32[R, NP, G, 2]``: XLA allocates them like
    any intermediate) and a second call (``attention_merge``) reducing them."""
    rows, group, n, kv_heads = attention_rows(call.avals_in)
    attention, merge, partitions = _specs(call)
    co = code_object(attention, arch=call.target.arch)
    inputs = ("q", "k_pool", "v_pool", "page_table", "context_lens")
    operands = [q, k_pool, v_pool, pages, context]
    scalars = {"num_rows": rows, "num_kv_heads": kv_heads, "num_pages": call.avals_in[1].shape[0],
               "pages_per_row": n, "num_partitions": partitions,
               "sm_scale": call.params["sm_scale"]}
    grid = _launch.empty_or(co.grid(num_rows=rows, num_partitions=partitions), rows)
    if merge is None:
        mxfp8 = call.params["output"] == "mxfp8"
        outputs = ("out", "out_aux") if mxfp8 else ("out",)
        launch = _launch.launch(co, grid, buffers=(*inputs, *outputs), scalars=scalars,
                                nulls=() if mxfp8 else ("out_aux",))
        return launcher.emit(ctx, launch, operands, call.avals_in, call.avals_out)
    part_avals = [ShapedArray((rows, partitions, group, 128), jnp.bfloat16),
                  ShapedArray((rows, partitions, group, 2), jnp.float32)]
    launch = _launch.launch(co, grid, buffers=(*inputs, "out", "out_aux"), scalars=scalars)
    partials = launcher.emit(ctx, launch, operands, call.avals_in, part_avals)
    merge_co = code_object(merge, arch=call.target.arch)
    mxfp8 = call.params["output"] == "mxfp8"
    merged = _launch.launch(
        merge_co, _launch.empty_or(merge_co.grid(num_rows=rows), rows),
        buffers=("partial_out", "partial_stats", "out", *(("out_aux",) if mxfp8 else ())),
        scalars={"num_rows": rows, "num_partitions": partitions},
        nulls=() if mxfp8 else ("out_aux",))
    return launcher.emit(ctx, merged, partials, part_avals, call.avals_out)
