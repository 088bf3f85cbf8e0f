"""Triton kernel: top-k blocks per (index head, row) and the sparse page table (SPEC §6,
§6.1, §2.5).

One program per ``ROWS`` rows of one head; each row is selected in one pass by a bitonic top-k
network in registers (``tl.topk``). Every block gets one int64 key, ``rank << 32 | NBP - 1 -
block``, so that the descending order of keys is the selection order with ties to the lower
block (as ``lax.top_k``):

* the forced blocks (SPEC §6: the init blocks ``0 .. min(init_blocks, valid) - 1``, then the
  local blocks, the last ``local_blocks`` candidates that are not init blocks) rank
  ``INT32_MAX``, which no score's rank reaches (``+inf`` ranks ``0x7F800000``), so they come
  first by construction, ascending;
* the other candidates rank by their score (int32, order-preserving, ``+inf > finite > NaN >
  -inf``, as the reference's ``score_rank``);
* blocks past the row's ``valid`` ones and padding rank ``INT_MIN`` and are cut by the count.

The emission puts full blocks first in selection order and the row's own (tail) block last: a
second, ``KP``-wide sort whose tail key ranks below every other selection. Then the pages are
looked up in the block table and the context length computed.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import triton
import triton.language as tl

from jax_mxfp4._src.gpu import launch as launcher
from jax_mxfp4._src.triton import triton_call
from jax_mxfp4._src.triton.mxfp4 import PAGE_TOKENS  # tokens per block

INT_MIN = tl.constexpr(-2147483648)
NEG_INF_RANK = tl.constexpr(-2139095042)  # reference.select_blocks.NEG_INF_KEY
FORCED_RANK = tl.constexpr(2147483647)  # above every score's rank (+inf: 0x7F800000)
TAIL_RANK = tl.constexpr(-2147483647)  # INT_MIN + 1: below every score rank, above the cut
LOW_WORD = tl.constexpr(0xFFFFFFFF)


@triton.jit
def _rank(x):
    """int32 ranks in the selection order of scores ``x`` (reference ``score_rank``): the
    order-preserving bit patterns, ``-inf`` one below its own, which NaN takes."""
    bits = x.to(tl.int32, bitcast=True)
    rank = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
    rank = tl.where(x == float("-inf"), NEG_INF_RANK, rank)
    return tl.where(x != x, NEG_INF_RANK + 1, rank)


@triton.jit
def _key(rank, block, NBP: tl.constexpr):
    """int64 keys whose descending order is ``rank`` descending, then ``block`` ascending."""
    return (rank.to(tl.int64) << 32) | (NBP - 1 - block).to(tl.int64)


@triton.jit
def _block(key, NBP: tl.constexpr):
    """The block of a :func:`_key`."""
    return NBP - 1 - (key & LOW_WORD).to(tl.int32)


@triton.jit
def select_blocks_kernel(scores_ptr, table_ptr, pos_ptr, req_ptr, ids_ptr, pages_ptr, ctx_ptr,
                         T, B, W, NB, init_blocks, local_blocks, H: tl.constexpr,
                         NBP: tl.constexpr, TOPK: tl.constexpr, KP: tl.constexpr,
                         ROWS: tl.constexpr):
    """scores ``f32[H, T, NB]``, table ``s32[B, W]``, positions/requests ``s32[T]`` ->
    ids ``s32[H, T, TOPK]``, pages ``s32[T, H, TOPK]``, context ``s32[T, H]``. Grid
    ``(cdiv(T, ROWS), H)``; ``NBP >= max(NB, KP)`` and ``KP >= TOPK`` are powers of two."""
    row = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    h = tl.program_id(1)
    in_call = row < T
    pos = tl.load(pos_ptr + row, mask=in_call, other=-1)
    req = tl.load(req_ptr + row, mask=in_call, other=-1)
    live = (pos >= 0) & (req >= 0) & (req < B)
    pos = tl.where(live, pos, -1)
    valid_1d = tl.where(pos >= 0, tl.minimum(pos // PAGE_TOKENS + 1, NB), 0)
    n_1d = tl.minimum(valid_1d, TOPK)  # the row's selections
    valid = valid_1d[:, None]
    init = tl.minimum(valid, init_blocks)
    first_local = tl.maximum(valid - local_blocks, init)
    j = tl.arange(0, NBP)[None, :]
    score_row = (h.to(tl.int64) * T + row) * NB
    s = tl.load(scores_ptr + score_row[:, None] + j, mask=in_call[:, None] & (j < NB), other=0.0)
    forced = (j < init) | ((j >= first_local) & (j < valid))
    rank = tl.where(forced, FORCED_RANK,
                    tl.where((j >= init) & (j < first_local), _rank(s), INT_MIN))
    best = tl.topk(_key(rank, j, NBP), KP)  # [ROWS, KP], selection order
    k = tl.arange(0, KP)[None, :]
    n = n_1d[:, None]
    ids = tl.where(k < n, _block(best, NBP), -1)
    id_row = (h.to(tl.int64) * T + row) * TOPK
    tl.store(ids_ptr + id_row[:, None] + k, ids, mask=in_call[:, None] & (k < TOPK))
    # Attention order: the tail (the row's own block) moves behind the other selections.
    self_block = tl.where(pos >= 0, pos // PAGE_TOKENS, -2)[:, None]
    is_tail = (ids == self_block) & (ids >= 0)
    has_tail = tl.max(is_tail.to(tl.int32), axis=1) > 0
    order = tl.where(k < n, tl.where(is_tail, TAIL_RANK, best >> 32), INT_MIN)
    ordered = tl.where(k < n, _block(tl.sort(_key(order, ids, NBP), descending=True), NBP), -1)
    safe_req = tl.minimum(tl.maximum(req, 0), B - 1)[:, None]
    page = tl.load(table_ptr + safe_req.to(tl.int64) * W + tl.maximum(ordered, 0),
                   mask=ordered >= 0, other=0)
    out_row = (row.to(tl.int64) * H + h) * TOPK
    tl.store(pages_ptr + out_row[:, None] + k, page, mask=in_call[:, None] & (k < TOPK))
    tail_tokens = pos % PAGE_TOKENS + 1
    # min(n * 128, pos + 1), written so that pos = INT32_MAX does not wrap.
    context = tl.where(has_tail, (n_1d - 1) * PAGE_TOKENS + tail_tokens,
                       tl.minimum(n_1d * PAGE_TOKENS - 1, pos) + 1)
    tl.store(ctx_ptr + row.to(tl.int64) * H + h, tl.maximum(context, 0), mask=in_call)


def padded(n: int) -> int:
    return max(16, triton.next_power_of_2(max(1, n)))


@dataclasses.dataclass(frozen=True)
class Plan:
    """A launch of :func:`select_blocks_kernel` for a call's static shapes."""

    rows_per_program: int  # ROWS
    blocks: int  # NBP: the row's blocks, padded to a power of two and to at least KP
    selections: int  # KP: TOPK padded to a power of two
    num_warps: int


TILE_ELEMENTS = 1024
"""Keys one program sorts, ``ROWS * NBP``: short rows are packed until a program holds this
many, a longer row takes a program of its own."""

ROW_WARPS = 8
"""Warps of a program that holds one full-tile row: its latency is the row's (a decode step
waits for it). Programs of several shorter rows take one warp per 256 keys, at most 4. Both
were the fastest on the H200, for 4096 rows of 256 blocks and for 32 rows of 1024
(``bench/gpu_diagnose.py --select-variants``; bench/history/2026-12-01.md, third session,
"Rows per program and warps")."""


def plan(num_rows: int, num_blocks: int, topk: int) -> Plan:
    """Rows per program and warps from the static shapes: the selection of a row never depends
    on them (each row is its own network), so neither do its bits."""
    selections = padded(topk)
    blocks = max(padded(num_blocks), selections)
    rows = max(1, min(TILE_ELEMENTS // blocks, triton.next_power_of_2(max(1, num_rows))))
    keys = rows * blocks
    warps = ROW_WARPS if keys >= TILE_ELEMENTS and rows == 1 else max(1, min(4, keys // 256))
    return Plan(rows, blocks, selections, num_warps=warps)


# --- lowering (covers / lower: dispatch.lowering.KernelModule) ------------------------------------

_INT32_MAX = 2**31 - 1


def available(target, config) -> str | None:
    return triton_call.launcher_problem(target)


def covers(call) -> str | None:
    return None  # every call of the operation


def kernel_name(call) -> str:
    return "select_blocks_kernel"


def lower(ctx, call, scores, table, positions, requests):
    """One program per ``plan().rows_per_program`` rows of one head; the counts beyond int32
    mean "every block" anyway."""
    heads, rows, num_blocks = call.avals_in[0].shape
    num_requests, width = call.avals_in[1].shape
    topk = call.params["topk"]
    layout = plan(rows, num_blocks, topk)
    programs = -(-rows // layout.rows_per_program)
    launch = triton_call.launch(
        select_blocks_kernel, call.target,
        grid=(programs, heads, 1) if rows and heads else (0, 1, 1),
        buffers=("scores_ptr", "table_ptr", "pos_ptr", "req_ptr", "ids_ptr", "pages_ptr",
                 "ctx_ptr"),
        avals=(*call.avals_in, *call.avals_out),
        scalars={"T": np.int32(rows), "B": np.int32(num_requests), "W": np.int32(width),
                 "NB": np.int32(num_blocks),
                 "init_blocks": np.int32(min(call.params["init_blocks"], _INT32_MAX)),
                 "local_blocks": np.int32(min(call.params["local_blocks"], _INT32_MAX))},
        constants={"H": heads, "NBP": layout.blocks, "TOPK": topk, "KP": layout.selections,
                   "ROWS": layout.rows_per_program},
        num_warps=layout.num_warps,
    )
    return launcher.emit(ctx, launch, [scores, table, positions, requests], call.avals_in,
                         call.avals_out)
