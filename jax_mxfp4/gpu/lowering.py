"""GPU lowering rules of the kernel primitives: Triton kernels launched through the launcher.

Each rule receives the kernel primitive's lowering context (per-shard avals) and static
options, compiles its Triton kernel(s) for the lowering platform's architecture
(:mod:`jax_mxfp4.gpu.compiler`, cached on disk) and emits one launcher custom call per kernel
(:func:`jax_mxfp4.gpu.launch.emit`). Grids come from static shapes only.
"""

from __future__ import annotations

import functools
import os

import jax
import jax.numpy as jnp
from jax.core import ShapedArray
from jax.interpreters import mlir

from jax_mxfp4.gpu import compiler
from jax_mxfp4.gpu import launch as L
from jax_mxfp4.gpu.compiler import Target
from jax_mxfp4.pages import last_writer_slots
from jax_mxfp4.reference._common import folded_score_scale

ROUND_CODES = {"up": 0, "even": 1, "down": 2}

_POINTER = {
    jnp.dtype(jnp.uint8): "*u8",
    jnp.dtype(jnp.int32): "*i32",
    jnp.dtype(jnp.bfloat16): "*bf16",
    jnp.dtype(jnp.float8_e4m3fn): "*fp8e4nv",
    jnp.dtype(jnp.float32): "*fp32",
}


def pointer(aval) -> str:
    return _POINTER[jnp.dtype(aval.dtype)]


def fp8_dots() -> bool:
    """``JAX_MXFP4_GPU_FP8_DOT=1``: QK dots on e4m3 operands (Hopper's fp8 tensor cores
    accumulate with reduced precision: opt-in, measured by the bench) instead of fp16."""
    return os.environ.get("JAX_MXFP4_GPU_FP8_DOT", "0") == "1"


@functools.cache
def target_for(platform: str) -> tuple[Target, int]:
    """The compile target of this process's ``platform`` devices and their SM/CU count.

    ``JAX_MXFP4_GPU_ARCH`` (e.g. ``90`` or ``gfx942``) overrides what the device reports;
    for ROCm, so does ``JAX_MXFP4_ROCM_ARCH`` when that is unset.
    """
    override = os.environ.get("JAX_MXFP4_GPU_ARCH")
    if not override and platform == "rocm":
        override = os.environ.get("JAX_MXFP4_ROCM_ARCH")
    if override:  # also what lets a machine without a GPU lower (export) for one
        units = int(os.environ.get("JAX_MXFP4_GPU_UNITS", "132"))
        if platform == "cuda":
            return Target("cuda", int(override), 32), units
        return Target("hip", override, 64), units
    device = jax.devices(platform)[0]
    units = int(getattr(device, "core_count", 0) or 132)
    if platform == "cuda":
        arch = str(getattr(device, "compute_capability", "9.0")).replace(".", "")
        return Target("cuda", int(arch), 32), units
    return Target("hip", str(getattr(device, "compute_capability", "gfx942")), 64), units


def _platform(ctx) -> str:
    platforms = ctx.module_context.platforms
    return "rocm" if "rocm" in platforms else "cuda"


def _launch(kernel, grid, params) -> L.Launch:
    return L.Launch(kernel, tuple(int(g) for g in grid), L.with_scratch(params))


# Up to this many rows the write kernel finds each slot's last writer itself (every program
# compares its rows with all T slots: quadratic); above it, the slots are sorted first.
# H200, bench/gpu_diagnose.py --probes: the kernel with / without its scan takes 6.7 / 7.1 us
# at 32 tokens, 21.0 / 8.3 us at 4096, 180.7 / 16.7 us at 16384.
KERNEL_DEDUP_MAX_ROWS = 4096


def write_cache(ctx, pool, x, slots, *, round_mode):
    target, _ = target_for(_platform(ctx))
    pool_aval, x_aval, slots_aval = ctx.avals_in
    heads = pool_aval.shape[1] if len(pool_aval.shape) == 3 else 1
    num_pages, rows = pool_aval.shape[0], x_aval.shape[0] * heads
    from jax_mxfp4.gpu.kernels import write_cache as K

    dedup_in_kernel = x_aval.shape[0] <= KERNEL_DEDUP_MAX_ROWS
    if not dedup_in_kernel:
        sub = ctx.replace(avals_in=[slots_aval], avals_out=[slots_aval])
        slots = mlir.lower_fun(lambda s: [last_writer_slots(s)])(sub, slots)[0]
    spec = compiler.spec(
        K.write_cache_kernel,
        {"pool_ptr": "*u8", "x_ptr": "*bf16", "slots_ptr": "*i32", "out_ptr": "*u8",
         "T": "i32", "H": "i32", "P": "i32"},
        {"ROUND": ROUND_CODES[round_mode], "ROWS": K.rows_per_program(rows), "SCAN": 256,
         "DEDUP": dedup_in_kernel},
        num_warps=4,
    )
    grid = K.grid(rows) if rows else (0, 1, 1)
    params = [L.buffer(0), L.buffer(1), L.buffer(2), L.buffer(3), L.i32(x_aval.shape[0]),
              L.i32(heads), L.i32(num_pages)]
    launch = _launch(compiler.compile_kernel(spec, target), grid, params)
    return L.emit(ctx, launch, [pool, x, slots], ctx.avals_in, ctx.avals_out, {0: 0})


def index_scores(ctx, q, pool, table, positions, requests, *, num_blocks, sm_scale, q_round):
    target, units = target_for(_platform(ctx))
    q_aval, pool_aval, table_aval = ctx.avals_in[:3]
    rows, heads = q_aval.shape[0], q_aval.shape[1]
    requests_n, width = table_aval.shape
    from jax_mxfp4.gpu.kernels import index_scores as K

    q_fp8 = jnp.dtype(q_aval.dtype) == jnp.float8_e4m3fn
    round_q = (not q_fp8) and q_round == "e4m3"
    exact_e4m3 = q_fp8 or round_q
    use_fp8 = exact_e4m3 and fp8_dots()
    dot = "fp8e4nv" if use_fp8 else ("fp16" if exact_e4m3 else "bf16")
    plan = K.plan(rows, heads, requests_n, num_blocks, units, foldable=not use_fp8)
    spec = compiler.spec(
        K.index_scores_kernel,
        {"q_ptr": pointer(q_aval), "pool_ptr": "*u8", "table_ptr": "*i32", "pos_ptr": "*i32",
         "req_ptr": "*i32", "out_ptr": "*fp32", "T": "i32", "B": "i32", "W": "i32",
         "P": "i32", "NB": "i32", "score_scale": "fp32"},
        {"H": heads, "ROWS": plan.rows, "M": plan.m, "BLOCKS": plan.blocks,
         "Q_IS_FP8": q_fp8, "ROUND_Q": round_q, "USE_FP8": use_fp8,
         "DOT_DTYPE": _triton_dtype(dot), "ONE_ROW": plan.one_row, "FOLD": plan.fold},
        num_warps=plan.num_warps,
    )
    grid = plan.grid if rows and num_blocks and requests_n else (0, 1, 1)
    params = [L.buffer(i) for i in range(6)] + [
        L.i32(rows), L.i32(requests_n), L.i32(width), L.i32(pool_aval.shape[0]),
        L.i32(num_blocks), L.f32(folded_score_scale(sm_scale)),
    ]
    launch = _launch(compiler.compile_kernel(spec, target), grid, params)
    return L.emit(ctx, launch, [q, pool, table, positions, requests], ctx.avals_in,
                  ctx.avals_out)


def _triton_dtype(name: str):
    import triton.language as tl

    return getattr(tl, {"fp8e4nv": "float8e4nv", "fp16": "float16", "bf16": "bfloat16"}[name])


def select_blocks(ctx, scores, table, positions, requests, *, topk, init_blocks, local_blocks):
    target, _ = target_for(_platform(ctx))
    scores_aval, table_aval = ctx.avals_in[:2]
    heads, rows, num_blocks = scores_aval.shape
    from jax_mxfp4.gpu.kernels import select_blocks as K

    spec = compiler.spec(
        K.select_blocks_kernel,
        {"scores_ptr": "*fp32", "table_ptr": "*i32", "pos_ptr": "*i32", "req_ptr": "*i32",
         "ids_ptr": "*i32", "pages_ptr": "*i32", "ctx_ptr": "*i32", "T": "i32", "B": "i32",
         "W": "i32", "NB": "i32", "init_blocks": "i32", "local_blocks": "i32"},
        {"H": heads, "NBP": K.padded(num_blocks), "TOPK": topk, "KP": K.padded(topk)},
        num_warps=4 if num_blocks <= 2048 else 8,
    )
    grid = (rows, heads, 1) if rows and heads else (0, 1, 1)
    params = [L.buffer(i) for i in range(7)] + [
        L.i32(rows), L.i32(table_aval.shape[0]), L.i32(table_aval.shape[1]),
        L.i32(num_blocks), L.i32(min(init_blocks, 2**31 - 1)),
        L.i32(min(local_blocks, 2**31 - 1)),
    ]
    launch = _launch(compiler.compile_kernel(spec, target), grid, params)
    return L.emit(ctx, launch, [scores, table, positions, requests], ctx.avals_in,
                  ctx.avals_out)


def sparse_attention(ctx, q, k_pool, v_pool, pages, context, *, sm_scale, output):
    target, units = target_for(_platform(ctx))
    q_aval, k_aval, _, pages_aval, _ = ctx.avals_in
    tokens, q_heads, _ = q_aval.shape
    num_pages, kv_heads = k_aval.shape[0], k_aval.shape[1]
    group, n = q_heads // kv_heads, pages_aval.shape[-1]
    rows = tokens * kv_heads
    from jax_mxfp4.gpu.kernels import sparse_attention as K

    plan = K.plan(rows, group, n, units)
    mxfp8 = output == "mxfp8"
    q_fp8 = jnp.dtype(q_aval.dtype) == jnp.float8_e4m3fn
    consts = {"G": group, "GP": plan.gp, "PAGES": plan.pages, "SPLITS": plan.splits,
              "Q_IS_FP8": q_fp8, "MXFP8": mxfp8, "USE_FP8": fp8_dots()}
    out_ptr = "*fp8e4nv" if mxfp8 else "*bf16"
    direct = plan.splits == 1
    spec = compiler.spec(
        K.attention_kernel,
        {"q_ptr": pointer(q_aval), "k_ptr": "*u8", "v_ptr": "*u8", "table_ptr": "*i32",
         "ctx_ptr": "*i32", "out_ptr": out_ptr if direct else "*bf16", "aux_ptr": "*u8",
         "m_ptr": "*fp32", "l_ptr": "*fp32", "HKV": "i32", "P": "i32", "NPAGES": "i32",
         "sm_scale": "fp32"},
        {**consts, "PV_DTYPE": _triton_dtype("bf16")}, num_warps=plan.num_warps,
    )
    kernel = compiler.compile_kernel(spec, target)
    scalars = [L.i32(kv_heads), L.i32(num_pages), L.i32(n), L.f32(sm_scale)]
    grid = (rows, plan.splits, 1) if rows else (0, 1, 1)
    operands = [q, k_pool, v_pool, pages, context]
    if direct:
        aux = L.buffer(6) if mxfp8 else L.null()
        params = [*(L.buffer(i) for i in range(6)), aux, L.null(), L.null(), *scalars]
        return L.emit(ctx, _launch(kernel, grid, params), operands, ctx.avals_in, ctx.avals_out)
    parts = rows * plan.splits * plan.gp
    part_avals = [ShapedArray((parts * 128,), jnp.bfloat16), ShapedArray((parts,), jnp.float32),
                  ShapedArray((parts,), jnp.float32)]
    params = [*(L.buffer(i) for i in range(5)), L.buffer(5), L.null(), L.buffer(6),
              L.buffer(7), *scalars]
    o, m, l_ = L.emit(ctx, _launch(kernel, grid, params), operands, ctx.avals_in, part_avals)
    reduce_spec = compiler.spec(
        K.reduce_kernel,
        {"o_ptr": "*bf16", "m_ptr": "*fp32", "l_ptr": "*fp32", "out_ptr": out_ptr,
         "aux_ptr": "*u8", "HKV": "i32"},
        {"G": group, "GP": plan.gp, "SPLITS": plan.splits, "MXFP8": mxfp8}, num_warps=4,
    )
    aux = L.buffer(4) if mxfp8 else L.null()
    params = [L.buffer(0), L.buffer(1), L.buffer(2), L.buffer(3), aux, L.i32(kv_heads)]
    launch = _launch(compiler.compile_kernel(reduce_spec, target), (rows, 1, 1), params)
    return L.emit(ctx, launch, [o, m, l_], part_avals, ctx.avals_out)


def available() -> bool:
    """Whether GPU kernels can be built here: Triton importable and the launcher built."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return bool(L.register_gpu_targets())


__all__ = ["available", "index_scores", "select_blocks", "sparse_attention", "target_for",
           "write_cache"]
