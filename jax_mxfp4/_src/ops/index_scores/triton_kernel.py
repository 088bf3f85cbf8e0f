"""Triton kernel: block scores of query rows over the MXFP4 index cache (SPEC §4, §4.1, §5).

One program scores a tile of ``ROWS`` consecutive rows (all ``H`` index heads: ``M = ROWS * H``
dot rows, padded to 16) against ``BLOCKS`` consecutive 128-token blocks. Per block it loads the
page of each request in the tile once (decode tiles hold one request's ``S`` rows; prefill
tiles one request's chunk, or the ends of two) and takes tensor-core dots: four ``K = 32``
dots, one per scale group (``mxfp4.page_logits``), or one ``K = 128`` dot on keys with the
groups' scales folded in (``mxfp4.folded_page_logits``); a tile of one dot row is scored on
the CUDA cores (``mxfp4.row_logits``, or exact integer byte dots where its query is
e4m3-exact: ``row_dot``). Every output element is written: ``-inf`` where a row has no live
token in the block, NaN where a live token's logit is not finite (a NaN key or query, an
fp32 overflow: SPEC §9.2). The tiling is ``index_scores.plan``'s; the Gluon index tiles
share this module's row and page rules (:func:`tile_rows`, :func:`_block_page`).
"""

from __future__ import annotations

import triton
import triton.language as tl

from jax_mxfp4._src.triton import mxfp4, row_dot
from jax_mxfp4._src.triton.mxfp4 import HEAD_DIM, MX_BLOCK, PAGE_TOKENS, TOKEN_WORDS, WORD_ELEMENTS

PROPAGATE = tl.constexpr(tl.PropagateNan.ALL)  # a NaN score survives the maxima across requests


@triton.jit
def _query_columns(q_ptr, row, head, row_ok, first: tl.constexpr, WIDTH: tl.constexpr,
                   H: tl.constexpr, ROUND_Q: tl.constexpr, DOT_DTYPE: tl.constexpr,
                   PTX: tl.constexpr):
    """Columns ``first .. first + WIDTH - 1`` of the query rows as a dot operand ``[M,
    WIDTH]``: a bf16 query rounded to e4m3 (``ROUND_Q``), else (an e4m3 query, or a bf16 one
    kept as is for bf16 dots) converted exactly."""
    c = first + tl.arange(0, WIDTH)
    ptrs = q_ptr + (row * H + head)[:, None].to(tl.int64) * HEAD_DIM + c[None, :]
    x = tl.load(ptrs, mask=row_ok[:, None], other=0.0)
    if ROUND_Q:
        return mxfp4.round_e4m3(x.to(tl.float32), PTX).to(DOT_DTYPE)
    return x.to(DOT_DTYPE)


@triton.jit
def _query_column(q_ptr, row, row_ok, j: tl.constexpr, ROUND_Q: tl.constexpr,
                  PTX: tl.constexpr):
    """Elements ``8w + WORD_ORDER[j]`` (``w`` = 0..15) of row ``row``'s query (one head) as
    fp32 ``[16]``, rounded as the dots would round them."""
    e = tl.arange(0, TOKEN_WORDS) * WORD_ELEMENTS + mxfp4.WORD_ORDER[j]
    x = tl.load(q_ptr + row.to(tl.int64) * HEAD_DIM + e, mask=row_ok, other=0.0).to(tl.float32)
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
        word_pairs: tl.constexpr = WORD_ELEMENTS // 2  # a code word's elements as bf16 pairs
        pair = (tl.arange(0, TOKEN_WORDS)[:, None] * word_pairs
                + tl.arange(0, word_pairs)[None, :])
        first = q_ptr.to(tl.pointer_type(tl.uint32)) + row.to(tl.int64) * (HEAD_DIM // 2)
        pairs = tl.load(first + pair, mask=row_ok, other=0)  # pair p: elements 8w + 2p, + 1
        even, odd = tl.split(tl.reshape(pairs, (TOKEN_WORDS, 2, 2)))  # pairs (0, 2) and (1, 3)
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
def row_live(pos, req, B):
    """Whether a row with position ``pos`` and request ``req`` is live: a position >= 0 and a
    request in ``[0, B)`` (SPEC §4.1)."""
    return (pos >= 0) & (req >= 0) & (req < B)


@triton.jit
def tile_rows(m, first_row, pos_ptr, req_ptr, T, B, H: tl.constexpr, ROWS: tl.constexpr):
    """The dot rows ``m`` (int32, any layout: the Gluon tiles call it too) of the tile whose
    first query row is ``first_row``: each one's query row and head, whether it exists, its
    position and request, and whether it is live (a position >= 0, a request in ``[0, B)``;
    SPEC §4.1). The one rule every index tile applies to its rows' metadata."""
    row, head, row_ok = tile_row_ids(m, first_row, T, H, ROWS)
    pos = tl.load(pos_ptr + row, mask=row_ok, other=-1)
    req = tl.load(req_ptr + row, mask=row_ok, other=-1)
    live = row_ok & row_live(pos, req, B)
    return row, head, row_ok, pos, req, live


@triton.jit
def _block_page(pool_ptr, table_ptr, req, reach, j, NB, W, P):
    """Block ``j``'s page of request ``req``: its address and whether it is scored (the block
    exists, a row reaches it: ``reach`` is the rows' largest position, -1 where none is live;
    the page id lies in ``[0, P)``). The one rule of the one-row and the prefetching walks."""
    reached = (j < NB) & (j * PAGE_TOKENS <= reach)
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
    return row_logit_max(dots, smax, j * PAGE_TOKENS + tl.arange(0, PAGE_TOKENS), pos0, ok)


@triton.jit
def row_logit_max(dots, smax, tok, pos0, ok):
    """One row's max logit over a block (-inf where the page is not ``ok``) from its tokens'
    relative dots and largest scale bytes (``mxfp4.row_logits``' units; ``tok``: the tokens'
    positions, any layout): the tokens at or before ``pos0``, an infinite logit made NaN and
    NaN kept. The one-row epilogue every one-row tile takes."""
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
    row that sees it (SPEC §9.2), and a NaN-propagating max then carries it, in the same one
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
    SPEC §9.2, is found per row, not per element). ``reach`` and ``low``: the largest and
    the smallest position of the selected rows (the same for every block of a tile:
    :func:`_row_span`), so the whole-block test of block ``j`` takes no reduction."""
    tok = j * PAGE_TOKENS + tl.arange(0, PAGE_TOKENS)
    dots, expo, first_nan = mxfp4.folded_page_logits(q, codes, scales, tok <= reach)
    return folded_row_maxima(dots, expo, j * PAGE_TOKENS + first_nan, sel, pos, tok,
                             j * PAGE_TOKENS + (PAGE_TOKENS - 1) <= low, q.dtype == tl.float16)


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
                 FOLD: tl.constexpr, PTX: tl.constexpr):
    """Max logit of each dot row ``sel`` selects over block ``j``'s tokens from its page as
    :func:`mxfp4.page_bytes` loaded it (-inf for the other rows). ``FOLD``: the query
    tile ``q [M, 128]`` against folded keys (:func:`mxfp4.folded_page_logits`), else the
    groups ``q0 .. q3`` (:func:`mxfp4.page_logits`). ``reach``, ``low``: :func:`_row_span`
    of ``sel`` (folded keys only)."""
    if FOLD:
        best = _folded_maxima(q, codes, scales, sel, pos, j, reach, low)
    else:
        dots, expo = mxfp4.page_logits(q0, q1, q2, q3, codes, scales, PTX)
        best = _masked_maxima(mxfp4.mul_pow2(dots, expo[None, :]), sel, pos,
                              j * PAGE_TOKENS + tl.arange(0, PAGE_TOKENS))
    return best


@triton.jit
def _tile_maxima(q, q0, q1, q2, q3, pool_ptr, table_ptr, req, pos, live, j, req_r, W, P,
                 FOLD: tl.constexpr, PTX: tl.constexpr):
    """Max logit of each dot row over block ``j`` of request ``req_r`` (-inf elsewhere), the
    page loaded and scored in one step (:func:`_page_maxima`)."""
    page = tl.load(table_ptr + tl.cast(req_r, tl.int64) * W + j)  # req_r: a loop index
    sel = live & (req == req_r)
    best = tl.full(sel.shape, float("-inf"), tl.float32)
    if (page >= 0) & (page < P) & (tl.max(sel.to(tl.int32), axis=0) > 0):
        codes, scales = mxfp4.page_bytes(pool_ptr + page.to(tl.int64) * mxfp4.PAGE_BYTES, True)
        reach, low = _row_span(sel, pos)
        best = _page_maxima(q, q0, q1, q2, q3, codes, scales, sel, pos, j, reach, low,
                            FOLD, PTX)
    return best


@triton.jit
def _tile_blocks(q, q0, q1, q2, q3, pool_ptr, table_ptr, out_base, req, pos, live, row_ok,
                 req_lo, req_hi, first_block, NB, W, P, reach, score_scale,
                 BLOCKS: tl.constexpr, FOLD: tl.constexpr,
                 PTX: tl.constexpr):
    """Score blocks ``first_block ..`` (``BLOCKS`` of them) for a tile whose live rows belong
    to requests ``req_lo .. req_hi``, and store them: each block's page of each request in
    turn, loaded when it is scored. The decode tiles' walk (one block per program: a
    prefetching walk measured slower there) and prefill tiles' across a chunk's end."""
    for jj in range(BLOCKS):
        j = first_block + jj
        best = tl.full((req.shape[0],), float("-inf"), tl.float32)
        if (j < NB) & (j * PAGE_TOKENS <= reach):
            for req_r in range(req_lo, req_hi + 1):
                best = tl.maximum(best, _tile_maxima(q, q0, q1, q2, q3, pool_ptr, table_ptr,
                                                     req, pos, live, j, req_r, W, P,
                                                     FOLD, PTX), propagate_nan=PROPAGATE)
        tl.store(out_base + j, best * score_scale, mask=row_ok & (j < NB))


@triton.jit
def _prefetching_blocks(q, q0, q1, q2, q3, pool_ptr, table_ptr, out_base, req_r, pos, live,
                        row_ok, first_block, NB, W, P, reach, score_scale,
                        BLOCKS: tl.constexpr, FOLD: tl.constexpr,
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
                                FOLD, PTX)
        tl.store(out_base + j, best * score_scale, mask=row_ok & (j < NB))
        codes, scales, ok = next_codes, next_scales, next_ok


@triton.jit
def index_scores_kernel(q_ptr, pool_ptr, table_ptr, pos_ptr, req_ptr, out_ptr, T, B, W, P, NB,
                        score_scale, H: tl.constexpr, ROWS: tl.constexpr, M: tl.constexpr,
                        BLOCKS: tl.constexpr, Q_IS_FP8: tl.constexpr, ROUND_Q: tl.constexpr,
                        DOT_DTYPE: tl.constexpr,
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
        q = _query_columns(q_ptr, row, head, row_ok, 0, HEAD_DIM, H, ROUND_Q, DOT_DTYPE, PTX)
        q0, q1, q2, q3 = q, q, q, q  # unused
    else:
        q = tl.zeros((M, HEAD_DIM), DOT_DTYPE)  # unused
        q0 = _query_columns(q_ptr, row, head, row_ok, 0, MX_BLOCK, H, ROUND_Q, DOT_DTYPE, PTX)
        q1 = _query_columns(q_ptr, row, head, row_ok, MX_BLOCK, MX_BLOCK, H, ROUND_Q,
                            DOT_DTYPE, PTX)
        q2 = _query_columns(q_ptr, row, head, row_ok, 2 * MX_BLOCK, MX_BLOCK, H, ROUND_Q,
                            DOT_DTYPE, PTX)
        q3 = _query_columns(q_ptr, row, head, row_ok, 3 * MX_BLOCK, MX_BLOCK, H, ROUND_Q,
                            DOT_DTYPE, PTX)
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
                            FOLD, PTX)
    else:
        _tile_blocks(q, q0, q1, q2, q3, pool_ptr, table_ptr, out_base, req, pos, live, row_ok,
                     req_lo, req_hi, first_block, NB, W, P, reach, score_scale, BLOCKS,
                     FOLD, PTX)
