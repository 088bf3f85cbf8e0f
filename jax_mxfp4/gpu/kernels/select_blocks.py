"""Triton kernel: top-k blocks per (index head, row) and the sparse page table (SPEC §6,
§15.8, §15.11).

One program per (row, head). The forced blocks come first by construction (SPEC §6): the init
blocks ``0 .. min(init_blocks, valid) - 1``, then the local blocks (the last ``local_blocks``
candidates that are not init blocks). The other candidates' scores become order-preserving
int32 ranks (``+inf > finite > NaN > -inf``, as the reference's ``score_rank``) and arg-max
passes (ties to the lower block, as ``lax.top_k``) pick the rest of the ``TOPK``. The emission
puts full blocks first in selection order, the row's own (tail) block last, looks the pages up
in the block table and computes the context length.
"""

from __future__ import annotations

import numpy as np
import triton
import triton.language as tl

from jax_mxfp4.gpu import launch as launcher
from jax_mxfp4.gpu import triton_call

INT_MIN = tl.constexpr(-2147483648)
NEG_INF_RANK = tl.constexpr(-2139095042)  # reference.select_blocks.NEG_INF_KEY


@triton.jit
def _rank(x):
    """int32 ranks in the selection order of scores ``x`` (reference ``score_rank``): the
    order-preserving bit patterns, ``-inf`` one below its own, which NaN takes."""
    bits = x.to(tl.int32, bitcast=True)
    rank = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
    rank = tl.where(x == float("-inf"), NEG_INF_RANK, rank)
    return tl.where(x != x, NEG_INF_RANK + 1, rank)


@triton.jit
def select_blocks_kernel(scores_ptr, table_ptr, pos_ptr, req_ptr, ids_ptr, pages_ptr, ctx_ptr,
                         T, B, W, NB, init_blocks, local_blocks, H: tl.constexpr,
                         NBP: tl.constexpr, TOPK: tl.constexpr, KP: tl.constexpr):
    """scores ``f32[H, T, NB]``, table ``s32[B, W]``, positions/requests ``s32[T]`` ->
    ids ``s32[H, T, TOPK]``, pages ``s32[T, H, TOPK]``, context ``s32[T, H]``."""
    row = tl.program_id(0)
    h = tl.program_id(1)
    pos = tl.load(pos_ptr + row)
    req = tl.load(req_ptr + row)
    live = (pos >= 0) & (req >= 0) & (req < B)
    pos = tl.where(live, pos, -1)
    valid = tl.where(pos >= 0, tl.minimum(pos // 128 + 1, NB), 0)
    init = tl.minimum(valid, init_blocks)
    first_local = tl.maximum(valid - local_blocks, init)
    forced = init + valid - first_local
    j = tl.arange(0, NBP)
    s = tl.load(scores_ptr + (h.to(tl.int64) * T + row) * NB + j, mask=j < NB, other=0.0)
    key = tl.where((j >= init) & (j < first_local), _rank(s), INT_MIN)
    k = tl.arange(0, KP)
    ids = tl.full((KP,), -1, tl.int32)
    count = tl.minimum(valid, TOPK)
    for r in tl.static_range(TOPK):
        best = tl.argmax(key, axis=0, tie_break_left=True).to(tl.int32)
        from_forced = r < forced
        pick = tl.where(from_forced, tl.where(r < init, r, first_local + r - init), best)
        ids = tl.where(k == r, tl.where(r < count, pick, -1), ids)
        key = tl.where((j == best) & (r >= forced), INT_MIN, key)
    tl.store(ids_ptr + (h.to(tl.int64) * T + row) * TOPK + k, ids, mask=k < TOPK)
    # Attention order: the tail (the row's own block) moves behind the other selections.
    self_block = tl.where(pos >= 0, pos // 128, -2)
    is_tail = (ids == self_block) & (ids >= 0)
    has_tail = tl.max(is_tail.to(tl.int32), axis=0) > 0
    tail_rank = tl.sum(tl.where(is_tail, k, 0), axis=0)
    n = tl.sum((ids >= 0).to(tl.int32), axis=0)
    src = tl.where(has_tail & (k >= tail_rank) & (k < n - 1), k + 1, k)
    src = tl.where(has_tail & (k == n - 1), tail_rank, src)
    onehot = k[None, :] == src[:, None]  # [dest, src]
    ordered = tl.sum(tl.where(onehot, ids[None, :], 0), axis=1)
    safe_req = tl.minimum(tl.maximum(req, 0), B - 1)
    page = tl.load(table_ptr + safe_req.to(tl.int64) * W + tl.maximum(ordered, 0),
                   mask=(ordered >= 0) & (k < TOPK), other=0)
    page = tl.where(ordered >= 0, page, 0)
    out_row = (row.to(tl.int64) * H + h) * TOPK
    tl.store(pages_ptr + out_row + k, page, mask=k < TOPK)
    tail_tokens = pos % 128 + 1
    # min(n * 128, pos + 1), written so that pos = INT32_MAX does not wrap.
    context = tl.where(has_tail, (n - 1) * 128 + tail_tokens, tl.minimum(n * 128 - 1, pos) + 1)
    tl.store(ctx_ptr + row.to(tl.int64) * H + h, tl.maximum(context, 0))


def padded(n: int) -> int:
    return max(16, triton.next_power_of_2(max(1, n)))


# --- lowering (covers / lower: jax_mxfp4.lowering.KernelModule) -----------------------------

_INT32_MAX = 2**31 - 1


def available(target, config) -> str | None:
    return triton_call.launcher_problem(target)


def covers(call) -> str | None:
    return None  # every call of the operation


def kernel_name(call) -> str:
    return "select_blocks_kernel"


def lower(ctx, call, scores, table, positions, requests):
    """One program per (row, head); the counts beyond int32 mean "every block" anyway."""
    heads, rows, num_blocks = call.avals_in[0].shape
    num_requests, width = call.avals_in[1].shape
    topk = call.params["topk"]
    launch = triton_call.launch(
        select_blocks_kernel, call.target, grid=(rows, heads, 1) if rows and heads else (0, 1, 1),
        buffers=("scores_ptr", "table_ptr", "pos_ptr", "req_ptr", "ids_ptr", "pages_ptr",
                 "ctx_ptr"),
        avals=(*call.avals_in, *call.avals_out),
        scalars={"T": np.int32(rows), "B": np.int32(num_requests), "W": np.int32(width),
                 "NB": np.int32(num_blocks),
                 "init_blocks": np.int32(min(call.params["init_blocks"], _INT32_MAX)),
                 "local_blocks": np.int32(min(call.params["local_blocks"], _INT32_MAX))},
        constants={"H": heads, "NBP": padded(num_blocks), "TOPK": topk, "KP": padded(topk)},
        num_warps=4 if num_blocks <= 2048 else 8,
    )
    return launcher.emit(ctx, launch, [scores, table, positions, requests], call.avals_in,
                         call.avals_out)
