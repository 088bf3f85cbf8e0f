"""The gfx950 lowering of ``index_scores``: which calls the FlyDSL kernels of
``jax_mxfp4._src.ops.index_scores.flydsl_kernel`` cover, their specialization, and the launch
(``dispatch.lowering.KernelModule``: ``available``, ``covers``, ``kernel_name``, ``lower``).
"""

from __future__ import annotations

from jax_mxfp4._src.core.scaling import folded_score_scale
from jax_mxfp4._src.flydsl import launch as _launch
from jax_mxfp4._src.flydsl.abi import Specialization, index_scores_tile, index_scores_tile_rows
from jax_mxfp4._src.flydsl.code_object import code_object
from jax_mxfp4._src.gpu import launch as launcher


def _spec(call) -> Specialization:
    """The specialization of a call: the prefill tiling when a request has at least a
    prefill tile of rows, the decode tiling otherwise."""
    q_aval, _, table_aval = call.avals_in[:3]
    rows, heads = q_aval.shape[0], q_aval.shape[1]
    q = _launch.q_dtype(q_aval)
    prefill = Specialization("index_scores", q=q, heads=heads, tiling="prefill")
    per_request = rows // max(1, table_aval.shape[0])
    tiling = "prefill" if per_request >= index_scores_tile(prefill)[0] else "decode"
    return Specialization("index_scores", q=q, heads=heads, tiling=tiling)


def available(target, config) -> str | None:
    return _launch.available(target, config)


def covers(call) -> str | None:
    heads = call.avals_in[0].shape[1]
    if heads not in _launch.POWERS:
        return f"the kernels are built for {_launch.POWERS} index heads, not {heads}"
    if _launch.q_dtype(call.avals_in[0]) == "bf16" and call.params["q_round"] != "e4m3":
        return "q_round='none' keeps a bf16 query bf16: the scaled MFMA takes e4m3 queries"
    return _launch.code_object_problem(_spec(call), call.target.arch)


def kernel_name(call) -> str:
    return _spec(call).symbol


def lower(ctx, call, q, pool, table, positions, requests):
    q_aval, pool_aval, table_aval = call.avals_in[:3]
    rows = q_aval.shape[0]
    num_requests, width = table_aval.shape
    num_blocks = call.params["num_blocks"]
    spec = _spec(call)
    co = code_object(spec, arch=call.target.arch)
    tile_rows = index_scores_tile_rows(spec, rows, num_requests)
    grid = _launch.empty_or(co.grid(num_rows=rows, num_blocks=num_blocks, tile_rows=tile_rows),
                            rows, num_blocks, num_requests)
    launch = _launch.launch(
        co, grid,
        buffers=("q", "index_pool", "block_table", "positions", "requests", "out"),
        scalars={"num_rows": rows, "num_pages": pool_aval.shape[0],
                 "num_requests": num_requests, "table_width": width, "num_blocks": num_blocks,
                 "tile_rows": tile_rows,
                 "score_scale": folded_score_scale(call.params["sm_scale"])})
    return launcher.emit(ctx, launch, [q, pool, table, positions, requests], call.avals_in,
                         call.avals_out)
