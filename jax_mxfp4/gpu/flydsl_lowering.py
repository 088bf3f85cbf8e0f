"""ROCm lowering on gfx950: the FlyDSL kernels (``hip_kernels``) through the generic launcher.

On a ROCm device whose arch is gfx950, :func:`lower` maps a kernel primitive to the FlyDSL code
object of its specialization (``hip_kernels.code_object``: ``$JAX_MXFP4_KERNEL_DIR``, the
content-hash disk cache, or a FlyDSL compile), packs its kernel arguments in the order of
``hip_kernels.abi`` and emits one launcher custom call per kernel
(:func:`jax_mxfp4.gpu.launch.emit`, the same HIP path the Triton kernels take). It returns
``None`` where no FlyDSL kernel covers the call, and the caller then lowers to the Triton
kernel:

* another arch (gfx942...), or ``JAX_MXFP4_GFX950_KERNELS=triton`` (the Triton kernels, whose
  arithmetic was verified on the H200);
* ``select_blocks`` (no FlyDSL kernel), ``index_scores`` with ``q_round="none"`` or a head
  count / group outside 1, 2, 4, 8, 16, or FlyDSL unavailable with no prebuilt/cached code.

The arch comes from ``$JAX_MXFP4_ROCM_ARCH`` (what lets a machine without a GPU lower for
gfx950), else from the lowering context's ROCm devices, else from this process's ROCm devices.

Split-K attention (several partitions per row, chosen like the Triton plan: about two waves
of (row, partition) workgroups, at least two pages per partition) writes its partials
(``bf16[R, NP, G, 128]`` and ``f32[R, NP, G, 2]``) as the *results* of the split kernel's
custom call, and a second custom call (``attention_merge``) reduces them: XLA allocates the
scratch like any intermediate.
"""

from __future__ import annotations

import functools
import hashlib
import os

import jax
import jax.numpy as jnp
from jax.core import ShapedArray

from jax_mxfp4.gpu import launch as L
from jax_mxfp4.gpu.compiler import Compiled
from jax_mxfp4.reference._common import folded_score_scale

ARCH = "gfx950"
KERNELS_ENV = "JAX_MXFP4_GFX950_KERNELS"  # "flydsl" (default) | "triton"
ARCH_ENV = "JAX_MXFP4_ROCM_ARCH"
WAVE = 64
POWERS = (1, 2, 4, 8, 16)

KERNELS = {
    "write_cache": "write_cache",
    "index_scores": "index_scores",
    "sparse_attention": "sparse_attention+attention_merge",
}
"""The FlyDSL kernel(s) of each GPU lowering rule (``Operation.gpu_lowering.__name__``)."""

_PARAM_TYPE = {"pointer": "*u8", "i32": "i32", "f32": "fp32", "i64": "i64"}


def _clean(arch) -> str | None:
    return str(arch).split(":")[0] if arch else None


def _ctx_devices(ctx) -> list:
    axis = getattr(ctx.module_context, "axis_context", None)
    devices = getattr(axis, "device_assignment", None)
    if devices is None and getattr(axis, "mesh", None) is not None:
        devices = list(axis.mesh.devices.flat)
    return list(devices or [])


def rocm_arch(ctx=None) -> str | None:
    """The gfx arch the ROCm lowering targets (``None``: not known, no ROCm device)."""
    override = os.environ.get(ARCH_ENV)
    if override:
        return _clean(override)
    if ctx is not None:
        for d in _ctx_devices(ctx):
            if getattr(d, "platform", "") == "rocm":
                return _clean(getattr(d, "compute_capability", None))
    return _process_arch()


@functools.cache
def _process_arch() -> str | None:
    try:
        devices = jax.devices("rocm")
    except RuntimeError:
        return None
    return _clean(getattr(devices[0], "compute_capability", None)) if devices else None


def enabled(ctx=None) -> bool:
    """Whether ROCm lowerings take the FlyDSL kernels: a gfx950 arch, not opted out."""
    if os.environ.get(KERNELS_ENV, "flydsl").lower() == "triton":
        return False
    return rocm_arch(ctx) == ARCH


def kernel_name(rule_name: str) -> str | None:
    """The FlyDSL kernel(s) of a GPU lowering rule, ``None`` where there is none."""
    return KERNELS.get(rule_name)


def _units() -> int:
    override = os.environ.get("JAX_MXFP4_GPU_UNITS")
    if override:
        return int(override)
    try:
        return int(getattr(jax.devices("rocm")[0], "core_count", 0) or 256)
    except RuntimeError:
        return 256  # MI355X


def code_object(op: str, **params):
    """``hip_kernels.code_object`` for gfx950; ``None`` where FlyDSL cannot compile here and
    no prebuilt or cached code object exists."""
    from hip_kernels import code_object as get

    try:
        return get(op, arch=ARCH, **params)
    except ImportError:
        return None


def compiled(co) -> Compiled:
    """A FlyDSL code object as the launcher's :class:`Compiled` (static LDS only: 0 dynamic
    shared bytes; no Triton scratch parameters)."""
    block = co.block[0] * co.block[1] * co.block[2]
    digest = hashlib.sha256(co.hsaco).hexdigest()[:16]
    return Compiled(
        code=co.hsaco, symbol=co.symbol, shared_mem=0, num_warps=block // WAVE,
        warp_size=WAVE, param_types=tuple(_PARAM_TYPE[s.kind] for s in co.kernarg_layout),
        code_hash=f"{co.content_hash}-{digest}",
    )


def launch(co, grid, params: dict[str, L.Param]) -> L.Launch:
    """A launch of ``co`` with ``params`` by kernarg name, in ``co.kernarg_layout`` order."""
    names = [s.name for s in co.kernarg_layout]
    if sorted(names) != sorted(params):
        raise ValueError(f"{co.symbol}: parameters {sorted(params)}, kernarg layout {names}")
    return L.Launch(compiled(co), tuple(int(g) for g in grid), tuple(params[n] for n in names))


def _empty_or(grid, *sizes) -> tuple[int, int, int]:
    return grid if all(sizes) else (0, 1, 1)


def _q_dtype(aval) -> str:
    return "e4m3" if jnp.dtype(aval.dtype) == jnp.float8_e4m3fn else "bf16"


# --- rules: (ctx, *args, **params) -> results, or None where FlyDSL does not cover the call --


def write_cache(ctx, pool, x, slots, *, round_mode):
    from jax_mxfp4.gpu.lowering import ROUND_CODES

    pool_aval, x_aval, _ = ctx.avals_in
    heads = pool_aval.shape[1] if len(pool_aval.shape) == 3 else 1
    tokens = x_aval.shape[0]
    co = code_object("write_cache")
    if co is None:
        return None
    grid = _empty_or(co.grid(num_tokens=tokens, num_heads=heads), tokens, heads)
    params = {"pool": L.buffer(3), "x": L.buffer(1), "slots": L.buffer(2),
              "num_tokens": L.i32(tokens), "num_pages": L.i32(pool_aval.shape[0]),
              "num_heads": L.i32(heads), "round_mode": L.i32(ROUND_CODES[round_mode])}
    return L.emit(ctx, launch(co, grid, params), [pool, x, slots], ctx.avals_in,
                  ctx.avals_out, {0: 0})


def index_tiling(rows: int, heads: int, requests: int) -> str:
    """Prefill tiling when a request has at least a prefill tile of rows, else decode."""
    from hip_kernels import abi

    prefill_rows = abi.index_scores_tile(abi.Specialization(
        "index_scores", q="bf16", heads=heads, tiling="prefill"))[0]
    return "prefill" if rows // max(1, requests) >= prefill_rows else "decode"


def index_scores(ctx, q, pool, table, positions, requests, *, num_blocks, sm_scale, q_round):
    q_aval, pool_aval, table_aval = ctx.avals_in[:3]
    rows, heads = q_aval.shape[0], q_aval.shape[1]
    requests_n, width = table_aval.shape
    q_type = _q_dtype(q_aval)
    if heads not in POWERS or (q_type == "bf16" and q_round != "e4m3"):
        return None  # q_round="none" (bf16 dots) has no FlyDSL kernel
    co = code_object("index_scores", q=q_type, heads=heads,
                     tiling=index_tiling(rows, heads, requests_n))
    if co is None:
        return None
    grid = _empty_or(co.grid(num_rows=rows, num_blocks=num_blocks), rows, num_blocks,
                     requests_n)
    buffers = ("q", "index_pool", "block_table", "positions", "requests", "out")
    params = {**{n: L.buffer(i) for i, n in enumerate(buffers)},
              "num_rows": L.i32(rows), "num_pages": L.i32(pool_aval.shape[0]),
              "num_requests": L.i32(requests_n), "table_width": L.i32(width),
              "num_blocks": L.i32(num_blocks),
              "score_scale": L.f32(folded_score_scale(sm_scale))}
    return L.emit(ctx, launch(co, grid, params), [q, pool, table, positions, requests],
                  ctx.avals_in, ctx.avals_out)


def partitions(num_rows: int, pages_per_row: int, units: int) -> int:
    """Split-K partitions NP (1: the direct kernel), as the Triton plan picks its splits:
    about two waves of (row, partition) workgroups, at least two pages per partition, a power
    of two."""
    want = max(1, (2 * units) // max(1, num_rows))
    splits = 1
    while splits * 2 <= min(want, pages_per_row // 2):
        splits *= 2
    return splits


def sparse_attention(ctx, q, k_pool, v_pool, pages, context, *, sm_scale, output):
    q_aval, k_aval, _, pages_aval, _ = ctx.avals_in
    tokens, q_heads, _ = q_aval.shape
    num_pages, kv_heads = k_aval.shape[0], k_aval.shape[1]
    group, n = q_heads // kv_heads, pages_aval.shape[-1]
    rows = tokens * kv_heads
    if group not in POWERS:
        return None
    q_type, mxfp8 = _q_dtype(q_aval), output == "mxfp8"
    np_ = partitions(rows, n, _units())
    path = "direct" if np_ == 1 else "split"
    co = code_object("sparse_attention", q=q_type, group=group,
                     output=output if path == "direct" else "bf16", path=path)
    merge = None if path == "direct" else code_object("attention_merge", group=group,
                                                        output=output)
    if co is None or (path == "split" and merge is None):
        return None
    operands = [q, k_pool, v_pool, pages, context]
    params = {**{name: L.buffer(i) for i, name in enumerate(
        ("q", "k_pool", "v_pool", "page_table", "context_lens", "out"))},
        "num_rows": L.i32(rows), "num_kv_heads": L.i32(kv_heads),
        "num_pages": L.i32(num_pages), "pages_per_row": L.i32(n),
        "num_partitions": L.i32(np_), "sm_scale": L.f32(sm_scale)}
    grid = _empty_or(co.grid(num_rows=rows, num_partitions=np_), rows)
    if path == "direct":
        params["out_aux"] = L.buffer(6) if mxfp8 else L.null()
        return L.emit(ctx, launch(co, grid, params), operands, ctx.avals_in, ctx.avals_out)
    # Split-K: the partials are the split call's results (XLA allocates them), then the merge.
    part_avals = [ShapedArray((rows, np_, group, 128), jnp.bfloat16),
                  ShapedArray((rows, np_, group, 2), jnp.float32)]
    params["out_aux"] = L.buffer(6)
    partial_out, partial_stats = L.emit(ctx, launch(co, grid, params), operands,
                                        ctx.avals_in, part_avals)
    merge_params = {"partial_out": L.buffer(0), "partial_stats": L.buffer(1),
                    "out": L.buffer(2), "out_aux": L.buffer(3) if mxfp8 else L.null(),
                    "num_rows": L.i32(rows), "num_partitions": L.i32(np_)}
    merge_grid = _empty_or(merge.grid(num_rows=rows), rows)
    return L.emit(ctx, launch(merge, merge_grid, merge_params), [partial_out, partial_stats],
                  part_avals, ctx.avals_out)


RULES = {"write_cache": write_cache, "index_scores": index_scores,
         "sparse_attention": sparse_attention}


def lower(rule_name: str, ctx, *args, **params):
    """The FlyDSL lowering of GPU rule ``rule_name`` when it applies here (gfx950, not opted
    out, a kernel covering the call); ``None``: lower to the Triton kernel instead."""
    rule = RULES.get(rule_name)
    if rule is None or not enabled(ctx):
        return None
    return rule(ctx, *args, **params)


__all__ = ["ARCH", "ARCH_ENV", "KERNELS_ENV", "code_object", "compiled", "enabled",
           "index_tiling", "kernel_name", "launch", "lower", "partitions", "rocm_arch"]
