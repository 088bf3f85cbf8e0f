"""The ``index_scores`` lowering on GPUs (SPEC §4, §4.1, §5): the tiling, and which kernel
takes a call.

The tiling (decode-shaped: few rows per request, one block per program, group dots, a single
row scored on the CUDA cores, in exact integer byte dots where its query is e4m3-exact:
``row_dot``; prefill-shaped: up to 128 dot rows per tile, folded keys, up to
eight blocks per program, the next block's page in flight while one is scored) is chosen from
static shapes by :func:`plan`, for the Triton kernel ``index_scores_triton.index_scores_kernel``.
On CUDA, decode tiles of 2 to 8 dot rows take the Gluon kernel
``index_rows_gluon.index_rows_kernel`` by default (a page's tokens as the MMA's M), and on
sm_90 prefill-shaped tiles of fp16 dots ``index_prefill_gluon.index_prefill_kernel`` (128-row
warpgroup-MMA tiles, two programs per SM).
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np
import triton
import triton.language as tl

from jax_mxfp4._src.core.scaling import folded_score_scale
from jax_mxfp4._src.core.targets import CUDA
from jax_mxfp4._src.gpu import launch as launcher
from jax_mxfp4._src.ops.index_scores.triton_kernel import index_scores_kernel
from jax_mxfp4._src.triton import triton_call


@dataclasses.dataclass(frozen=True)
class Plan:
    rows: int  # query rows per tile
    m: int  # dot rows (rows * heads, padded to >= 16)
    blocks: int  # blocks per program
    grid: tuple[int, int, int]
    num_warps: int
    one_row: bool  # one dot row per tile: CUDA-core scoring
    fold: bool  # scale groups folded into the keys: one K = 128 dot per block
    max_registers: int | None = None  # per thread; None: the compiler's choice

    def with_blocks(self, blocks: int, num_blocks: int) -> Plan:
        """This tiling with ``blocks`` blocks per program over ``num_blocks`` blocks (the
        tests and benchmarks force a walk the plan would not pick for their small grids)."""
        return dataclasses.replace(self, blocks=blocks,
                                   grid=(self.grid[0], triton.cdiv(num_blocks, blocks), 1))


DECODE_TILE_REGISTERS = 96
"""Registers per thread of a decode-shaped tensor-core tile (16 dot rows, 4 warps) at most:
five programs per SM instead of the four its 118 allow (16 bytes spilled). Measured in
bench/history/2026-12-01.md, sixth session, "Registers per thread, capped": 65.5 against 68.8
us at b8 S4 128K, 65.8 against 69.3 at b32 S8 32K; a cap of 80 (six programs, 48 bytes
spilled) gained less (118 registers uncapped: commit ``a18cc00``, which set the cap)."""


ONE_ROW_PAIRS = (12, 70)
"""One-row tiles take two blocks per program (the second block's words loaded while the first is
scored) where the grid has from ``ONE_ROW_PAIRS[0]`` up to (not including) ``ONE_ROW_PAIRS[1]``
blocks per SM, one block elsewhere; every one-row program is one warp. Measured on the H200 over
8K-512K contexts and 1-128 requests (bench/history/2026-12-04.md, twenty-third session, "The
one-row (S = 1) plan, re-measured"): one-block programs lose a step of time with every few
hundred more programs until the grid is large enough for its waves to overlap; below the range a
program's second block is serial time; two warps a program were slower everywhere. A row's
scores do not depend on the choice: each thread holds the same four words of a token's scale
group and the same four groups of a token whatever the blocks per program, so every sum runs in
the same order (``tests/gpu``'s batch invariance checks it across both ends)."""


def one_row_blocks(row_tiles: int, num_blocks: int, num_sms: int) -> int:
    """Blocks per one-row program (:data:`ONE_ROW_PAIRS`)."""
    low, high = ONE_ROW_PAIRS
    return 2 if low * num_sms <= row_tiles * num_blocks < high * num_sms else 1


TILE_DOT_ROWS_MAX = 128
"""Dot rows (query rows times heads) of a tile at most: a prefill tile's warpgroup dots, and
``index_prefill_gluon.TILE_ROWS``, which takes such a tile whole."""


TILE_BLOCKS_MAX = 8
"""Blocks per program of a prefill-shaped tile at most: its query tile is loaded once for
them, and its walk keeps the next block's page in flight (bench/history/2026-12-01.md, fifth
session, "Prefill tiles: the next block's page in flight", the cap table: 8 against 4
measured 1.04-1.11x faster over the prefill cells, 16 no better than 8 except on the
32768-row chunks)."""


def walk_blocks(row_tiles: int, num_blocks: int, num_sms: int, most: int,
                programs_per_sm: int) -> int:
    """Blocks per program of a walk over consecutive blocks: ``most``, fewer where the grid
    would then give an SM under ``programs_per_sm`` programs (small contexts), and enough to
    keep the grid's y within 65535. A block's scores do not depend on it."""
    blocks = max(1, min(most, (row_tiles * num_blocks) // (programs_per_sm * num_sms)))
    return max(blocks, triton.cdiv(num_blocks, 65535))


def plan(num_rows: int, num_heads: int, num_requests: int, num_blocks: int,
         num_sms: int) -> Plan:
    """Tiling from static shapes: rows per tile follow rows per request (``T // B``: the
    decode depth S, or a prefill chunk), capped at 128 dot rows.

    A tile of one dot row (S = 1, H = 1: the common decode step) is scored on the CUDA cores:
    a 16-row tensor-core tile would be 15/16 padding. Decode-shaped tiles (under 64 dot rows)
    take one block per program (tens of thousands of small programs, none waiting on a page
    for another block) and four group dots, which measured faster than folded keys there;
    one-row tiles one or two blocks on one warp (:func:`one_row_blocks`).
    Prefill-shaped tiles (64 dot rows and more, warpgroup dots) take folded keys, one
    accumulator, which lets a tile hold 128 rows (four rescaled group dots spilled there), and
    up to :data:`TILE_BLOCKS_MAX` blocks per program, reusing the loaded query tile and
    loading each block's page while the one before is scored, while the grid keeps two waves.
    16-row tiles are capped at :data:`DECODE_TILE_REGISTERS` registers per thread. (On CUDA,
    tiles of 2 to 8 dot rows take ``index_rows_gluon`` by default instead: :func:`_rows_tile`,
    with :func:`rows_tile_blocks` blocks per program; on sm_90, prefill tiles of fp16 dots
    take ``index_prefill_gluon``: :func:`_prefill_tile`, :func:`prefill_tile_blocks`.)
    The measurements behind each choice: the docstrings of the constants below, each citing
    the session of bench/history/ that measured it.
    """
    per_request = max(1, num_rows // max(1, num_requests))
    rows = min(triton.next_power_of_2(per_request), max(1, TILE_DOT_ROWS_MAX // num_heads))
    m = max(16, triton.next_power_of_2(rows * num_heads))
    row_tiles = triton.cdiv(max(num_rows, 1), rows)
    blocks = 1
    if m >= 64:
        blocks = walk_blocks(row_tiles, num_blocks, num_sms, min(TILE_BLOCKS_MAX, num_blocks), 2)
    one_row = rows * num_heads == 1
    warps = 8 if m >= 64 else 4
    if one_row:
        blocks, warps = one_row_blocks(row_tiles, num_blocks, num_sms), 1
    blocks = max(blocks, triton.cdiv(num_blocks, 65535))  # the grid's y limit
    grid = (row_tiles, triton.cdiv(max(num_blocks, 1), blocks), 1)
    fold = m >= 64
    registers = DECODE_TILE_REGISTERS if m == 16 and not one_row else None
    return Plan(rows, m, blocks, grid, warps, one_row, fold, registers)


# --- lowering (covers / lower: dispatch.lowering.KernelModule) ------------------------------------

_DOT_DTYPES = {"fp16": tl.float16, "bf16": tl.bfloat16}


def _dot(call) -> str:
    """The dot operand type: e4m3-exact queries take fp16 dots (exact for e2m1 x e4m3); a
    bf16 query kept as is (``q_round="none"``) takes bf16 dots."""
    q_fp8 = jnp.dtype(call.avals_in[0].dtype) == jnp.float8_e4m3fn
    return "fp16" if q_fp8 or call.params["q_round"] == "e4m3" else "bf16"


def available(target, config) -> str | None:
    return triton_call.launcher_problem(target)


def covers(call) -> str | None:
    return None  # every call of the operation


def kernel_name(call) -> str:
    q_aval, _, table_aval = call.avals_in[:3]
    dot, num_blocks = _dot(call), call.params["num_blocks"]
    layout = plan(q_aval.shape[0], q_aval.shape[1], table_aval.shape[0], num_blocks,
                  call.target.units)
    if _prefill_tile(call, layout, dot):
        return f"index_prefill_kernel[{dot} dots]"
    if _rows_tile(call, layout, dot):
        return f"index_rows_kernel[{dot} dots]"
    return f"index_scores_kernel[{dot} dots]"


def _rows_tile(call, layout: Plan, dot: str) -> bool:
    """Whether the call takes ``index_rows_gluon.index_rows_kernel`` (a page's tokens as the
    MMA's M, the tile's 2 to 8 dot rows as its N; measured 1.6x faster than the 16-row tile at
    S = 4-8, and slower than the CUDA-core one-row tile at S = 1): by default
    (``cuda_kernels="auto"``), fp16 dots on CUDA sm_80+."""
    heads = call.avals_in[0].shape[1]
    return (call.config.cuda_kernels == "auto" and triton_call.gluon_runs(call)
            and dot == "fp16" and 2 <= layout.rows * heads <= 8)


def _prefill_tile(call, layout: Plan, dot: str) -> bool:
    """Whether the call takes ``index_prefill_gluon.index_prefill_kernel`` (128-row tiles,
    two warpgroups' MMAs on shared-memory operands, two programs per SM): by default
    (``cuda_kernels="auto"``), prefill-shaped tiles (those the Triton kernel folds) of fp16
    dots on CUDA sm_90 and later (``wgmma``)."""
    arch = call.target.arch
    return (call.config.cuda_kernels == "auto" and triton_call.gluon_runs(call)
            and int(arch) >= 90 and dot == "fp16" and layout.fold)


PREFILL_TILE_BLOCKS_MAX = 8
"""Blocks per ``index_prefill_kernel`` program at most (its query tile loaded once for them,
the next page in flight), as for the Triton prefill tile (:data:`TILE_BLOCKS_MAX`)."""


PREFILL_TILE_REGISTERS = 128
"""Registers per thread of an ``index_prefill_kernel`` program at most: two programs (16
warps) per SM. At this cap the compiler keeps the rows' 64-bit output addresses (16 bytes)
in local memory and loads them back once a block, after the block's dots, and its walk
across requests also its 64-bit block counter and page address (``tests/test_gpu_compile.py``
holds it to that); 168 registers, spill-free, leave one program per SM. Keeping the blocks'
maxima in shared memory instead, stored after the walk (no spill in a request's walk),
measured 1.03-1.13x slower (bench/history/2026-12-02.md, thirteenth session, "Maxima in
shared-memory slots"). (With one warpgroup of 64 rows, three programs at 168 registers were
1.08-1.16x faster than four at 128 with 88 bytes spilled inside the walk: same file, twelfth
session, "The prefill tile in Gluon".)"""


PREFILL_GRID_PROGRAMS_PER_SM = 2
"""Programs per SM the prefill tile's grid keeps at least where each tile holds one
request's rows: one wave of the two resident programs, fewer blocks per program only on small
grids. A program's start (its dependent metadata, page-id and page loads, its query tile) costs
more than a block, so a longer walk in one wave beats shorter ones in two
(bench/history/2026-12-03.md, fifteenth session, "The grid, once a block got cheaper": b1 q4096
ctx 8K 28.6 us against 31.8 with 4 and 32.1 with 3; b4 q512 ctx 8K 20.4 against 22.7 with 4,
though 19.3 with 3; the large cells, 8 blocks either way, unchanged). Those timings predate the
prefill tile's reversed launch order (same file, sixteenth session), so part of what they
charged to a program's start was working programs waiting behind empty ones; the choice was not
timed again since."""

PREFILL_GRID_PROGRAMS_PER_SM_ACROSS = 4
"""The same where tiles hold rows of several requests (``T // B`` not a multiple of the
tile's rows): their walk loads each request's page when it scores it, with nothing in
flight, so shorter walks in more waves are faster (bench/history/2026-12-03.md, fifteenth
session, "The grid, once a block got cheaper": b32 q96 ctx 8K 1.2x slower at 2 than at 4)."""


def prefill_tile_blocks(row_tiles: int, num_blocks: int, num_sms: int,
                        one_request_tiles: bool = True) -> int:
    """Blocks per ``index_prefill_kernel`` program (:func:`walk_blocks`): up to
    :data:`PREFILL_TILE_BLOCKS_MAX` while the grid keeps :data:`PREFILL_GRID_PROGRAMS_PER_SM`
    programs per SM (:data:`PREFILL_GRID_PROGRAMS_PER_SM_ACROSS` where tiles hold rows of
    several requests)."""
    per_sm = (PREFILL_GRID_PROGRAMS_PER_SM if one_request_tiles
              else PREFILL_GRID_PROGRAMS_PER_SM_ACROSS)
    return walk_blocks(row_tiles, num_blocks, num_sms, min(PREFILL_TILE_BLOCKS_MAX, num_blocks),
                       per_sm)


def _prefill_tile_launch(call, layout: Plan, num_blocks: int, scalars: dict, constants: dict):
    """``index_prefill_gluon.index_prefill_kernel`` on :func:`plan`'s row tiles (folded, at
    most 128 dot rows: the kernel's :data:`index_prefill_gluon.TILE_ROWS`) and
    :func:`prefill_tile_blocks` blocks per program."""
    from jax_mxfp4._src.ops.index_scores import gluon_prefill as index_prefill_gluon

    heads = call.avals_in[0].shape[1]
    assert layout.rows * heads <= index_prefill_gluon.TILE_ROWS, (layout, heads)
    rows, requests = call.avals_in[0].shape[0], call.avals_in[2].shape[0]
    one_request_tiles = rows % requests == 0 and (rows // requests) % layout.rows == 0
    blocks = prefill_tile_blocks(layout.grid[0], num_blocks, call.target.units,
                                 one_request_tiles)
    grid = (layout.grid[0], triton.cdiv(num_blocks, blocks), 1)
    shared = {k: constants[k] for k in ("H", "ROWS", "ROUND_Q")}
    return _launch(call, index_prefill_gluon.index_prefill_kernel, grid, scalars,
                   {**shared, "BLOCKS": blocks}, index_prefill_gluon.WARPS,
                   PREFILL_TILE_REGISTERS)


ROWS_TILE_BLOCKS_MAX = 8
"""Blocks per ``index_rows_kernel`` program at most (its query loaded once for them, the next
page in flight): bench/history/2026-12-01.md, sixth session, "Decode tiles with the page's
tokens as the MMA's M", 1 / 2 / 4 / 8 / 16 blocks at b8 S4 128K 58.2 / 53.0 / 50.4 / 41.6 /
40.9 us (8 and 16 with the page in flight)."""


ROWS_TILE_REGISTERS = 96
"""Registers per thread of an ``index_rows_kernel`` program at most: five programs per SM
instead of the four its 108 allow, with nothing spilled (bench/history/2026-12-02.md,
eleventh session, ``rows-defer96``)."""


def rows_tile_blocks(row_tiles: int, num_blocks: int, num_sms: int) -> int:
    """Blocks per ``index_rows_kernel`` program (:func:`walk_blocks`): up to
    :data:`ROWS_TILE_BLOCKS_MAX` while the grid keeps four programs per SM."""
    return walk_blocks(row_tiles, num_blocks, num_sms, ROWS_TILE_BLOCKS_MAX, 4)


def _launch(call, kernel, grid, scalars: dict, constants: dict, num_warps: int,
            max_registers: int | None = None):
    """The launch of one of the index kernels, which all take the same buffers (the call's
    operands, then its result) and the scalars of :func:`lower`."""
    return triton_call.launch(
        kernel, call.target, grid=grid,
        buffers=("q_ptr", "pool_ptr", "table_ptr", "pos_ptr", "req_ptr", "out_ptr"),
        avals=(*call.avals_in, *call.avals_out), scalars=scalars, constants=constants,
        num_warps=num_warps, max_registers=max_registers)


def _rows_tile_launch(call, layout: Plan, num_blocks: int, scalars: dict, constants: dict):
    """``index_rows_gluon.index_rows_kernel`` on :func:`rows_tile_blocks` blocks per program,
    with the Triton kernel's scalars and the constants it shares."""
    from jax_mxfp4._src.ops.index_scores import gluon_rows as index_rows_gluon

    blocks = rows_tile_blocks(layout.grid[0], num_blocks, call.target.units)
    grid = (layout.grid[0], triton.cdiv(num_blocks, blocks), 1)
    shared = {k: constants[k] for k in ("H", "ROWS", "ROUND_Q")}
    return _launch(call, index_rows_gluon.index_rows_kernel, grid, scalars,
                   {**shared, "BLOCKS": blocks}, index_rows_gluon.WARPS, ROWS_TILE_REGISTERS)


def int_dots(target, layout: Plan, constants: dict) -> bool:
    """Whether a one-row tile takes integer dots (``row_dot``): its query is e4m3-exact and
    the target is CUDA, where they are ``dp4a`` in inline PTX. Their plain-Triton form (what
    Triton's interpreter runs in the tests) costs several times the fp32 route's instructions,
    so ROCm keeps the fp32 route."""
    exact = constants["ROUND_Q"] or constants["Q_IS_FP8"]
    return layout.one_row and exact and target.device == CUDA


def lower(ctx, call, q, pool, table, positions, requests):
    q_aval, pool_aval, table_aval = call.avals_in[:3]
    rows, heads = q_aval.shape[0], q_aval.shape[1]
    num_requests, width = table_aval.shape
    num_blocks = call.params["num_blocks"]
    q_fp8 = jnp.dtype(q_aval.dtype) == jnp.float8_e4m3fn
    dot = _dot(call)
    layout = plan(rows, heads, num_requests, num_blocks, call.target.units)
    scalars = {"T": np.int32(rows), "B": np.int32(num_requests), "W": np.int32(width),
               "P": np.int32(pool_aval.shape[0]), "NB": np.int32(num_blocks),
               "score_scale": folded_score_scale(call.params["sm_scale"])}
    constants = {"H": heads, "ROWS": layout.rows, "M": layout.m, "BLOCKS": layout.blocks,
                 "Q_IS_FP8": q_fp8, "ROUND_Q": (not q_fp8) and dot != "bf16",
                 "DOT_DTYPE": _DOT_DTYPES[dot],
                 "ONE_ROW": layout.one_row, "FOLD": layout.fold}
    constants["INT_DOTS"] = int_dots(call.target, layout, constants)
    empty = not (rows and num_blocks and num_requests)
    if _prefill_tile(call, layout, dot) and not empty:
        launch = _prefill_tile_launch(call, layout, num_blocks, scalars, constants)
    elif _rows_tile(call, layout, dot) and not empty:
        launch = _rows_tile_launch(call, layout, num_blocks, scalars, constants)
    else:
        launch = _launch(call, index_scores_kernel, (0, 1, 1) if empty else layout.grid,
                         scalars, constants, layout.num_warps, layout.max_registers)
    return launcher.emit(ctx, launch, [q, pool, table, positions, requests], call.avals_in,
                         call.avals_out)
