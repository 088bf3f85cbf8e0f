"""Gluon kernel (CUDA sm_80+, opt-in: ``cuda_kernels="gluon"``): ``index_scores`` on one-row
tiles (S = 1, H = 1) of an e4m3-exact query, the group dots as exact int8 tensor-core dots
(``mma.sync.m16n8k32.s8``) with a page's 128 tokens as the MMA's M.

Why: the CUDA-core one-row scorer (``row_dot``) spends three ``dp4a`` per four elements on
its exact integer dots, a fifth of its instructions; here 32 ``IMMA`` a warp and block take
their place (560 instructions a warp and block against ~650). Measured on the H200 it is not
faster: at 8K contexts its accumulator and the next page in flight (114 registers on two
warps) leave fewer blocks resident than the one-warp Triton program, and the larger cells
are bound by the page bytes (bench/RESULTS.md, twenty-second session).

The integers are the same (``row_dot``'s reasoning: ``x = q * 2**9`` is an integer below
``2**18``, a key element the unsigned byte ``12 + 2 * e2m1``), and so is everything after
them: each group's dot becomes fp32 and takes ``mxfp4.row_group_sum`` and the one-row
epilogue in the Triton kernel's layout, so a block's score is the Triton one-row kernel's bit
for bit on any data (``tests/gpu`` compares them).

How the group dots become one MMA (:func:`query_operand`): the MMA's N holds 16 columns,
``(slice, group)`` pairs, and the query operand of a group's column is zero outside the
group's elements, so one ``K = 128`` dot over all four groups keeps them apart. The four
lanes of a quad hold, in the A fragment, the same tokens and a quarter of each ``K = 32``
step each; lane ``c`` is given group ``c``'s elements in every step (its 16-byte load is the
token's group ``c``), so its accumulator columns ``2c, 2c + 1`` and ``8 + 2c, 9 + 2c`` are
group ``c``'s and its combine (:func:`group_dots`) stays in the thread. The query's byte
slices (int8 dots are signed): ``byte0(x) - 128``, ``byte1(x) - 128``, the signed
``byte2(x)``, and a column of ones that puts back the ``128`` of the first two (``x = byte0
+ 256 byte1 + 65536 byte2``).

The plain ``triton.jit`` helpers (:func:`key_order`, :func:`element_of_k`,
:func:`query_operand`, :func:`group_dots`, :func:`group_starts`) hold every order, so
Triton's interpreter checks them (``tests/test_gluon_tile.py``); ``tests/test_ptx_decode.py``
runs the key decode's PTX.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2

from jax_mxfp4.gpu.kernels import mxfp4, row_dot
from jax_mxfp4.gpu.kernels.index_rows_gluon import word_bytes
from jax_mxfp4.gpu.kernels.index_scores_triton import _block_page, row_live, row_logit_max

WARPS = 2
"""Warps per program: warp ``w`` holds tokens ``16w + 32i .. + 15`` (``i`` = 0..3) of a page,
the A fragment's rows (two warps keep a thread's accumulator at 32 registers)."""

COLUMNS = gl.constexpr(16)
"""The MMA's N: four groups times the query's four operand columns (two byte slices less 128,
the signed high byte, ones)."""
ONES_WEIGHT = tl.constexpr(128 + 128 * 256)
"""What the ones column's dot (the group's key sum) is worth in :func:`group_dots`: the 128
taken off each of the two low byte slices."""

ACC = gl.constexpr(gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[WARPS, 1],
                                             instr_shape=[16, 8]))
KEYS = gl.constexpr(gl.DotOperandLayout(operand_index=0, parent=ACC.value, k_width=4))
QUERY = gl.constexpr(gl.DotOperandLayout(operand_index=1, parent=ACC.value, k_width=4))
WORDS = gl.constexpr(gl.DistributedLinearLayout(
    reg_bases=[[0, 1], [0, 2], [8, 0], [32, 0], [64, 0]],
    lane_bases=[[0, 4], [0, 8], [1, 0], [2, 0], [4, 0]],
    warp_bases=[[16, 0]], block_bases=[], shape=[128, 16]))
"""A page's code words ``uint32 [128 tokens, 16]``: a thread holds words ``4c .. 4c + 3``
(group ``c = lane % 4``, one 16-byte load) of tokens ``lane // 4 + {0, 8, 32, 64 ..} +
16 * warp``, the rows its A-operand registers hold."""
CODES = gl.constexpr(gl.DistributedLinearLayout(
    reg_bases=[[0, 1], [0, 2], [0, 4], [0, 8], [8, 0], [32, 0], [64, 0]],
    lane_bases=[[0, 16], [0, 32], [1, 0], [2, 0], [4, 0]],
    warp_bases=[[16, 0]], block_bases=[], shape=[128, 64]))
"""The same words as bytes ``uint8 [128, 64]`` (byte ``4w + b``: byte ``b`` of word ``w``):
the decode's input, four to a register."""
TOKENS = gl.constexpr(gl.BlockedLayout(size_per_thread=[1, 4], threads_per_warp=[32, 1],
                                       warps_per_cta=[WARPS, 1], order=[1, 0]))
"""``[128 tokens, 4 groups]`` with a token's four groups in one thread: the Triton one-row
kernel's layout for the group sum (``mxfp4.row_group_sum`` adds a token's groups in order
within a thread), so the sums are its bits."""
STAGE = gl.constexpr(gl.BlockedLayout(size_per_thread=[4, 1], threads_per_warp=[8, 4],
                                      warps_per_cta=[WARPS, 1], order=[0, 1]))
"""``[128 k, 16 columns]`` of the query operand while it is built: every thread a share (four
consecutive ``k`` of a column, one register once packed) before it moves to :data:`QUERY`."""

# A code word's ($2) eight nibbles as the bytes 12 + 2 * e2m1 (row_dot's decode, the tables'
# first words $3 and $4 in registers: _TABLE_WORDS): $0 elements 0-3, $1 elements 4-7.
_OFFSET_KEYS = tl.constexpr(
    "{ .reg .b32 x, wh, xh, p, n, t0, t1, t2, t3;\n" + row_dot.tables_ptx("$3", "$4")
    + row_dot.key_bytes_ptx("$2", "$0", "$1") + "}")


@gluon.jit
def _table_words():
    """The first words of :data:`_OFFSET_KEYS`' two tables (``row_dot._TABLE_WORDS``: made
    from ``%laneid`` so that ptxas keeps them in registers instead of copying an immediate
    before every permute), as uint8 ``[128, 64]`` tensors in :data:`CODES` whose every four
    bytes are the word. Taken once a program."""
    zero = gl.full([128, 64], 0, gl.uint8, layout=CODES)
    return gl.inline_asm_elementwise(row_dot._TABLE_WORDS, "=r,=r,r", [zero],
                                     dtype=(gl.uint8, gl.uint8), is_pure=True, pack=4)


@triton.jit
def key_order(lo, hi):
    """The A operand ``[N tokens, 128 k]`` from the decoded halves of a page's 16 code words a
    token (``lo``/``hi`` ``[N, 64]``: at byte ``4w + p`` the key of element ``p``/``4 + p`` of
    word ``w``): ``k = 32 j + 16 h + 4 c + p`` holds element ``4h + p`` of word ``4c + j``
    (group ``c``'s elements ``8j + 4h + p``: :func:`element_of_k`), so lane ``c`` of a quad,
    which holds ``k = 4c ..`` and ``16 + 4c ..`` of every ``K = 32`` step, holds group ``c``."""
    lo4 = tl.reshape(lo, (lo.shape[0], 4, 4, 4))  # [N, c, j, p]
    hi4 = tl.reshape(hi, (hi.shape[0], 4, 4, 4))
    both = tl.join(lo4, hi4)  # [N, c, j, p, h]
    return tl.reshape(tl.permute(both, (0, 2, 4, 1, 3)), (lo.shape[0], 128))  # [N, j, h, c, p]


@triton.jit
def element_of_k(k):
    """The group element (0..127) that operand position ``k`` of :func:`key_order` holds."""
    j, h, c, p = k // 32, (k // 16) % 2, (k // 4) % 4, k % 4
    return 32 * c + 8 * j + 4 * h + p


@triton.jit
def column_parts(n):
    """Column ``n`` (0..15) of the MMA: its group and which query part it holds (0: the low
    byte less 128, 1: the middle byte less 128, 2: the signed high byte, 3: ones). A lane of a
    quad holds columns ``2c, 2c + 1`` and ``8 + 2c, 9 + 2c``: group ``c``'s four parts."""
    return (n % 8) // 2, n % 2 + 2 * (n // 8)


@triton.jit
def query_operand(x, k, n):
    """The B operand ``[128 k, 16 n]`` as bytes (int32 0..255; the dot reads them as int8)
    from ``x`` (int32 ``[128]``, position ``k``'s element :func:`element_of_k` times
    ``2**9``) at positions ``k`` ``[128]`` and columns ``n`` ``[16]``: column ``n``'s part of
    ``x`` (:func:`column_parts`; ``byte ^ 0x80`` is ``byte - 128`` as int8, the high byte as
    int8 is ``x >> 16`` for ``|x| < 2**18``) where ``k`` is in its group, 0 elsewhere."""
    group, part = column_parts(n)
    shifted = (x[:, None] >> (8 * tl.minimum(part, 2))[None, :]) & 0xFF
    value = tl.where(part[None, :] < 2, shifted ^ 0x80, tl.where(part[None, :] == 2, shifted, 1))
    in_group = ((k // 4) % 4)[:, None] == group[None, :]
    return tl.where(in_group, value, 0)


@triton.jit
def group_starts(x):
    """Each group's ``-12 * sum(x)`` (int32 ``[4]``) from ``x`` in operand order (int32
    ``[128]``, position ``k`` element :func:`element_of_k`): what :func:`group_dots` lacks of
    ``sum(2 * e2m1 * x)`` (the keys' offset, ``row_dot.KEY_OFFSET``)."""
    per_step = tl.sum(tl.sum(tl.reshape(x, (4, 2, 4, 4)), axis=3), axis=1)  # [j, c]
    return tl.sum(per_step, axis=0) * -row_dot.KEY_OFFSET


@triton.jit
def group_dots(acc):
    """Each token's group dots ``sum((12 + 2 * e2m1) * x)`` (int32 ``[N, 4]``; ``-12 *
    sum(x)`` short of ``sum(2 * e2m1 * x)``) from the MMA's ``[N, 16]`` accumulator
    (:func:`column_parts`: ``lo = sum(key * (byte0 - 128))``, ``mid``, ``hi``, ``ones =
    sum(key)``): ``lo + 256 mid + 65536 hi + ONES_WEIGHT ones`` (int32 arithmetic, exact: the
    group's value is below ``2**28``)."""
    parts = tl.permute(tl.reshape(acc, (acc.shape[0], 2, 4, 2)), (0, 2, 1, 3))  # [N, g, t, s]
    even, odd = tl.split(parts)  # s = 0: lo (t = 0), hi (t = 1); s = 1: mid, ones
    lo, hi = tl.split(even)
    mid, ones = tl.split(odd)
    return lo + mid * 256 + hi * 65536 + ones * ONES_WEIGHT


@gluon.jit
def _query(q_ptr, row, ROUND_Q: gl.constexpr):
    """The row's query as the MMA takes it: the B operand (:func:`query_operand`, in
    :data:`QUERY`), each group's ``-12 * sum(x)`` (int32 ``[4]`` in the group sums' layout)
    and the NaN flag (fp32: NaN where an element is NaN, else 0: ``row_dot.query_slices``'
    ``nan``)."""
    k = gl.arange(0, 128, layout=gl.SliceLayout(1, STAGE))
    x = gl.load(q_ptr + row.to(gl.int64) * 128 + element_of_k(k)).to(gl.float32)
    if ROUND_Q:
        x = mxfp4.round_e4m3(x, True).to(gl.float32)
    nan = gl.sum(x * 0.0, axis=0)
    fixed = row_dot._fixed(x, True)
    n = gl.arange(0, COLUMNS, layout=gl.SliceLayout(0, STAGE))
    operand = gl.convert_layout(query_operand(fixed, k, n).to(gl.int8), QUERY)
    start = gl.convert_layout(group_starts(fixed), gl.SliceLayout(0, TOKENS))
    return operand, start, nan


@gluon.jit
def _page_loads(pool_ptr, table_ptr, req, reach, j, NB, W, P):
    """Issue block ``j``'s page loads (``index_scores_triton._block_page``'s rule): its code words
    (:data:`WORDS`), its scale bytes ``[128, 4]`` (:data:`TOKENS`), whether it is scored."""
    page_ptr, ok = _block_page(pool_ptr, table_ptr, req, reach, j, NB, W, P)
    tok = gl.arange(0, 128, layout=gl.SliceLayout(1, WORDS))
    word = gl.arange(0, 16, layout=gl.SliceLayout(0, WORDS))
    words = gl.load(page_ptr.to(gl.pointer_type(gl.uint32)) + tok[:, None] * 16
                    + word[None, :], mask=ok, other=0)
    stok = gl.arange(0, 128, layout=gl.SliceLayout(1, TOKENS))
    group = gl.arange(0, 4, layout=gl.SliceLayout(0, TOKENS))
    scales = gl.load(page_ptr + mxfp4.SCALE_OFFSET + stok[:, None] * 4 + group[None, :],
                     mask=ok, other=0)
    return words, scales, ok


@gluon.jit
def _block_max(words, scales, ok, query, j, pos0):
    """The row's max logit over block ``j`` from its loaded page (-inf where not ``ok``):
    ``row_dot.row_logits`` and ``index_scores_triton.row_logit_max`` on the MMA's group dots."""
    operand, start, nan, positive, negative = query
    raw = gl.convert_layout(word_bytes(words), CODES)
    lo, hi = gl.inline_asm_elementwise(_OFFSET_KEYS, "=r,=r,r,r,r", [raw, positive, negative],
                                       dtype=(gl.int8, gl.int8), is_pure=True, pack=4)
    keys = gl.convert_layout(key_order(lo, hi), KEYS)
    acc = mma_v2(keys, operand, gl.zeros((128, COLUMNS), gl.int32, layout=ACC))
    dots = gl.convert_layout(group_dots(acc), TOKENS) + start[None, :]
    per_group = dots.to(gl.float32) * row_dot.DOT_TO_ROW_UNITS
    row, smax = mxfp4.row_group_sum(per_group, scales.to(gl.int32))
    tok = j * 128 + gl.arange(0, 128, layout=gl.SliceLayout(1, TOKENS))
    return row_logit_max(row + nan, smax, tok, pos0, ok)


@gluon.jit
def index_row_kernel(q_ptr, pool_ptr, table_ptr, pos_ptr, req_ptr, out_ptr, T, B, W, P, NB,
                     score_scale, BLOCKS: gl.constexpr, ROUND_Q: gl.constexpr):
    """``out f32[1, T, NB]``; q ``[T, 1, 128]`` (bf16 rounded to e4m3 where ``ROUND_Q``, else
    e4m3), pool ``u8[P, 8704]``, table ``s32[B, W]``, positions and requests ``s32[T]``.
    Program ``(t, b)``: row ``t`` against blocks ``b * BLOCKS ..`` (those past ``NB`` store
    nothing), the next block's page in flight while one is scored."""
    row = gl.program_id(0)
    pos = gl.load(pos_ptr + row)
    req = gl.load(req_ptr + row)
    pos0 = gl.where(row_live(pos, req, B), pos, -1)
    operand, start, nan = _query(q_ptr, row, ROUND_Q)
    positive, negative = _table_words()
    query = (operand, start, nan, positive, negative)
    out = out_ptr + row.to(gl.int64) * NB
    first = gl.program_id(1) * BLOCKS
    page = _page_loads(pool_ptr, table_ptr, req, pos0, first, NB, W, P)
    for jj in range(BLOCKS):
        after = gl.where(jj + 1 < BLOCKS, first + jj + 1, NB)  # NB: nothing loaded
        following = _page_loads(pool_ptr, table_ptr, req, pos0, after, NB, W, P)
        words, scales, ok = page
        best = _block_max(words, scales, ok, query, first + jj, pos0)
        gl.store(out + first + jj, best * score_scale, mask=first + jj < NB)
        page = following
