"""Gluon kernel (CUDA sm_80+): ``index_scores`` on decode tiles of 2 to 8 dot rows (``S * H``),
a page's 128 tokens as the tensor cores' M and the query rows as their N.

Why: as the 16-row operand of ``mma.sync.m16n8k16`` (the Triton tile)
a decode tile of 4 or 8 query rows wastes three quarters or half of every MMA and of the
accumulator its epilogue walks (group scales, masks, maxima); as the 8-column operand it wastes
at most half of an accumulator half that size (3/4 at 2 rows). The keys (the M side) are
decoded by the threads that hold them: each thread loads exactly the code words whose nibbles
its A-operand registers hold (:data:`WORDS`), decodes them in place (``mxfp4._FP16_PAIRS``:
fp16 ``e2m1 * 2**-14``) and the query's columns are permuted to match
(:func:`key_column`; the dot sums over the columns, so any order that pairs each
query element with its key element is the same dot). A program scores up to ``BLOCKS``
consecutive blocks of one row tile, loads the query once for them, keeps the next block's
page in flight while it scores one, and keeps each warp's row maxima of every block in shared
memory (:func:`_warp_maxima`), taking the maximum across the warps once for all the blocks
(:func:`_store_slots`) instead of once, with its barriers, per block.

Scores are those of the group-dot tilings (SPEC §4, §4.1, §5, §9.2): per scale group two
``K = 16`` dots (low, then high nibbles), each group's sum rescaled by ``2**(s_g - top)``
(``top``: the token's largest byte, capped at 240) and the token's sum by ``2**(top - 113)``;
NaN for a token with a scale byte 255, an infinite logit made NaN, the maximum over the tokens
each row sees with NaN kept. The four lanes of a quad hold the same four tokens, so each
computes one token's factors and shuffles them to the others (:data:`_OWN_FACTORS`). The
plain ``triton.jit`` helpers (:func:`word_bytes`, :func:`token_order`) hold the operand order,
so Triton's interpreter checks it in the tests; ``tests/test_ptx_decode.py`` runs the
factors' PTX.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2

from jax_mxfp4._src.ops.index_scores.triton_kernel import (
    _block_page,
    _max_nan,
    _poison_infinite,
    _row_span,
    tile_rows,
)
from jax_mxfp4._src.triton import mxfp4
from jax_mxfp4._src.triton.mxfp4 import (
    GROUP_DATA_BYTES,
    GROUP_WORDS,
    HEAD_DIM,
    MX_BLOCK,
    PAGE_TOKENS,
    TOKEN_WORDS,
    WORD_BYTES,
)


@triton.jit
def key_column(v, nib: tl.constexpr):
    """The element of a scale group (0..31) that virtual column ``v`` (0..15) of the group's
    low-nibble (``nib = 0``) or high-nibble dot holds: virtual ``k = 8 * b1 + 2 * c + b0``
    holds element ``8 * c + 4 * b1 + 2 * b0 + nib`` of the group: code word ``c``, byte bits
    ``b0``, ``b1`` as the decode's output registers hold them (:data:`WORDS`), so nothing is
    repacked. Plain ``triton.jit`` (elementwise, no layout), so the interpreter runs it in
    the tests."""
    b1 = v // 8
    c = (v // 2) % 4
    b0 = v % 2
    return 8 * c + 4 * b1 + 2 * b0 + nib


WARPS = 4
"""Warps per program: warp ``w`` holds tokens ``16w .. 16w + 15`` and ``64 + 16w ..`` of a
page (the M tiles of its two MMAs per K step). Eight warps measured slower (53.0 against 41.6
us at b8 S4 128K: bench/history/2026-12-01.md, sixth session, "Decode tiles with the page's
tokens as the MMA's M")."""

TILE_WARPS = gl.constexpr(WARPS)
MAX_DOT_ROWS = gl.constexpr(8)
"""The MMA's N: the dot rows (query rows times heads) a tile holds at most."""

ACC = gl.constexpr(gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[WARPS, 1],
                                             instr_shape=[16, 8]))
KEYS = gl.constexpr(gl.DotOperandLayout(operand_index=0, parent=ACC.value, k_width=2))
QUERY = gl.constexpr(gl.DotOperandLayout(operand_index=1, parent=ACC.value, k_width=2))
WORDS = gl.constexpr(gl.DistributedLinearLayout(
    reg_bases=[[8, 0], [64, 0]], lane_bases=[[0, 1], [0, 2], [1, 0], [2, 0], [4, 0]],
    warp_bases=[[16, 0], [32, 0]], block_bases=[], shape=[PAGE_TOKENS, GROUP_WORDS]))
"""A scale group's code words ``uint32 [128 tokens, 4]``: a thread holds word ``lane % 4`` of
tokens ``lane // 4 + {0, 8, 64, 72} + 16 * warp``, the rows its A-operand registers hold
(``mma.sync``'s A fragment: rows ``lane // 4`` and ``+ 8`` of each 16-row tile). Words, not
bytes, are what the walk carries to the next block: a loop carrying bytes holds each in a
register of its own and packs them again for the decode."""
SLOTS = gl.constexpr(8)
"""Blocks a program keeps its warps' maxima of in shared memory (:func:`_warp_maxima`), to
take the maximum across warps once for all of them instead of once (two barriers) per block:
``ROWS_TILE_BLOCKS_MAX``. A longer walk (a grid past 65535 programs, over 524280 blocks a
row) takes the ragged batch's walk, which reduces per block."""
STAGING = gl.constexpr(gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1,
                                               order=[1, 0]))
"""A slot ``[WARPS, 8]`` of the slots, unswizzled: the slots are row-major
``[SLOTS, WARPS, 8]``, as :data:`STAGED` reads them back whole."""
STAGED = gl.constexpr(gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1,
                                              order=[2, 1, 0]))
GATHER = gl.constexpr(gl.BlockedLayout(size_per_thread=[1, WARPS, 1], threads_per_warp=[4, 1, 8],
                                       warps_per_cta=[WARPS, 1, 1], order=[2, 1, 0]))
"""The slots ``[SLOTS, WARPS, 8]`` read back with every warp's maximum of a (block, row) in
one thread, which takes them in warp order."""
CODES = gl.constexpr(gl.DistributedLinearLayout(
    reg_bases=[[0, 1], [0, 2], [8, 0], [64, 0]],
    lane_bases=[[0, 4], [0, 8], [1, 0], [2, 0], [4, 0]],
    warp_bases=[[16, 0], [32, 0]], block_bases=[], shape=[PAGE_TOKENS, GROUP_DATA_BYTES]))
"""The same words as bytes ``uint8 [128 tokens, 16]`` (byte ``4c + b`` is byte ``b`` of word
``c``), four to a thread: the decode's input."""


@triton.jit
def word_bytes(words):
    """Code words ``[N, W]`` -> their bytes ``[N, 4 W]`` (byte ``4c + b``: byte ``b`` of word
    ``c``, little-endian), as the page holds them. Plain ``triton.jit``: the interpreter runs
    it in the tests."""
    b0, b1 = (words & 0xFF).to(tl.uint8), ((words >> 8) & 0xFF).to(tl.uint8)
    b2, b3 = ((words >> 16) & 0xFF).to(tl.uint8), (words >> 24).to(tl.uint8)
    # join stacks on a new last axis: [N, W, 2 (byte bit 1), 2 (byte bit 0)]
    return tl.reshape(tl.join(tl.join(b0, b2), tl.join(b1, b3)),
                      (words.shape[0], WORD_BYTES * words.shape[1]))


@triton.jit
def token_order(half):
    """One nibble of each byte ``[N tokens, 16 bytes]`` -> ``[N, 16 virtual k]`` in
    ``key_column`` order (``k = 8 * b1 + 2 * c + b0`` for byte ``2 * b1 + b0`` of word
    ``c``). Plain ``triton.jit``, as :func:`word_bytes`."""
    quads = tl.reshape(half, (half.shape[0], GROUP_WORDS, 2, 2))  # [tok, c, b1, b0]
    return tl.reshape(tl.permute(quads, (0, 2, 1, 3)), (half.shape[0], GROUP_DATA_BYTES))


@gluon.jit
def _key_operands(words):
    """A group's code words (:data:`WORDS`) -> the A operands ``fp16 [128 tok, 16 virtual k]``
    of their low and their high nibbles, decoded in the registers that hold them (the words'
    split into bytes and the decode's packing of them fold away; no data moves)."""
    raw = gl.convert_layout(word_bytes(words), CODES)
    lo, hi = gl.inline_asm_elementwise(mxfp4._FP16_PAIRS, "=r,=r,=r,=r,r", [raw],
                                       dtype=(gl.float16, gl.float16), is_pure=True, pack=4)
    return gl.convert_layout(token_order(lo), KEYS), gl.convert_layout(token_order(hi), KEYS)


@gluon.jit
def _query_operand(q_ptr, qrow, row_ok, g: gl.constexpr, nib: gl.constexpr,
                   ROUND_Q: gl.constexpr):
    """The B operand ``fp16 [16 virtual k, 8 dot rows]`` of group ``g``'s ``nib`` dot: query
    element ``32 g + key_column(k, nib)`` of each dot row (zeros where not ``row_ok``); a bf16
    query rounded to e4m3 (``ROUND_Q``), an e4m3 one converted exactly."""
    k = gl.arange(0, GROUP_DATA_BYTES, layout=gl.SliceLayout(1, QUERY))
    rows = gl.convert_layout(qrow, gl.SliceLayout(0, QUERY))
    ok = gl.convert_layout(row_ok, gl.SliceLayout(0, QUERY))
    x = gl.load(q_ptr + rows[None, :] * HEAD_DIM + MX_BLOCK * g + key_column(k, nib)[:, None],
                mask=ok[None, :], other=0.0)
    if ROUND_Q:
        return mxfp4.round_e4m3(x.to(gl.float32), True).to(gl.float16)
    return x.to(gl.float16)


@gluon.jit
def _query_operands(q_ptr, qrow, row_ok, ROUND_Q: gl.constexpr):
    """The eight B operands (groups 0..3, low then high nibbles), loaded once per program."""
    return (_query_operand(q_ptr, qrow, row_ok, 0, 0, ROUND_Q),
            _query_operand(q_ptr, qrow, row_ok, 0, 1, ROUND_Q),
            _query_operand(q_ptr, qrow, row_ok, 1, 0, ROUND_Q),
            _query_operand(q_ptr, qrow, row_ok, 1, 1, ROUND_Q),
            _query_operand(q_ptr, qrow, row_ok, 2, 0, ROUND_Q),
            _query_operand(q_ptr, qrow, row_ok, 2, 1, ROUND_Q),
            _query_operand(q_ptr, qrow, row_ok, 3, 0, ROUND_Q),
            _query_operand(q_ptr, qrow, row_ok, 3, 1, ROUND_Q))


@gluon.jit
def _group_words(page_ptr, ok, g: gl.constexpr):
    """Scale group ``g``'s code words of a page (:data:`WORDS`; zeros where not ``ok``)."""
    tok = gl.arange(0, PAGE_TOKENS, layout=gl.SliceLayout(1, WORDS))
    word = gl.arange(0, GROUP_WORDS, layout=gl.SliceLayout(0, WORDS))
    words = page_ptr.to(gl.pointer_type(gl.uint32))
    return gl.load(words + tok[:, None] * TOKEN_WORDS + GROUP_WORDS * g + word[None, :], mask=ok,
                   other=0)


@gluon.jit
def _page_loads(pool_ptr, table_ptr, req, reach, j, NB, W, P):
    """Issue block ``j``'s page loads for request ``req`` (whose rows reach position
    ``reach``): the four groups' code words, the scale words, and whether the page is scored
    (``index_scores_triton._block_page``'s rule)."""
    page_ptr, ok = _block_page(pool_ptr, table_ptr, req, reach, j, NB, W, P)
    tok = gl.arange(0, PAGE_TOKENS, layout=gl.SliceLayout(1, ACC))
    scale_words = page_ptr.to(gl.pointer_type(gl.uint32)) + mxfp4.PAGE_SCALE_OFFSET // WORD_BYTES
    scales = gl.load(scale_words + tok, mask=ok, other=0)
    return (_group_words(page_ptr, ok, 0), _group_words(page_ptr, ok, 1),
            _group_words(page_ptr, ok, 2), _group_words(page_ptr, ok, 3), scales, ok)


@gluon.jit
def _group_dot(words, q_lo, q_hi, zero):
    """One scale group's dots ``f32 [128 tok, 8 rows]``: two ``K = 16`` dots (low, then high
    nibbles) on keys decoded in place."""
    lo, hi = _key_operands(words)
    return mma_v2(hi, q_hi, mma_v2(lo, q_lo, zero))


def _own_factors_ptx() -> str:
    """PTX of the token factors of a quad computed once per token instead of by all four
    lanes that hold it. The scale words ``$20..$23`` are a thread's four tokens (the same in
    the four lanes of a quad: ``SliceLayout(1, ACC)``); lane ``4 q + i`` (``i`` in ``$24``:
    :data:`_QUAD_LANES`) computes token ``i``'s group factors ``2**(s_g - top)`` (``$0``,
    ``$4``, ``$8``, ``$12``; 0 below ``2**-126``) and its factor ``2**(top - 113)`` (``$16``;
    NaN for a NaN-key token, a scale byte 255), so that a logit ``sum_g dots_g *
    2**(s_g - 113)`` is the group-factor sum times one factor. ``top = min(smax, 240)``
    (``smax``: the token's largest byte) keeps the factor a normal fp32 and puts the rest of
    ``smax``, at most 14 binades, into the group factors: where ``smax <= 240`` the logits are
    the relative rescaling's (``2**(s_g - smax)``, then ``2**(smax - 113)``) bit for bit. The
    other three registers of each output repeat the first: :data:`_QUAD_SHARE` reads only the
    first, so ptxas drops them."""
    lines = ["{ .reg .b32 w, b, sm, top, t; .reg .pred p<4>;",
             "setp.eq.u32 p1, $24, 1; setp.eq.u32 p2, $24, 2; setp.eq.u32 p3, $24, 3;",
             "selp.b32 w, $21, $20, p1; selp.b32 w, $22, w, p2; selp.b32 w, $23, w, p3;",
             "and.b32 sm, w, 255; bfe.u32 b, w, 8, 8; max.u32 sm, sm, b;",
             "bfe.u32 b, w, 16, 8; max.u32 sm, sm, b; shr.b32 b, w, 24; max.u32 sm, sm, b;",
             "min.u32 top, sm, 240; add.u32 t, top, 14; shl.b32 $16, t, 23;",
             "setp.eq.u32 p0, sm, 255; selp.b32 $16, 0x7FC00000, $16, p0;"]
    for g in range(4):
        lines.append(f"bfe.u32 b, w, {8 * g}, 8; sub.s32 t, b, top; max.s32 t, t, -127;"
                     f" add.s32 t, t, 127; shl.b32 ${4 * g}, t, 23;")
    for v in range(5):
        lines.append(" ".join(f"mov.b32 ${4 * v + k}, ${4 * v};" for k in (1, 2, 3)))
    return "\n".join(lines) + "}"


_OWN_FACTORS = gl.constexpr(_own_factors_ptx())
_OWN_FACTOR_OPERANDS = gl.constexpr(",".join(["=r"] * 20 + ["r"] * 8))
_QUAD_LANES = gl.constexpr(
    "{ .reg .b32 l; mov.u32 l, %laneid; and.b32 $4, l, 3; mov.b32 $5, $4; mov.b32 $6, $4;"
    " mov.b32 $7, $4; and.b32 l, l, 0xFFFFFFFC; mov.b32 $0, l; add.u32 $1, l, 1;"
    " add.u32 $2, l, 2; add.u32 $3, l, 3; }")
"""A thread's quad: the lanes ``4 q + k`` of its quad in register ``k`` (``$0..$3``) and its
own ``k = lane % 4`` in all four (``$4..$7``). Taken once per program (ptxas keeps a
``%laneid`` read and what follows from it inside the block walk where the factors' PTX
reads it)."""
_QUAD_SHARE = gl.constexpr(
    " ".join(f"shfl.sync.idx.b32 ${k}, $4, ${8 + k}, 0x1f, 0xffffffff;" for k in range(4)))
"""Each of a thread's four tokens' value (``$0..$3``) from the lane of its quad that owns
the token (:data:`_OWN_FACTORS`): the value in ``$4`` of lane ``$8 + k``."""


@gluon.jit
def _quad_lanes():
    """:data:`_QUAD_LANES` as two int32 ``[128]`` tensors in ``SliceLayout(1, ACC)``, (lanes,
    own): values that differ between the lanes of a quad, so only the factors' PTX reads
    them."""
    shape = gl.arange(0, PAGE_TOKENS, layout=gl.SliceLayout(1, ACC))
    return gl.inline_asm_elementwise(_QUAD_LANES, "=r,=r,=r,=r,=r,=r,=r,=r,r,r,r,r", [shape],
                                     dtype=(gl.int32, gl.int32), is_pure=True, pack=4)


@gluon.jit
def _quad_shared(own, lanes):
    """``float32 [128]`` (``SliceLayout(1, ACC)``): each token's value from the lane of its
    quad that computed it (``own``: an output of :data:`_OWN_FACTORS`; ``lanes``: of
    :func:`_quad_lanes`)."""
    return gl.inline_asm_elementwise(_QUAD_SHARE, "=r,=r,=r,=r,r,r,r,r,r,r,r,r", [own, lanes],
                                     dtype=gl.float32, is_pure=True, pack=4)


@gluon.jit
def _page_logits(page, qs, quad, j, pos, low):
    """Logits ``f32 [128 tok, 8 rows]`` of block ``j``'s tokens from its loaded page
    (:func:`_page_loads`), -inf where a row does not see the token. ``quad``: the program's
    :func:`_quad_lanes`. ``low``: the smallest position of the selected rows; a block below it
    is seen whole by every one of them, so it takes no token mask."""
    c0, c1, c2, c3, scales, _ = page
    zero = gl.zeros((PAGE_TOKENS, MAX_DOT_ROWS), gl.float32, layout=ACC)
    lanes, own = quad
    f0, f1, f2, f3, factor = gl.inline_asm_elementwise(
        _OWN_FACTORS, _OWN_FACTOR_OPERANDS, [scales, own], dtype=(gl.float32,) * 5,
        is_pure=True, pack=4)
    dots = _group_dot(c0, qs[0], qs[1], zero) * _quad_shared(f0, lanes)[:, None]
    dots += _group_dot(c1, qs[2], qs[3], zero) * _quad_shared(f1, lanes)[:, None]
    dots += _group_dot(c2, qs[4], qs[5], zero) * _quad_shared(f2, lanes)[:, None]
    dots += _group_dot(c3, qs[6], qs[7], zero) * _quad_shared(f3, lanes)[:, None]
    logits = _poison_infinite(dots * _quad_shared(factor, lanes)[:, None])
    if j * PAGE_TOKENS + (PAGE_TOKENS - 1) > low:
        tok = j * PAGE_TOKENS + gl.arange(0, PAGE_TOKENS, layout=gl.SliceLayout(1, ACC))
        logits = gl.where(tok[:, None] <= pos[None, :], logits, float("-inf"))
    return logits


@gluon.jit
def _page_maxima(page, qs, quad, j, pos, sel, low):
    """Max logit of each selected dot row over block ``j``'s tokens (:func:`_page_logits`):
    ``f32 [8]``, -inf for the other rows and where the page is not scored."""
    best = gl.reduce(_page_logits(page, qs, quad, j, pos, low), 0, _max_nan)
    return gl.where(sel & page[5], best, float("-inf"))


@gluon.jit
def _warp_maxima(page, qs, quad, j, pos, low):
    """Each warp's max logit of each dot row over its 32 of block ``j``'s tokens: ``f32
    [WARPS, 8]``, -inf where the page is not scored. No data crosses warps: a token's row of
    the accumulator is ``64 a + 16 w + c`` (``a``: register, ``w``: warp, ``c``: lane and
    register), so the reshape moves nothing and the reductions stay in the warp: the two M
    tiles in registers first, then the 16 tokens across lanes (half the shuffles of the other
    order)."""
    logits = gl.reshape(_page_logits(page, qs, quad, j, pos, low),
                        [2, TILE_WARPS, 16, MAX_DOT_ROWS])
    best = gl.reduce(gl.reduce(logits, 0, _max_nan), 1, _max_nan)
    return gl.where(page[5], best, float("-inf"))


@gluon.jit
def _store_slots(slots, out, first, NB, BLOCKS: gl.constexpr, live, row_ok, score_scale):
    """Blocks ``first ..`` (``BLOCKS``, at most :data:`SLOTS`) from the warps' maxima in
    ``slots`` (``f32 [SLOTS, WARPS, 8]`` shared): each row's maximum over the warps, in warp
    order, -inf for rows not live, stored where the block exists."""
    gl.thread_barrier()
    whole = slots._reinterpret(gl.float32, [SLOTS, TILE_WARPS, MAX_DOT_ROWS], STAGED)
    best = gl.reduce(whole.load(GATHER), 1, _max_nan)  # [SLOTS, 8]
    slot_layout: gl.constexpr = gl.SliceLayout(1, GATHER)
    rows: gl.constexpr = gl.SliceLayout(0, slot_layout)
    slot = gl.arange(0, SLOTS, layout=gl.SliceLayout(1, slot_layout))
    j = first + slot
    live = gl.convert_layout(live, rows)
    best = gl.where(live[None, :], best, float("-inf"))
    out = gl.convert_layout(out, rows)
    ok = gl.convert_layout(row_ok, rows)[None, :] & ((slot < BLOCKS) & (j < NB))[:, None]
    gl.store(out[None, :] + j[:, None], best * score_scale, mask=ok)


@gluon.jit
def index_rows_kernel(q_ptr, pool_ptr, table_ptr, pos_ptr, req_ptr, out_ptr, T, B, W, P, NB,
                      score_scale, H: gl.constexpr, ROWS: gl.constexpr, BLOCKS: gl.constexpr,
                      ROUND_Q: gl.constexpr):
    """``out f32[H, T, NB]``; q ``[T, H, 128]``, pool ``u8[P, 8704]``, table ``s32[B, W]``,
    positions and requests ``s32[T]``. Program ``(i, b)``: rows ``i * ROWS ..`` (all ``H``
    heads, ``ROWS * H <= 8`` dot rows) against blocks ``b * BLOCKS ..`` (those past ``NB``
    store nothing)."""
    rows_layout: gl.constexpr = gl.SliceLayout(0, ACC)
    row, head, row_ok, pos, req, live = tile_rows(
        gl.arange(0, MAX_DOT_ROWS, layout=rows_layout), gl.program_id(0) * ROWS, pos_ptr,
        req_ptr, T, B, H, ROWS)
    qs = _query_operands(q_ptr, row.to(gl.int64) * H + head, row_ok, ROUND_Q)
    quad = _quad_lanes()
    req_lo = gl.min(gl.where(live, req, B), axis=0)
    req_hi = gl.max(gl.where(live, req, -1), axis=0)
    out = out_ptr + head.to(gl.int64) * T * NB + row.to(gl.int64) * NB
    first = gl.program_id(1) * BLOCKS
    if (req_lo == req_hi) and (BLOCKS <= SLOTS):  # request-major rows: one request's pages
        reach, low = _row_span(live, pos)
        slots = gl.allocate_shared_memory(gl.float32, [SLOTS, TILE_WARPS, MAX_DOT_ROWS], STAGING)
        page = _page_loads(pool_ptr, table_ptr, req_lo, reach, first, NB, W, P)
        for jj in range(BLOCKS):  # the next page in flight while one is scored
            after = gl.where(jj + 1 < BLOCKS, first + jj + 1, NB)  # NB: nothing loaded
            following = _page_loads(pool_ptr, table_ptr, req_lo, reach, after, NB, W, P)
            slots.index(jj).store(_warp_maxima(page, qs, quad, first + jj, pos, low))
            page = following
        _store_slots(slots, out, first, NB, BLOCKS, live, row_ok, score_scale)
    else:  # rows of several requests (a ragged batch; or more blocks than slots, past 524280
        # blocks a row): each request's page in turn, each block's maxima stored at once
        for jj in range(BLOCKS):
            j = first + jj
            best = gl.full((MAX_DOT_ROWS,), float("-inf"), gl.float32, layout=rows_layout)
            for req_r in range(req_lo, req_hi + 1):
                sel = live & (req == req_r)
                reach, low = _row_span(sel, pos)
                page = _page_loads(pool_ptr, table_ptr, req_r, reach, j, NB, W, P)
                best = gl.maximum(best, _page_maxima(page, qs, quad, j, pos, sel, low),
                                  propagate_nan=tl.PropagateNan.ALL)
            gl.store(out + j, best * score_scale, mask=row_ok & (j < NB))
