"""Gluon kernel (CUDA sm_90): ``index_scores`` on prefill-shaped tiles with warpgroup MMAs
(``wgmma``) whose operands sit in shared memory.

Why: the Triton prefill tile (128 dot rows, folded keys) needs 246 registers a thread, so one
program runs per SM and every step of a block (decode, dot, the rows' maxima) waits on the one
before: its tensor cores idle most of the time (bench/history/2026-12-01.md, fifth session,
"Where a prefill block's time went": 246 registers, issue slots 34 % busy, one resident program
per SM). Here a program is two warpgroups with 128 dot rows (64 each): the query tile and each
page's folded keys live in shared memory (``NVMMASharedLayout``), the accumulator
``f32 [128, 128]`` (64 registers a thread) is the only large register tile, and two programs fit
on an SM, so one program's dots run while the other decodes its next page or takes its rows'
maxima. The page's keys are decoded once for 128 rows by all eight warps: the decode, the
integer work that bounds this tile (its ALU pipe is the busiest), costs half as much a row as
with one warpgroup of 64 rows (bench/history/2026-12-02.md, thirteenth session, "128 rows
(landed)").

Scores are those of the Triton tile's folded-key walk, step for step (SPEC §4, §4.1, §5,
§9.2; ``index_scores_triton.folded_row_maxima``, ``mxfp4.folded_page_logits``): the page's
reference byte is the largest scale byte of the tokens any row reaches (NaN-key tokens set
none); each group ``depth`` binades below it enters the dot as ``e2m1 * 2**(9 - depth)`` in
fp16 (exact for depths 0..31), deeper groups in further bands of 32 binades, deepest first, the
running dots scaled by ``2**-32`` between them; a row's maximum is taken on the relative logits
and scaled once; NaN for a row that reaches a NaN-key token, sees a NaN dot, or whose largest
``|logit|`` overflows. fp16 dots only (a bf16 or e4m3 query rounded or stored as e4m3); the
bf16 dots of ``q_round="none"`` keep the Triton tile.
"""

from __future__ import annotations

import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from jax_mxfp4._src.ops.index_scores.gluon_rows import word_bytes
from jax_mxfp4._src.ops.index_scores.triton_kernel import (
    _block_page,
    _row_span,
    folded_row_maxima,
    tile_row_ids,
    tile_rows,
)
from jax_mxfp4._src.triton import mxfp4
from jax_mxfp4._src.triton.mxfp4 import (
    GROUP_DATA_BYTES,
    GROUP_WORDS,
    HEAD_DIM,
    PAGE_TOKENS,
    TOKEN_GROUPS,
    TOKEN_SCALE_BYTES,
    TOKEN_WORDS,
    WORD_BYTES,
)

WARPS = 8
"""Warps per program: two warpgroups (a warpgroup, four warps, is the unit of a ``wgmma``)."""

TILE_ROWS = 128
"""Dot rows (query rows times index heads) per program: the ``wgmma``'s M (64) for each of
the two warpgroups."""

DOT_ROWS = gl.constexpr(TILE_ROWS)
ACC = gl.constexpr(gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1],
                                             instr_shape=[16, 128, 16]))
"""The dots ``f32 [128 rows, 128 tokens]``: warp ``w`` holds rows ``16 w ..`` (warpgroup ``w //
4`` the rows ``64 (w // 4) ..``), a lane two rows and 32 tokens (so a row's maximum takes two
shuffles)."""
ROW_SLICE = gl.constexpr(gl.SliceLayout(1, ACC))
TOKEN_SLICE = gl.constexpr(gl.SliceLayout(0, ACC))
OPERAND = gl.constexpr(gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16,
                                            rank=2))
"""The query tile ``[128, 128]`` and a page's keys ``[128 tokens, 128]`` (fp16, head dims
innermost) in shared memory, as ``wgmma`` reads them (the keys through a transposed view)."""
WORDS = gl.constexpr(gl.BlockedLayout(size_per_thread=[1, 1, 4], threads_per_warp=[8, 4, 1],
                                      warps_per_cta=[WARPS, 1, 1], order=[2, 1, 0]))
"""A page's code words ``uint32 [128 tokens, 4 groups, 4]``: lane ``4 a + g`` holds group
``g`` of tokens ``a + 8 w + 64 i`` (16 bytes each, one load), so a thread's 32 keys of a token
share one scale byte. Words, not bytes, are what the walk carries to the next block (a byte
would take a register of its own)."""
CODES = gl.constexpr(gl.BlockedLayout(size_per_thread=[1, 1, 16], threads_per_warp=[8, 4, 1],
                                      warps_per_cta=[WARPS, 1, 1], order=[2, 1, 0]))
"""The same words as bytes ``uint8 [128, 4, 16]`` in the same registers: the decode's input."""
GROUP_BYTES = gl.constexpr(gl.SliceLayout(2, WORDS))
ALL_TOKENS = gl.constexpr(gl.DistributedLinearLayout(
    reg_bases=[[1], [2]], lane_bases=[[4], [8], [16], [32], [64]], warp_bases=[[0], [0], [0]],
    block_bases=[], shape=[PAGE_TOKENS]))
"""A page's 128 scale words in every warp (four to a thread, one 16-byte load): the page's
reference byte, deepest group and first NaN-key token reduce within each warp, with no
shared memory and no barrier."""
QUERY = gl.constexpr(gl.BlockedLayout(size_per_thread=[1, 8], threads_per_warp=[2, 16],
                                      warps_per_cta=[WARPS, 1], order=[1, 0]))

# Four code bytes ($4) and their fold factor pair ($5: bytes 0, 1; $6: bytes 2, 3) -> fp16
# keys: each nibble placed as e4m3 ``e2m1 * 2**-6`` (``mxfp4.nibble_e4m3``, four at a time),
# converted exactly by the hardware, times the factor (a power of two, or 0 outside the band:
# exact wherever the product is at least 2**-24). $0 = (b0 low, b1 low), $1 = (b2 low, b3
# low), $2 = (b0 high, b1 high), $3 = (b2 high, b3 high) nibbles.
_FOLDED_FP16 = gl.constexpr(
    "{ .reg .b32 lo, hi, t; .reg .b16 l0, l1, h0, h1;"
    "and.b32 lo, $4, 0x07070707; shl.b32 lo, lo, 2; and.b32 t, $4, 0x08080808;"
    "shl.b32 t, t, 4; or.b32 lo, lo, t;"
    "shr.b32 hi, $4, 2; and.b32 hi, hi, 0x1C1C1C1C; and.b32 t, $4, 0x80808080;"
    "or.b32 hi, hi, t;"
    "mov.b32 {l0, l1}, lo; mov.b32 {h0, h1}, hi;"
    "cvt.rn.f16x2.e4m3x2 $0, l0; cvt.rn.f16x2.e4m3x2 $1, l1;"
    "cvt.rn.f16x2.e4m3x2 $2, h0; cvt.rn.f16x2.e4m3x2 $3, h1;"
    "mul.rn.f16x2 $0, $0, $5; mul.rn.f16x2 $1, $1, $6;"
    "mul.rn.f16x2 $2, $2, $5; mul.rn.f16x2 $3, $3, $6; }")


@gluon.jit
def _page_loads(page_ptr, ok):
    """Issue every load of a page: its code words (:data:`WORDS`), its scale words
    (:data:`ALL_TOKENS`) and each thread's group scale bytes (:data:`GROUP_BYTES`); zeros
    where not ``ok`` (a scalar)."""
    tok = gl.arange(0, PAGE_TOKENS, layout=gl.SliceLayout(1, GROUP_BYTES))
    grp = gl.arange(0, TOKEN_GROUPS, layout=gl.SliceLayout(0, GROUP_BYTES))
    word = gl.arange(0, GROUP_WORDS, layout=gl.SliceLayout(0, gl.SliceLayout(1, WORDS)))
    offs = (tok[:, None, None] * TOKEN_WORDS + grp[None, :, None] * GROUP_WORDS
            + word[None, None, :])
    words = page_ptr.to(gl.pointer_type(gl.uint32))
    codes = gl.load(words + offs, mask=ok, other=0)
    scale_words = gl.load(words + mxfp4.PAGE_SCALE_OFFSET // WORD_BYTES
                          + gl.arange(0, PAGE_TOKENS, layout=ALL_TOKENS), mask=ok, other=0)
    group_bytes = gl.load(page_ptr + mxfp4.PAGE_SCALE_OFFSET + tok[:, None] * TOKEN_SCALE_BYTES
                          + grp[None, :], mask=ok, other=0)
    return codes, scale_words, group_bytes


@gluon.jit
def _page_span(scale_words, reach, j):
    """``folded_page_logits``' reduction: the page's reference byte (the largest scale byte of
    the tokens up to ``reach`` that have no NaN group), its deepest group below it (0 where
    none) and the page index of its first NaN-key token (``2**30`` where none)."""
    tok = gl.arange(0, PAGE_TOKENS, layout=ALL_TOKENS)
    s0, s1 = mxfp4.scale_byte(scale_words, 0), mxfp4.scale_byte(scale_words, 1)
    s2, s3 = mxfp4.scale_byte(scale_words, 2), mxfp4.scale_byte(scale_words, 3)
    largest = gl.maximum(gl.maximum(s0, s1), gl.maximum(s2, s3))
    smallest = gl.minimum(gl.minimum(s0, s1), gl.minimum(s2, s3))
    nan_keys = largest == mxfp4.NAN_BYTE
    live = (j * PAGE_TOKENS + tok <= reach) & ~nan_keys
    ref, shallowest, first_nan = gl.reduce(
        (gl.where(live, largest, 0), gl.where(live, smallest, mxfp4.NAN_BYTE),
         gl.where(nan_keys, tok, 2**30)), 0, mxfp4._page_span)
    return ref, gl.maximum(ref - shallowest, 0), first_nan


@gluon.jit
def _store_keys(keys_smem, codes, group_bytes, ref, band):
    """Band ``band``'s folded keys of a page into ``keys_smem`` (fp16 ``[128, 128]``): each
    group ``depth = ref - byte`` binades below the reference times ``2**(15 - depth + 32 *
    band)`` where that exponent lies in ``(-17, 15]``, zeros elsewhere
    (``mxfp4._band_keys``)."""
    shift = mxfp4.FOLD_SHIFT - (ref - group_bytes.to(gl.int32)) + band * mxfp4.FOLD_BAND
    inside = (shift <= mxfp4.FOLD_SHIFT) & (shift > mxfp4.FOLD_SHIFT - mxfp4.FOLD_BAND)
    factor = gl.where(inside, mxfp4.pow2(shift), 0.0).to(gl.float16)
    group_words = gl.reshape(codes, [PAGE_TOKENS * TOKEN_GROUPS, GROUP_WORDS])
    raw = gl.convert_layout(gl.reshape(word_bytes(group_words),
                                       [PAGE_TOKENS, TOKEN_GROUPS, GROUP_DATA_BYTES]), CODES)
    factor = gl.broadcast(gl.convert_layout(factor, gl.SliceLayout(2, CODES))[:, :, None], raw)[0]
    lo, hi = gl.inline_asm_elementwise(_FOLDED_FP16, "=r,=r,=r,=r,r,r,r", [raw, factor],
                                       dtype=(gl.float16, gl.float16), is_pure=True, pack=4)
    keys_smem.store(gl.reshape(gl.join(lo, hi), [PAGE_TOKENS, HEAD_DIM]))  # dim 32 g + 2 i + nibble


@gluon.jit
def _page_dots(q_smem, keys_smem, codes, group_bytes, ref, bands):
    """The page's relative dots ``f32 [128, 128]`` (``q . k = dots * 2**(ref - 136)`` for
    every token a row reaches): one ``wgmma`` per band, deepest first (Horner)."""
    dots = gl.zeros((DOT_ROWS, PAGE_TOKENS), gl.float32, layout=ACC)
    for i in range(bands):
        gl.thread_barrier()  # every warp is done with the keys the last dot read
        _store_keys(keys_smem, codes, group_bytes, ref, bands - 1 - i)
        fence_async_shared()
        gl.thread_barrier()
        if i > 0:
            dots = dots * mxfp4.BAND_STEP
        dots = warpgroup_mma(q_smem, keys_smem.permute((1, 0)), dots, use_acc=i > 0,
                             is_async=True)
        dots = warpgroup_mma_wait(num_outstanding=0, deps=(dots,))
    return dots


@gluon.jit
def _page_best(q_smem, keys_smem, page, sel, pos, j, reach, low):
    """Max logit of each dot row ``sel`` selects over block ``j``'s tokens from its loaded
    page (``index_scores_triton.folded_row_maxima``): f32 [128], -inf for the other rows."""
    codes, scale_words, group_bytes = page
    ref, deepest, first_nan = _page_span(scale_words, reach, j)
    expo = ref - 127 + 6 - mxfp4.FOLD_SHIFT
    dots = _page_dots(q_smem, keys_smem, codes, group_bytes, ref, deepest // mxfp4.FOLD_BAND + 1)
    tok = j * PAGE_TOKENS + gl.arange(0, PAGE_TOKENS, layout=TOKEN_SLICE)
    return folded_row_maxima(dots, expo, j * PAGE_TOKENS + first_nan, sel, pos, tok,
                             j * PAGE_TOKENS + (PAGE_TOKENS - 1) <= low, True)


@gluon.jit
def _span_combine(hi_a, lo_a, rlo_a, rhi_a, hi_b, lo_b, rlo_b, rhi_b):
    """Combine of :func:`_tile_span`'s reduction."""
    return (gl.maximum(hi_a, hi_b), gl.minimum(lo_a, lo_b), gl.minimum(rlo_a, rlo_b),
            gl.maximum(rhi_a, rhi_b))


@gluon.jit
def _tile_span(live, pos, req, B):
    """The live rows' largest and smallest position (``_row_span``'s ``reach``, ``low``) and
    smallest and largest request (``B`` and -1 where none is live), in one reduction across
    the tile instead of four."""
    reach, low, req_lo, req_hi = gl.reduce(
        (gl.where(live, pos, -1), gl.where(live, pos, 2**31 - 1), gl.where(live, req, B),
         gl.where(live, req, -1)), 0, _span_combine)
    return reach, gl.where(reach < 0, reach, low), req_lo, req_hi


@gluon.jit
def _query_tile(q_smem, q_ptr, first_row, T, H: gl.constexpr, ROWS: gl.constexpr,
                ROUND_Q: gl.constexpr):
    """The tile's query rows ``[128, 128]`` into ``q_smem`` as fp16 (a bf16 query rounded to
    e4m3, an e4m3 one converted exactly; zeros for rows past the tile or ``T``)."""
    row, head, ok = tile_row_ids(gl.arange(0, DOT_ROWS, layout=gl.SliceLayout(1, QUERY)),
                                 first_row, T, H, ROWS)
    d = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, QUERY))
    x = gl.load(q_ptr + (row.to(gl.int64) * H + head)[:, None] * HEAD_DIM + d[None, :],
                mask=ok[:, None], other=0.0)
    if ROUND_Q:
        q_smem.store(mxfp4.round_e4m3(x.to(gl.float32), True).to(gl.float16))
    else:
        q_smem.store(x.to(gl.float16))
    fence_async_shared()


@gluon.jit
def index_prefill_kernel(q_ptr, pool_ptr, table_ptr, pos_ptr, req_ptr, out_ptr, T, B, W, P,
                         NB, score_scale, H: gl.constexpr, ROWS: gl.constexpr,
                         BLOCKS: gl.constexpr, ROUND_Q: gl.constexpr):
    """``out f32[H, T, NB]``; q ``[T, H, 128]``, pool ``u8[P, 8704]``, table ``s32[B, W]``,
    positions and requests ``s32[T]``. Program ``(i, b)`` of a grid ``(tiles, ..)``: rows
    ``(tiles - 1 - i) * ROWS ..`` (all ``H`` heads, ``ROWS * H <= 128`` dot rows) against
    blocks ``b * BLOCKS ..``. A tile of one request's rows walks its blocks with the next
    block's page in flight; a tile across requests (a chunk's end) scores each request's page
    of a block in turn."""
    # Tiles in reverse launch order: in a causal prompt the last tiles reach the most
    # blocks, so each block range's programs for them start first and the first tiles'
    # (empty: past their rows' reach) programs last, instead of taking SM slots that later
    # working programs wait for (bench/history/2026-12-03.md, sixteenth session, "What was
    # wrong": b1 q4096 ctx 8K 27.9 -> 25.5 us).
    first_row = (gl.num_programs(0) - 1 - gl.program_id(0)) * ROWS
    row, head, row_ok, pos, req, live = tile_rows(gl.arange(0, DOT_ROWS, layout=ROW_SLICE),
                                                  first_row, pos_ptr, req_ptr, T, B, H, ROWS)
    q_smem = gl.allocate_shared_memory(gl.float16, [DOT_ROWS, HEAD_DIM], OPERAND)
    keys_smem = gl.allocate_shared_memory(gl.float16, [PAGE_TOKENS, HEAD_DIM], OPERAND)
    reach, low, req_lo, req_hi = _tile_span(live, pos, req, B)
    out = out_ptr + head.to(gl.int64) * T * NB + row.to(gl.int64) * NB
    first = gl.program_id(1) * BLOCKS
    if req_lo == req_hi:  # one request's rows: its pages, the next one in flight
        page_ptr, ok = _block_page(pool_ptr, table_ptr, req_lo, reach, first, NB, W, P)
        page = _page_loads(page_ptr, ok)
        # the query tile is loaded and rounded while the first page's loads are in flight
        _query_tile(q_smem, q_ptr, first_row, T, H, ROWS, ROUND_Q)
        for jj in range(BLOCKS):
            j = first + jj
            next_ptr, next_ok = _block_page(pool_ptr, table_ptr, req_lo, reach, j + 1, NB, W, P)
            following = _page_loads(next_ptr, next_ok & (jj + 1 < BLOCKS))
            best = gl.full((DOT_ROWS,), float("-inf"), gl.float32, layout=ROW_SLICE)
            if ok:
                best = _page_best(q_smem, keys_smem, page, live, pos, j, reach, low)
            gl.store(out + j, best * score_scale, mask=row_ok & (j < NB))
            page, ok = following, next_ok & (jj + 1 < BLOCKS)
    else:  # rows of several requests: each request's page of a block in turn
        _query_tile(q_smem, q_ptr, first_row, T, H, ROWS, ROUND_Q)
        for jj in range(BLOCKS):
            j = first + jj
            best = gl.full((DOT_ROWS,), float("-inf"), gl.float32, layout=ROW_SLICE)
            if (j < NB) & (j * PAGE_TOKENS <= reach):
                for req_r in range(req_lo, req_hi + 1):
                    sel = live & (req == req_r)
                    sel_reach, sel_low = _row_span(sel, pos)
                    page_ptr, ok = _block_page(pool_ptr, table_ptr, req_r, sel_reach, j, NB,
                                               W, P)
                    if ok:
                        page = _page_loads(page_ptr, ok)
                        best = gl.maximum(
                            best, _page_best(q_smem, keys_smem, page, sel, pos, j, sel_reach,
                                             sel_low), propagate_nan=tl.PropagateNan.ALL)
            gl.store(out + j, best * score_scale, mask=row_ok & (j < NB))
