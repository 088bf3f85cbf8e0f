"""Gluon kernel (CUDA sm_80+): ``index_scores`` on decode tiles of 2 to 8 dot rows (``S * H``),
a page's 128 tokens as the tensor cores' M and the query rows as their N.

Why: as the 16-row operand of ``mma.sync.m16n8k16`` (the Triton tile and ``index_tile_gluon``)
a decode tile of 4 or 8 query rows wastes three quarters or half of every MMA and of the
accumulator its epilogue walks (group scales, masks, maxima); as the 8-column operand it wastes
at most half of an accumulator half that size (3/4 at 2 rows). The keys (the M side) are
decoded by the threads that hold them: each thread loads exactly the code words whose nibbles
its A-operand registers hold (:data:`WORDS`), decodes them in place (``mxfp4._FP16_PAIRS``:
fp16 ``e2m1 * 2**-14``) and the query's columns are permuted to match
(``index_tile_gluon.key_column``; the dot sums over the columns, so any order that pairs each
query element with its key element is the same dot). A program scores up to ``BLOCKS``
consecutive blocks of one row tile, loads the query once for them, and keeps the next block's
page in flight while it scores one.

Scores are those of the group-dot tilings (SPEC §4, §5, §15.3, §15.18): per scale group two
``K = 16`` dots (low, then high nibbles), each group's sum rescaled by ``2**(s_g - smax)``;
NaN for a token with a scale byte 255, an infinite logit made NaN, the maximum over the tokens
each row sees with NaN kept. The plain ``triton.jit`` helpers (:func:`word_bytes`,
:func:`token_order`) hold the operand order, so Triton's interpreter checks it in the tests.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2

from jax_mxfp4.gpu.kernels import mxfp4
from jax_mxfp4.gpu.kernels.index_scores import (
    _block_page,
    _max_nan,
    _poison_infinite,
    _row_span,
    tile_rows,
)
from jax_mxfp4.gpu.kernels.index_tile_gluon import key_column

WARPS = 4
"""Warps per program: warp ``w`` holds tokens ``16w .. 16w + 15`` and ``64 + 16w ..`` of a
page (the M tiles of its two MMAs per K step). Eight warps measured slower (RESULTS)."""

MAX_DOT_ROWS = gl.constexpr(8)
"""The MMA's N: the dot rows (query rows times heads) a tile holds at most."""

ACC = gl.constexpr(gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[WARPS, 1],
                                             instr_shape=[16, 8]))
KEYS = gl.constexpr(gl.DotOperandLayout(operand_index=0, parent=ACC.value, k_width=2))
QUERY = gl.constexpr(gl.DotOperandLayout(operand_index=1, parent=ACC.value, k_width=2))
WORDS = gl.constexpr(gl.DistributedLinearLayout(
    reg_bases=[[8, 0], [64, 0]], lane_bases=[[0, 1], [0, 2], [1, 0], [2, 0], [4, 0]],
    warp_bases=[[16, 0], [32, 0]], block_bases=[], shape=[128, 4]))
"""A scale group's code words ``uint32 [128 tokens, 4]``: a thread holds word ``lane % 4`` of
tokens ``lane // 4 + {0, 8, 64, 72} + 16 * warp``, the rows its A-operand registers hold
(``mma.sync``'s A fragment: rows ``lane // 4`` and ``+ 8`` of each 16-row tile). Words, not
bytes, are what the walk carries to the next block: a loop carrying bytes holds each in a
register of its own and packs them again for the decode."""
CODES = gl.constexpr(gl.DistributedLinearLayout(
    reg_bases=[[0, 1], [0, 2], [8, 0], [64, 0]],
    lane_bases=[[0, 4], [0, 8], [1, 0], [2, 0], [4, 0]],
    warp_bases=[[16, 0], [32, 0]], block_bases=[], shape=[128, 16]))
"""The same words as bytes ``uint8 [128 tokens, 16]`` (byte ``4c + b`` is byte ``b`` of word
``c``), four to a thread: the decode's input."""


@triton.jit
def word_bytes(words):
    """Code words ``[N, 4]`` -> their bytes ``[N, 16]`` (byte ``4c + b``: byte ``b`` of word
    ``c``, little-endian), as the page holds them. Plain ``triton.jit``: the interpreter runs
    it in the tests."""
    b0, b1 = (words & 0xFF).to(tl.uint8), ((words >> 8) & 0xFF).to(tl.uint8)
    b2, b3 = ((words >> 16) & 0xFF).to(tl.uint8), (words >> 24).to(tl.uint8)
    # join stacks on a new last axis: [N, 4, 2 (byte bit 1), 2 (byte bit 0)]
    return tl.reshape(tl.join(tl.join(b0, b2), tl.join(b1, b3)), (words.shape[0], 16))


@triton.jit
def token_order(half):
    """One nibble of each byte ``[N tokens, 16 bytes]`` -> ``[N, 16 virtual k]`` in
    ``key_column`` order (``k = 8 * b1 + 2 * c + b0`` for byte ``2 * b1 + b0`` of word
    ``c``). Plain ``triton.jit``, as :func:`word_bytes`."""
    quads = tl.reshape(half, (half.shape[0], 4, 2, 2))  # [tok, c, b1, b0]
    return tl.reshape(tl.permute(quads, (0, 2, 1, 3)), (half.shape[0], 16))


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
    k = gl.arange(0, 16, layout=gl.SliceLayout(1, QUERY))
    rows = gl.convert_layout(qrow, gl.SliceLayout(0, QUERY))
    ok = gl.convert_layout(row_ok, gl.SliceLayout(0, QUERY))
    x = gl.load(q_ptr + rows[None, :] * 128 + 32 * g + key_column(k, nib)[:, None],
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
    tok = gl.arange(0, 128, layout=gl.SliceLayout(1, WORDS))
    word = gl.arange(0, 4, layout=gl.SliceLayout(0, WORDS))
    words = page_ptr.to(gl.pointer_type(gl.uint32))
    return gl.load(words + tok[:, None] * 16 + 4 * g + word[None, :], mask=ok, other=0)


@gluon.jit
def _page_loads(pool_ptr, table_ptr, req, reach, j, NB, W, P):
    """Issue block ``j``'s page loads for request ``req`` (whose rows reach position
    ``reach``): the four groups' code words, the scale words, and whether the page is scored
    (``index_scores._block_page``'s rule)."""
    page_ptr, ok = _block_page(pool_ptr, table_ptr, req, reach, j, NB, W, P)
    tok = gl.arange(0, 128, layout=gl.SliceLayout(1, ACC))
    scale_words = page_ptr.to(gl.pointer_type(gl.uint32)) + mxfp4.SCALE_OFFSET // 4
    scales = gl.load(scale_words + tok, mask=ok, other=0)
    return (_group_words(page_ptr, ok, 0), _group_words(page_ptr, ok, 1),
            _group_words(page_ptr, ok, 2), _group_words(page_ptr, ok, 3), scales, ok)


@gluon.jit
def _group_dot(words, q_lo, q_hi, zero):
    """One scale group's dots ``f32 [128 tok, 8 rows]``: two ``K = 16`` dots (low, then high
    nibbles) on keys decoded in place."""
    lo, hi = _key_operands(words)
    return mma_v2(hi, q_hi, mma_v2(lo, q_lo, zero))


@gluon.jit
def _page_maxima(page, qs, j, pos, sel, low):
    """Max logit of each selected dot row over block ``j``'s tokens from its loaded page
    (:func:`_page_loads`): ``f32 [8]``, -inf for the other rows and where the page is not
    scored. ``low``: the smallest position of the selected rows; a block below it is seen
    whole by every one of them, so it takes no token mask."""
    c0, c1, c2, c3, scales, ok = page
    zero = gl.zeros((128, MAX_DOT_ROWS), gl.float32, layout=ACC)
    s0, s1 = mxfp4.scale_byte(scales, 0), mxfp4.scale_byte(scales, 1)
    s2, s3 = mxfp4.scale_byte(scales, 2), mxfp4.scale_byte(scales, 3)
    smax = gl.maximum(gl.maximum(s0, s1), gl.maximum(s2, s3))
    dots = _group_dot(c0, qs[0], qs[1], zero) * mxfp4.pow2(s0 - smax)[:, None]
    dots += _group_dot(c1, qs[2], qs[3], zero) * mxfp4.pow2(s1 - smax)[:, None]
    dots += _group_dot(c2, qs[4], qs[5], zero) * mxfp4.pow2(s2 - smax)[:, None]
    dots += _group_dot(c3, qs[6], qs[7], zero) * mxfp4.pow2(s3 - smax)[:, None]
    dots = gl.where((smax == mxfp4.NAN_BYTE)[:, None], float("nan"), dots)
    logits = _poison_infinite(mxfp4.mul_pow2(dots, (smax - 127 + 14)[:, None]))
    if j * 128 + 127 <= low:
        best = gl.reduce(logits, 0, _max_nan)
    else:
        tok = j * 128 + gl.arange(0, 128, layout=gl.SliceLayout(1, ACC))
        best = gl.reduce(gl.where(tok[:, None] <= pos[None, :], logits, float("-inf")), 0,
                         _max_nan)
    return gl.where(sel & ok, best, float("-inf"))


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
    req_lo = gl.min(gl.where(live, req, B), axis=0)
    req_hi = gl.max(gl.where(live, req, -1), axis=0)
    out = out_ptr + head.to(gl.int64) * T * NB + row.to(gl.int64) * NB
    first = gl.program_id(1) * BLOCKS
    if req_lo == req_hi:  # rows are request-major: one request's pages, the next in flight
        reach, low = _row_span(live, pos)
        page = _page_loads(pool_ptr, table_ptr, req_lo, reach, first, NB, W, P)
        for jj in range(BLOCKS):
            j = first + jj
            after = gl.where(jj + 1 < BLOCKS, j + 1, NB)  # NB: past the end, nothing loaded
            following = _page_loads(pool_ptr, table_ptr, req_lo, reach, after, NB, W, P)
            best = _page_maxima(page, qs, j, pos, live, low)
            gl.store(out + j, best * score_scale, mask=row_ok & (j < NB))
            page = following
    else:  # rows of several requests (a ragged batch): each request's page in turn
        for jj in range(BLOCKS):
            j = first + jj
            best = gl.full((MAX_DOT_ROWS,), float("-inf"), gl.float32, layout=rows_layout)
            for req_r in range(req_lo, req_hi + 1):
                sel = live & (req == req_r)
                reach, low = _row_span(sel, pos)
                page = _page_loads(pool_ptr, table_ptr, req_r, reach, j, NB, W, P)
                best = gl.maximum(best, _page_maxima(page, qs, j, pos, sel, low),
                                  propagate_nan=tl.PropagateNan.ALL)
            gl.store(out + j, best * score_scale, mask=row_ok & (j < NB))
