"""Triton kernel: block scores of query rows over the MXFP4 index cache (SPEC §4, §5, §15.3).

One program scores a tile of ``ROWS`` consecutive rows (all ``H`` index heads: ``M = ROWS * H``
dot rows, padded to 16) against ``BLOCKS`` consecutive 128-token blocks. Per block it loads the
page of each request in the tile once (decode tiles hold one request's ``S`` rows; prefill
tiles one request's chunk, or the ends of two) and takes tensor-core dots: four ``K = 32``
dots, one per scale group (``mxfp4.page_logits``), or one ``K = 128`` dot on keys with the
groups' scales folded in (``mxfp4.folded_page_logits``). Every output element is written:
``-inf`` where a row has no live token in the block, NaN where a live token's logit is not
finite (a NaN key or query, an fp32 overflow: SPEC §15.18).

The tiling (decode-shaped: few rows per request, one block per program, group dots, a single
row scored on the CUDA cores, in exact integer byte dots where its query is e4m3-exact:
``row_dot``; prefill-shaped: up to 128 dot rows per tile, folded keys, up to
eight blocks per program, the next block's page in flight while one is scored) is chosen from
static shapes by :func:`plan`. On CUDA, decode tiles of 2 to 8 dot rows take the Gluon kernel
``index_rows_gluon.index_rows_kernel`` by default (a page's tokens as the MMA's M), and on
sm_90 prefill-shaped tiles of fp16 dots ``index_prefill_gluon.index_prefill_kernel`` (128-row
warpgroup-MMA tiles, two programs per SM); under ``cuda_kernels="gluon"`` one-row tiles of an
e4m3-exact query take ``index_row_gluon.index_row_kernel`` (the same integer dots on the int8
tensor cores).
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np
import triton
import triton.language as tl

from jax_mxfp4.gpu import launch as launcher
from jax_mxfp4.gpu import triton_call
from jax_mxfp4.gpu.kernels import mxfp4, row_dot
from jax_mxfp4.scaling import folded_score_scale
from jax_mxfp4.targets import CUDA

PROPAGATE = tl.constexpr(tl.PropagateNan.ALL)  # a NaN score survives the maxima across requests


@triton.jit
def _query_columns(q_ptr, row, head, row_ok, first: tl.constexpr, WIDTH: tl.constexpr,
                   H: tl.constexpr, ROUND_Q: tl.constexpr, DOT_DTYPE: tl.constexpr,
                   PTX: tl.constexpr):
    """Columns ``first .. first + WIDTH - 1`` of the query rows as a dot operand ``[M,
    WIDTH]``: a bf16 query rounded to e4m3 (``ROUND_Q``), else (an e4m3 query, or a bf16 one
    kept as is for bf16 dots) converted exactly."""
    c = first + tl.arange(0, WIDTH)
    ptrs = q_ptr + (row * H + head)[:, None].to(tl.int64) * 128 + c[None, :]
    x = tl.load(ptrs, mask=row_ok[:, None], other=0.0)
    if ROUND_Q:
        return mxfp4.round_e4m3(x.to(tl.float32), PTX).to(DOT_DTYPE)
    return x.to(DOT_DTYPE)


@triton.jit
def _query_column(q_ptr, row, row_ok, j: tl.constexpr, ROUND_Q: tl.constexpr,
                  PTX: tl.constexpr):
    """Elements ``8w + WORD_ORDER[j]`` (``w`` = 0..15) of row ``row``'s query (one head) as
    fp32 ``[16]``, rounded as the dots would round them."""
    e = tl.arange(0, 16) * 8 + mxfp4.WORD_ORDER[j]
    x = tl.load(q_ptr + row.to(tl.int64) * 128 + e, mask=row_ok, other=0.0).to(tl.float32)
    return _rounded(x, ROUND_Q, PTX)


@triton.jit
def _rounded(x, ROUND_Q: tl.constexpr, PTX: tl.constexpr):
    """fp32 query values ``x`` rounded to e4m3 where ``ROUND_Q``, as fp32."""
    if ROUND_Q:
        x = mxfp4.round_e4m3(x, PTX).to(tl.float32)
    return x


@triton.jit
def _bf16_halves(pairs, ROUND_Q: tl.constexpr, PTX: tl.constexpr):
    """The low and the high bf16 of each uint32 of ``pairs`` as fp32 (rounded as
    :func:`_rounded`): a bf16 is the high half of its fp32."""
    low = (pairs << 16).to(tl.float32, bitcast=True)
    high = (pairs & 0xFFFF0000).to(tl.float32, bitcast=True)
    return _rounded(low, ROUND_Q, PTX), _rounded(high, ROUND_Q, PTX)


@triton.jit
def _query_row(q_ptr, row, row_ok, ROUND_Q: tl.constexpr, PTX: tl.constexpr):
    """The query of row ``row`` (one head) as ``mxfp4.row_logits`` takes it: eight fp32
    ``[16]``, one per position of a code word's elements (``WORD_ORDER``). A bf16 query is
    loaded as ``[16 words, 4]`` element pairs (a thread's 32 elements in 16-byte loads) and
    split in registers; others element by element (:func:`_query_column`). Every program
    loads and rounds it, so this prologue is paid once per two blocks."""
    if q_ptr.dtype.element_ty == tl.bfloat16:
        pair = tl.arange(0, 16)[:, None] * 4 + tl.arange(0, 4)[None, :]
        first = q_ptr.to(tl.pointer_type(tl.uint32)) + row.to(tl.int64) * 64
        pairs = tl.load(first + pair, mask=row_ok, other=0)  # pair p: elements 8w + 2p, + 1
        even, odd = tl.split(tl.reshape(pairs, (16, 2, 2)))  # pairs (0, 2) and (1, 3)
        p0, p2 = tl.split(even)
        p1, p3 = tl.split(odd)
        e0, e1 = _bf16_halves(p0, ROUND_Q, PTX)
        e2, e3 = _bf16_halves(p1, ROUND_Q, PTX)
        e4, e5 = _bf16_halves(p2, ROUND_Q, PTX)
        e6, e7 = _bf16_halves(p3, ROUND_Q, PTX)
        return e0, e4, e2, e6, e1, e5, e3, e7  # WORD_ORDER
    return (_query_column(q_ptr, row, row_ok, 0, ROUND_Q, PTX),
            _query_column(q_ptr, row, row_ok, 1, ROUND_Q, PTX),
            _query_column(q_ptr, row, row_ok, 2, ROUND_Q, PTX),
            _query_column(q_ptr, row, row_ok, 3, ROUND_Q, PTX),
            _query_column(q_ptr, row, row_ok, 4, ROUND_Q, PTX),
            _query_column(q_ptr, row, row_ok, 5, ROUND_Q, PTX),
            _query_column(q_ptr, row, row_ok, 6, ROUND_Q, PTX),
            _query_column(q_ptr, row, row_ok, 7, ROUND_Q, PTX))


@triton.jit
def tile_row_ids(m, first_row, T, H: tl.constexpr, ROWS: tl.constexpr):
    """The query row and the head of each of the dot rows ``m`` (any layout) of the tile whose
    first query row is ``first_row``, and whether it exists (:func:`tile_rows` without its
    loads: what a tile's query loads need)."""
    row = first_row + m // H
    return row, m % H, (m < ROWS * H) & (row < T)


@triton.jit
def tile_rows(m, first_row, pos_ptr, req_ptr, T, B, H: tl.constexpr, ROWS: tl.constexpr):
    """The dot rows ``m`` (int32, any layout: the Gluon tiles call it too) of the tile whose
    first query row is ``first_row``: each one's query row and head, whether it exists, its
    position and request, and whether it is live (a position >= 0, a request in ``[0, B)``;
    SPEC §15.3). The one rule every index tile applies to its rows' metadata."""
    row, head, row_ok = tile_row_ids(m, first_row, T, H, ROWS)
    pos = tl.load(pos_ptr + row, mask=row_ok, other=-1)
    req = tl.load(req_ptr + row, mask=row_ok, other=-1)
    live = row_ok & (pos >= 0) & (req >= 0) & (req < B)
    return row, head, row_ok, pos, req, live


@triton.jit
def _block_page(pool_ptr, table_ptr, req, reach, j, NB, W, P):
    """Block ``j``'s page of request ``req``: its address and whether it is scored (the block
    exists, a row reaches it: ``reach`` is the rows' largest position, -1 where none is live;
    the page id lies in ``[0, P)``). The one rule of the one-row and the prefetching walks."""
    reached = (j < NB) & (j * 128 <= reach)
    page = tl.load(table_ptr + tl.cast(req, tl.int64) * W + j, mask=reached, other=-1)
    ok = reached & (page >= 0) & (page < P)
    return pool_ptr + tl.where(ok, page, 0).to(tl.int64) * mxfp4.PAGE_BYTES, ok


@triton.jit
def _row_block_max(q_row, words, scales, ok, pos0, j, INT_DOTS: tl.constexpr,
                   PTX: tl.constexpr):
    """Row 0's max logit over block ``j`` from its loaded page (-inf where not ``ok``);
    ``q_row``: :func:`_query_row`, or its ``row_dot.query_slices`` (``INT_DOTS``)."""
    if INT_DOTS:
        dots, smax = row_dot.row_logits(q_row[0], words, scales, PTX)
        dots += q_row[1]  # NaN where the query has a NaN
    else:
        dots, smax = mxfp4.row_logits(q_row, words, scales, PTX)
    tok = j * 128 + tl.arange(0, 128)
    logits = _poison_infinite(mxfp4.mul_scale_pow2(dots, smax, mxfp4.ROW_OFFSET))
    row_max = tl.reduce(tl.where(tok <= pos0, logits, float("-inf")), 0, _max_nan)
    return tl.where(ok, row_max, float("-inf"))


@triton.jit
def _row_blocks(q_row, pool_ptr, table_ptr, out_base, req, pos, live, row_ok, first_block, NB,
                W, P, score_scale, BLOCKS: tl.constexpr, INT_DOTS: tl.constexpr,
                PTX: tl.constexpr):
    """Score blocks ``first_block ..`` (``BLOCKS`` of them) for a tile whose only dot row is
    row 0 (``q_row`` as :func:`_row_block_max` takes it), and store them.
    Software-pipelined: block ``j + 1``'s code words are in flight while block ``j`` is
    computed, its scale bytes are loaded after that (their layout change waits for them, so
    they are not loaded ahead of arithmetic)."""
    m = tl.arange(0, req.shape[0])
    req0 = tl.max(tl.where(m == 0, req, -1), axis=0)
    pos0 = tl.max(tl.where((m == 0) & live, pos, -1), axis=0)
    page_ptr, ok = _block_page(pool_ptr, table_ptr, req0, pos0, first_block, NB, W, P)
    words = mxfp4.row_words(page_ptr, ok)
    scales = mxfp4.row_scales(page_ptr, ok)
    for jj in tl.static_range(BLOCKS):
        j = first_block + jj
        if jj + 1 < BLOCKS:
            next_ptr, next_ok = _block_page(pool_ptr, table_ptr, req0, pos0, j + 1, NB, W, P)
            next_words = mxfp4.row_words(next_ptr, next_ok)
        row_max = _row_block_max(q_row, words, scales, ok, pos0, j, INT_DOTS, PTX)
        best = tl.where(m == 0, row_max, float("-inf"))
        tl.store(out_base + j, best * score_scale, mask=row_ok & (j < NB))
        if jj + 1 < BLOCKS:
            scales = mxfp4.row_scales(next_ptr, next_ok)
            words, ok = next_words, next_ok


@triton.jit
def _max_nan(a, b):
    """``max`` that keeps NaN (the combine function of the NaN-propagating reductions)."""
    return tl.maximum(a, b, propagate_nan=PROPAGATE)


@triton.jit
def _poison_infinite(logits):
    """``logits`` with every infinite element made NaN: a logit that is not finite poisons the
    row that sees it (SPEC §15.18), and a NaN-propagating max then carries it, in the same one
    reduction that takes the maximum. As ``fma(x, x - x, x)``: ``x`` itself for every finite
    ``x`` (``x - x`` is +0, so ``x * 0 + x`` is ``x``, -0 included), NaN for +-inf and NaN; two
    instructions on the FMA pipe instead of a compare and a select on the busier ALU pipe."""
    return tl.fma(logits, logits - logits, logits)


@triton.jit
def _masked_maxima(logits, sel, pos, tok):
    """Max over the tokens ``tok`` (absolute, int32 [128]) each selected row sees (-inf
    elsewhere) of ``logits f32 [M, 128]``; NaN for a row that sees a logit that is not
    finite."""
    ok = sel[:, None] & (tok[None, :] <= pos[:, None])
    return tl.reduce(tl.where(ok, _poison_infinite(logits), float("-inf")), 1, _max_nan)


@triton.jit
def _folded_maxima(q, codes, scales, sel, pos, j, reach, low):
    """Max logits of the selected rows over one page with folded keys
    (:func:`mxfp4.folded_page_logits`, then :func:`folded_row_maxima`: what makes a row NaN,
    SPEC §15.18, is found per row, not per element). ``reach`` and ``low``: the largest and
    the smallest position of the selected rows (the same for every block of a tile:
    :func:`_row_span`), so the whole-block test of block ``j`` takes no reduction."""
    tok = j * 128 + tl.arange(0, 128)
    dots, expo, first_nan = mxfp4.folded_page_logits(q, codes, scales, tok <= reach)
    return folded_row_maxima(dots, expo, j * 128 + first_nan, sel, pos, tok,
                             j * 128 + 127 <= low, q.dtype == tl.float16)


@triton.jit
def folded_row_maxima(dots, expo, first_nan_tok, sel, pos, tok, whole,
                      FINITE_DOTS: tl.constexpr):
    """Max logits ``f32 [M]`` of the selected rows from a page's relative dots ``f32 [M, 128]``
    (``logit = dots * 2**expo``; ``tok [128]``: the tokens' positions), -inf for the other
    rows: the maximum on the relative dots, scaled once. ``whole``: every selected row sees
    the block whole (no token mask). NaN for a row that sees ``first_nan_tok`` (the page's
    first NaN-key token) or a NaN dot, or whose largest ``|logit|`` overflows; that check
    runs only where it can: always unless ``FINITE_DOTS`` (e4m3-exact queries, ``|dots| <=
    128 * 448 * 6 * 2**9``), then only for ``expo > 0``. Shared by the Triton and the Gluon
    prefill tiles."""
    # The token mask is built on the partial-block path only: where both paths used it,
    # the compiler built it ahead of the branch on every block, a third of the Gluon tile's
    # ALU work a block (docs/notes.md, "What the compiler builds ahead of a branch").
    check = True
    if FINITE_DOTS:
        check = expo > 0
    overflow = pos != pos  # all false
    if whole:  # every selected row sees every token: no mask
        best = tl.reduce(dots, 1, _max_nan)
        if check:
            overflow = _overflows(tl.abs(dots), expo)
    else:
        seen = sel[:, None] & (tok[None, :] <= pos[:, None])
        best = tl.reduce(tl.where(seen, dots, float("-inf")), 1, _max_nan)
        if check:
            overflow = _overflows(tl.where(seen, tl.abs(dots), 0.0), expo)
    best = tl.where((pos >= first_nan_tok) | overflow, float("nan"), best)
    return tl.where(sel, mxfp4.mul_pow2(best, expo), float("-inf"))


@triton.jit
def _row_span(sel, pos):
    """The largest and the smallest position of the rows ``sel`` selects (-1 and the largest
    where none is): two reductions across the tile, taken once per tile, not per block."""
    reach = tl.max(tl.where(sel, pos, -1), axis=0)
    return reach, tl.min(tl.where(sel, pos, reach), axis=0)


@triton.jit
def _overflows(magnitudes, expo):
    """Whether a row's largest ``|dot| * 2**expo`` over the tokens it sees is not finite:
    bool [M] from ``magnitudes f32 [M, 128]`` (``|dots|``, 0 where a token is not seen)."""
    return mxfp4.mul_pow2(tl.max(magnitudes, axis=1), expo) == float("inf")


@triton.jit
def _page_maxima(q, q0, q1, q2, q3, codes, scales, sel, pos, j, reach, low,
                 USE_FP8: tl.constexpr, FOLD: tl.constexpr, PTX: tl.constexpr):
    """Max logit of each dot row ``sel`` selects over block ``j``'s tokens from its page as
    :func:`mxfp4.page_bytes` loaded it (-inf for the other rows). ``FOLD``: the query
    tile ``q [M, 128]`` against folded keys (:func:`mxfp4.folded_page_logits`), else the
    groups ``q0 .. q3`` (:func:`mxfp4.page_logits`). ``reach``, ``low``: :func:`_row_span`
    of ``sel`` (folded keys only)."""
    if FOLD:
        best = _folded_maxima(q, codes, scales, sel, pos, j, reach, low)
    else:
        dots, expo = mxfp4.page_logits(q0, q1, q2, q3, codes, scales, USE_FP8, PTX)
        best = _masked_maxima(mxfp4.mul_pow2(dots, expo[None, :]), sel, pos,
                              j * 128 + tl.arange(0, 128))
    return best


@triton.jit
def _tile_maxima(q, q0, q1, q2, q3, pool_ptr, table_ptr, req, pos, live, j, req_r, W, P,
                 USE_FP8: tl.constexpr, FOLD: tl.constexpr, PTX: tl.constexpr):
    """Max logit of each dot row over block ``j`` of request ``req_r`` (-inf elsewhere), the
    page loaded and scored in one step (:func:`_page_maxima`)."""
    page = tl.load(table_ptr + tl.cast(req_r, tl.int64) * W + j)  # req_r: a loop index
    sel = live & (req == req_r)
    best = tl.full(sel.shape, float("-inf"), tl.float32)
    if (page >= 0) & (page < P) & (tl.max(sel.to(tl.int32), axis=0) > 0):
        codes, scales = mxfp4.page_bytes(pool_ptr + page.to(tl.int64) * mxfp4.PAGE_BYTES, True)
        reach, low = _row_span(sel, pos)
        best = _page_maxima(q, q0, q1, q2, q3, codes, scales, sel, pos, j, reach, low,
                            USE_FP8, FOLD, PTX)
    return best


@triton.jit
def _tile_blocks(q, q0, q1, q2, q3, pool_ptr, table_ptr, out_base, req, pos, live, row_ok,
                 req_lo, req_hi, first_block, NB, W, P, reach, score_scale,
                 BLOCKS: tl.constexpr, USE_FP8: tl.constexpr, FOLD: tl.constexpr,
                 PTX: tl.constexpr):
    """Score blocks ``first_block ..`` (``BLOCKS`` of them) for a tile whose live rows belong
    to requests ``req_lo .. req_hi``, and store them: each block's page of each request in
    turn, loaded when it is scored. The decode tiles' walk (one block per program: a
    prefetching walk measured slower there) and prefill tiles' across a chunk's end."""
    for jj in range(BLOCKS):
        j = first_block + jj
        best = tl.full((req.shape[0],), float("-inf"), tl.float32)
        if (j < NB) & (j * 128 <= reach):
            for req_r in range(req_lo, req_hi + 1):
                best = tl.maximum(best, _tile_maxima(q, q0, q1, q2, q3, pool_ptr, table_ptr,
                                                     req, pos, live, j, req_r, W, P, USE_FP8,
                                                     FOLD, PTX), propagate_nan=PROPAGATE)
        tl.store(out_base + j, best * score_scale, mask=row_ok & (j < NB))


@triton.jit
def _prefetching_blocks(q, q0, q1, q2, q3, pool_ptr, table_ptr, out_base, req_r, pos, live,
                        row_ok, first_block, NB, W, P, reach, score_scale,
                        BLOCKS: tl.constexpr, USE_FP8: tl.constexpr, FOLD: tl.constexpr,
                        PTX: tl.constexpr):
    """:func:`_tile_blocks` for a tile whose live rows are all of request ``req_r`` (prefill
    tiles inside a chunk), software-pipelined: block ``j + 1``'s page is in flight while
    block ``j`` is scored. A runtime loop carrying the loaded page (unrolled over 4 blocks,
    the program measured slower: over twice the code, 13.5 K instructions against 6.2 K)."""
    page_ptr, ok = _block_page(pool_ptr, table_ptr, req_r, reach, first_block, NB, W, P)
    codes, scales = mxfp4.page_bytes(page_ptr, ok)
    low = tl.min(tl.where(live, pos, reach), axis=0)  # reach: the live rows' largest position
    for jj in range(BLOCKS):
        j = first_block + jj
        next_ptr, next_ok = _block_page(pool_ptr, table_ptr, req_r, reach, j + 1, NB, W, P)
        next_ok = next_ok & (jj + 1 < BLOCKS)
        next_codes, next_scales = mxfp4.page_bytes(next_ptr, next_ok)
        best = tl.full((pos.shape[0],), float("-inf"), tl.float32)
        if ok:
            best = _page_maxima(q, q0, q1, q2, q3, codes, scales, live, pos, j, reach, low,
                                USE_FP8, FOLD, PTX)
        tl.store(out_base + j, best * score_scale, mask=row_ok & (j < NB))
        codes, scales, ok = next_codes, next_scales, next_ok


@triton.jit
def index_scores_kernel(q_ptr, pool_ptr, table_ptr, pos_ptr, req_ptr, out_ptr, T, B, W, P, NB,
                        score_scale, H: tl.constexpr, ROWS: tl.constexpr, M: tl.constexpr,
                        BLOCKS: tl.constexpr, Q_IS_FP8: tl.constexpr, ROUND_Q: tl.constexpr,
                        USE_FP8: tl.constexpr, DOT_DTYPE: tl.constexpr,
                        ONE_ROW: tl.constexpr, FOLD: tl.constexpr, INT_DOTS: tl.constexpr,
                        PTX: tl.constexpr):
    """``out f32[H, T, NB]``; q ``[T, H, 128]``, pool ``u8[P, 8704]``, table ``s32[B, W]``,
    positions and requests ``s32[T]``. ``ONE_ROW``: tiles of one dot row, scored on the CUDA
    cores (``mxfp4.row_logits``; ``INT_DOTS``: an e4m3-exact query's integer dots,
    ``row_dot.row_logits``). ``FOLD``: 16-bit dots on folded keys
    (``mxfp4.folded_page_logits``), else four group dots (``mxfp4.page_logits``)."""
    tl.static_assert(ROUND_Q or Q_IS_FP8 or not INT_DOTS)  # integer dots need e4m3 values
    first_row = tl.program_id(0) * ROWS
    row, head, row_ok, pos, req, live = tile_rows(tl.arange(0, M), first_row, pos_ptr,
                                                  req_ptr, T, B, H, ROWS)
    if FOLD:
        q = _query_columns(q_ptr, row, head, row_ok, 0, 128, H, ROUND_Q, DOT_DTYPE, PTX)
        q0, q1, q2, q3 = q, q, q, q  # unused
    else:
        q = tl.zeros((M, 128), DOT_DTYPE)  # unused
        q0 = _query_columns(q_ptr, row, head, row_ok, 0, 32, H, ROUND_Q, DOT_DTYPE, PTX)
        q1 = _query_columns(q_ptr, row, head, row_ok, 32, 32, H, ROUND_Q, DOT_DTYPE, PTX)
        q2 = _query_columns(q_ptr, row, head, row_ok, 64, 32, H, ROUND_Q, DOT_DTYPE, PTX)
        q3 = _query_columns(q_ptr, row, head, row_ok, 96, 32, H, ROUND_Q, DOT_DTYPE, PTX)
    reach = tl.max(tl.where(live, pos, -1), axis=0)
    # The tile's requests: one in the common case (rows are request-major), so each block's
    # page is loaded once (in a prefill tile, the next block's while this one is scored).
    req_lo = tl.min(tl.where(live, req, B), axis=0)
    req_hi = tl.max(tl.where(live, req, -1), axis=0)
    out_base = out_ptr + head.to(tl.int64) * T * NB + row.to(tl.int64) * NB
    first_block = tl.program_id(1) * BLOCKS
    if ONE_ROW:
        q_row = _query_row(q_ptr, first_row, first_row < T, ROUND_Q, PTX)
        if INT_DOTS:  # its integer slices and NaN flag
            q_row = row_dot.query_slices(q_row, PTX)
        _row_blocks(q_row, pool_ptr, table_ptr, out_base, req, pos, live, row_ok,
                    first_block, NB, W, P, score_scale, BLOCKS, INT_DOTS, PTX)
    elif FOLD and (req_lo == req_hi):
        _prefetching_blocks(q, q0, q1, q2, q3, pool_ptr, table_ptr, out_base, req_lo, pos,
                            live, row_ok, first_block, NB, W, P, reach, score_scale, BLOCKS,
                            USE_FP8, FOLD, PTX)
    else:
        _tile_blocks(q, q0, q1, q2, q3, pool_ptr, table_ptr, out_base, req, pos, live, row_ok,
                     req_lo, req_hi, first_block, NB, W, P, reach, score_scale, BLOCKS,
                     USE_FP8, FOLD, PTX)


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
five programs per SM instead of the four its 118 allow (16 bytes spilled). RESULTS, sixth
session: 65.5 against 68.8 us at b8 S4 128K, 65.8 against 69.3 at b32 S8 32K; a cap of 80
(six programs, 48 bytes spilled) gained less."""


ONE_ROW_PAIRS_FROM = 64
"""One-row tiles take two blocks per program (the second block's words loaded while the
first is scored) from this many blocks per SM on; below it the grid would leave SMs idle in its
last wave (RESULTS: 2 blocks 129 vs 139 us at b32 ctx 128K, 27.5 vs 24.9 us at ctx 8K)."""

ONE_ROW_WARPS = 2
"""Warps of a one-row program walking two blocks (:data:`ONE_ROW_PAIRS_FROM`); one below
it, where a program scores one block. Fewer warps per page mean fewer barriers and fewer
cross-warp maxima per block, and more programs resident to hide the page loads (RESULTS,
tenth session: 2 warps and 2 blocks 96.0 us against 100.1 at 4 and 4, 110.9 at 4 and 2,
b32 ctx 128K; 1 warp 7.2 us against 8.7 at 2 and 9.1 at 4, b32 ctx 8K). A row's scores do
not depend on it: each thread holds the same four words of a token's scale group and the
same four groups of a token in any of these layouts, so every sum runs in the same order
(``tests/gpu``'s batch invariance checks it across the threshold)."""


TILE_BLOCKS_MAX = 8
"""Blocks per program of a prefill-shaped tile at most: its query tile is loaded once for
them, and its walk keeps the next block's page in flight (RESULTS, fifth session: 8 against
4 measured 1.04-1.11x faster over the prefill cells, 16 no better than 8 except on the
32768-row chunks)."""


def walk_blocks(row_tiles: int, num_blocks: int, num_sms: int, most: int,
                programs_per_sm: int) -> int:
    """Blocks per program of a walk over consecutive blocks: ``most``, fewer where the grid
    would then give an SM under ``programs_per_sm`` programs (small contexts), and enough to
    keep the grid's y within 65535. A block's scores do not depend on it."""
    blocks = max(1, min(most, (row_tiles * num_blocks) // (programs_per_sm * num_sms)))
    return max(blocks, triton.cdiv(num_blocks, 65535))


def plan(num_rows: int, num_heads: int, num_requests: int, num_blocks: int,
         num_sms: int, foldable: bool = True) -> Plan:
    """Tiling from static shapes: rows per tile follow rows per request (``T // B``: the
    decode depth S, or a prefill chunk), capped at 128 dot rows (64 where the keys cannot be
    folded: ``foldable`` is false for e4m3 dots, whose operand cannot hold the groups'
    relative scales exactly).

    A tile of one dot row (S = 1, H = 1: the common decode step) is scored on the CUDA cores:
    a 16-row tensor-core tile would be 15/16 padding. Decode-shaped tiles (under 64 dot rows)
    take one block per program (tens of thousands of small programs, none waiting on a page
    for another block) and four group dots, which measured faster than folded keys there;
    one-row tiles two blocks on two warps where the grid is large (:data:`ONE_ROW_PAIRS_FROM`),
    else one block on one warp (:data:`ONE_ROW_WARPS`).
    Prefill-shaped tiles (64 dot rows and more, warpgroup dots) take folded keys, one
    accumulator, which lets a tile hold 128 rows (four rescaled group dots spilled there), and
    up to :data:`TILE_BLOCKS_MAX` blocks per program, reusing the loaded query tile and
    loading each block's page while the one before is scored, while the grid keeps two waves.
    16-row tiles are capped at :data:`DECODE_TILE_REGISTERS` registers per thread. (On CUDA,
    tiles of 2 to 8 dot rows take ``index_rows_gluon`` by default instead: :func:`_rows_tile`,
    with :func:`rows_tile_blocks` blocks per program; on sm_90, prefill tiles of fp16 dots
    take ``index_prefill_gluon``: :func:`_prefill_tile`, :func:`prefill_tile_blocks`.)
    The measurements behind each choice: bench/RESULTS.md ("What each change bought").
    """
    per_request = max(1, num_rows // max(1, num_requests))
    rows = min(triton.next_power_of_2(per_request), max(1, (128 if foldable else 64) // num_heads))
    m = max(16, triton.next_power_of_2(rows * num_heads))
    row_tiles = triton.cdiv(max(num_rows, 1), rows)
    blocks = 1
    if m >= 64:
        blocks = walk_blocks(row_tiles, num_blocks, num_sms, min(TILE_BLOCKS_MAX, num_blocks), 2)
    one_row = rows * num_heads == 1
    warps = 8 if m >= 64 else 4
    if one_row:
        pairs = row_tiles * num_blocks >= ONE_ROW_PAIRS_FROM * num_sms
        blocks, warps = (2, ONE_ROW_WARPS) if pairs else (1, 1)
    blocks = max(blocks, triton.cdiv(num_blocks, 65535))  # the grid's y limit
    grid = (row_tiles, triton.cdiv(max(num_blocks, 1), blocks), 1)
    fold = foldable and m >= 64
    registers = DECODE_TILE_REGISTERS if m == 16 and not one_row else None
    return Plan(rows, m, blocks, grid, warps, one_row, fold, registers)


# --- lowering (covers / lower: jax_mxfp4.lowering.KernelModule) -----------------------------

_DOT_DTYPES = {"fp8": tl.float8e4nv, "fp16": tl.float16, "bf16": tl.bfloat16}


def _dot(call) -> str:
    """The dot operand type: e4m3-exact queries take fp16 dots (exact for e2m1 x e4m3), or
    fp8 dots where ``config.fp8_dots`` asks; a bf16 query kept as is (``q_round="none"``)
    takes bf16 dots."""
    q_fp8 = jnp.dtype(call.avals_in[0].dtype) == jnp.float8_e4m3fn
    exact_e4m3 = q_fp8 or call.params["q_round"] == "e4m3"
    if not exact_e4m3:
        return "bf16"
    return "fp8" if call.config.fp8_dots else "fp16"


def available(target, config) -> str | None:
    return triton_call.launcher_problem(target)


def covers(call) -> str | None:
    return None  # every call of the operation


def kernel_name(call) -> str:
    q_aval, _, table_aval = call.avals_in[:3]
    dot, num_blocks = _dot(call), call.params["num_blocks"]
    layout = plan(q_aval.shape[0], q_aval.shape[1], table_aval.shape[0], num_blocks,
                  call.target.units, foldable=dot != "fp8")
    if _row_tile(call, layout):
        return "index_row_kernel[int8 dots]"
    if _gluon_tile(call, layout, dot, num_blocks):
        return f"index_tile_kernel[{dot} dots]"
    if _prefill_tile(call, layout, dot):
        return f"index_prefill_kernel[{dot} dots]"
    if _rows_tile(call, layout, dot):
        return f"index_rows_kernel[{dot} dots]"
    return f"index_scores_kernel[{dot} dots]"


def _gluon_tile(call, layout: Plan, dot: str, num_blocks: int) -> bool:
    """Whether the call takes ``index_tile_gluon.index_tile_kernel``: asked for
    (``cuda_kernels="gluon"``; measured against the Triton tile in RESULTS), on CUDA sm_80+,
    for decode-shaped 16-row tiles of fp16 dots (one block per program, so at most 65535 blocks)."""
    return (triton_call.gluon_requested(call) and dot == "fp16" and layout.m == 16
            and not layout.one_row and not layout.fold and num_blocks <= 65535)


def _row_tile(call, layout: Plan) -> bool:
    """Whether the call takes ``index_row_gluon.index_row_kernel`` (a one-row tile's exact
    integer group dots on the int8 tensor cores, the page's tokens as the MMA's M; the same
    bits as the Triton one-row kernel's integer dots): asked for (``cuda_kernels="gluon"``),
    one-row tiles of an e4m3-exact query on CUDA sm_80+. Not the default: 0.98-1.12x the
    Triton one-row kernel's time on the H200 (bench/RESULTS.md, twenty-second session)."""
    q_fp8 = jnp.dtype(call.avals_in[0].dtype) == jnp.float8_e4m3fn
    exact = q_fp8 or call.params["q_round"] == "e4m3"
    return (triton_call.gluon_requested(call) and layout.one_row and exact
            and not call.config.fp8_dots)


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
measured 1.03-1.13x slower (RESULTS, thirteenth session). (With one warpgroup of 64 rows,
three programs at 168 registers were 1.08-1.16x faster than four at 128 with 88 bytes
spilled inside the walk: twelfth session.)"""


PREFILL_GRID_PROGRAMS_PER_SM = 2
"""Programs per SM the prefill tile's grid keeps at least where each tile holds one
request's rows: one wave of the two resident programs, fewer blocks per program only on
small grids. A program's start (its dependent metadata, page-id and page loads, its query
tile) costs more than a block, so a longer walk in one wave beats shorter ones in two
(RESULTS, fifteenth session: b1 q4096 ctx 8K 28.6 us against 31.8 with 4 and 32.1 with 3;
b4 q512 ctx 8K 20.4 against 22.7 with 4, though 19.3 with 3; the large cells, 8 blocks
either way, unchanged). Those timings predate the prefill tile's reversed launch order
(sixteenth session), so part of what they charged to a program's start was working programs
waiting behind empty ones; the choice was not timed again since."""

PREFILL_GRID_PROGRAMS_PER_SM_ACROSS = 4
"""The same where tiles hold rows of several requests (``T // B`` not a multiple of the
tile's rows): their walk loads each request's page when it scores it, with nothing in
flight, so shorter walks in more waves are faster (RESULTS, fifteenth session: b32 q96 ctx
8K 1.2x slower at 2 than at 4)."""


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
    from jax_mxfp4.gpu.kernels import index_prefill_gluon

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
page in flight): RESULTS, sixth session, 1 / 2 / 4 / 8 / 16 blocks at b8 S4 128K 58.2 / 53.0 /
50.4 / 41.6 / 40.9 us (8 and 16 with the page in flight)."""


ROWS_TILE_REGISTERS = 96
"""Registers per thread of an ``index_rows_kernel`` program at most: five programs per SM
instead of the four its 108 allow, with nothing spilled (RESULTS, eleventh session)."""


def rows_tile_blocks(row_tiles: int, num_blocks: int, num_sms: int) -> int:
    """Blocks per ``index_rows_kernel`` program (:func:`walk_blocks`): up to
    :data:`ROWS_TILE_BLOCKS_MAX` while the grid keeps four programs per SM."""
    return walk_blocks(row_tiles, num_blocks, num_sms, ROWS_TILE_BLOCKS_MAX, 4)


ROW_TILE_BLOCKS_MAX = 8
"""Blocks per ``index_row_kernel`` program at most (its query operand built once for them,
the next page in flight while one is scored). RESULTS, twenty-second session: at most 1 / 2
/ 8 blocks 103.3 / 97.5 / 81.9 us at b32 ctx 128K."""

ROW_TILE_PROGRAMS_PER_SM = 6
"""Programs per SM the ``index_row_kernel`` grid keeps at least: fewer blocks per program
only where the grid is small (RESULTS, twenty-second session: 7.3 us at b32 ctx 8K, two
blocks a program, against 8.6 at 3 programs per SM, five blocks)."""


def row_tile_blocks(rows: int, num_blocks: int, num_sms: int) -> int:
    """Blocks per ``index_row_kernel`` program (:func:`walk_blocks`): up to
    :data:`ROW_TILE_BLOCKS_MAX` while the grid keeps :data:`ROW_TILE_PROGRAMS_PER_SM`
    programs per SM. A block's scores do not depend on it."""
    return walk_blocks(rows, num_blocks, num_sms, ROW_TILE_BLOCKS_MAX, ROW_TILE_PROGRAMS_PER_SM)


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
    from jax_mxfp4.gpu.kernels import index_rows_gluon

    blocks = rows_tile_blocks(layout.grid[0], num_blocks, call.target.units)
    grid = (layout.grid[0], triton.cdiv(num_blocks, blocks), 1)
    shared = {k: constants[k] for k in ("H", "ROWS", "ROUND_Q")}
    return _launch(call, index_rows_gluon.index_rows_kernel, grid, scalars,
                   {**shared, "BLOCKS": blocks}, index_rows_gluon.WARPS, ROWS_TILE_REGISTERS)


def _row_tile_launch(call, num_blocks: int, scalars: dict, constants: dict):
    """``index_row_gluon.index_row_kernel`` on one row a program and
    :func:`row_tile_blocks` blocks per program."""
    from jax_mxfp4.gpu.kernels import index_row_gluon

    rows = call.avals_in[0].shape[0]
    blocks = row_tile_blocks(rows, num_blocks, call.target.units)
    grid = (rows, triton.cdiv(num_blocks, blocks), 1)
    return _launch(call, index_row_gluon.index_row_kernel, grid, scalars,
                   {"BLOCKS": blocks, "ROUND_Q": constants["ROUND_Q"]}, index_row_gluon.WARPS)


def _gluon_tile_launch(call, grid, scalars: dict, constants: dict):
    """``index_tile_gluon.index_tile_kernel`` on one block per program (grid ``(row tiles,
    blocks)``), with the Triton kernel's scalars and the constants it shares."""
    from jax_mxfp4.gpu.kernels import index_tile_gluon

    return _launch(call, index_tile_gluon.index_tile_kernel, grid, scalars,
                   {k: constants[k] for k in ("H", "ROWS", "ROUND_Q")}, index_tile_gluon.WARPS)


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
    layout = plan(rows, heads, num_requests, num_blocks, call.target.units,
                  foldable=dot != "fp8")
    scalars = {"T": np.int32(rows), "B": np.int32(num_requests), "W": np.int32(width),
               "P": np.int32(pool_aval.shape[0]), "NB": np.int32(num_blocks),
               "score_scale": folded_score_scale(call.params["sm_scale"])}
    constants = {"H": heads, "ROWS": layout.rows, "M": layout.m, "BLOCKS": layout.blocks,
                 "Q_IS_FP8": q_fp8, "ROUND_Q": (not q_fp8) and dot != "bf16",
                 "USE_FP8": dot == "fp8", "DOT_DTYPE": _DOT_DTYPES[dot],
                 "ONE_ROW": layout.one_row, "FOLD": layout.fold}
    constants["INT_DOTS"] = int_dots(call.target, layout, constants)
    empty = not (rows and num_blocks and num_requests)
    if _row_tile(call, layout) and not empty:
        launch = _row_tile_launch(call, num_blocks, scalars, constants)
    elif _gluon_tile(call, layout, dot, num_blocks):
        grid = (0, 1, 1) if empty else (layout.grid[0], num_blocks, 1)
        launch = _gluon_tile_launch(call, grid, scalars, constants)
    elif _prefill_tile(call, layout, dot) and not empty:
        launch = _prefill_tile_launch(call, layout, num_blocks, scalars, constants)
    elif _rows_tile(call, layout, dot) and not empty:
        launch = _rows_tile_launch(call, layout, num_blocks, scalars, constants)
    else:
        launch = _launch(call, index_scores_kernel, (0, 1, 1) if empty else layout.grid,
                         scalars, constants, layout.num_warps, layout.max_registers)
    return launcher.emit(ctx, launch, [q, pool, table, positions, requests], call.avals_in,
                         call.avals_out)
