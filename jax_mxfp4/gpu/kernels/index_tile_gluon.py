"""Gluon kernel (Triton with explicit layouts, CUDA sm_80+): ``index_scores`` on decode-shaped
tiles, with each page's keys decoded straight into the tensor cores' operand registers.

Why: Triton chooses a loaded tensor's layout itself and moves the decoded keys of a page to the
dot's operand layout through shared memory (stores, a barrier, ``ldmatrix``), which costs the
Triton decode tile more issue slots than the decode itself. Here the layouts are written out
so that no such move exists: each thread loads exactly the code bytes whose nibbles its
``mma.sync.m16n8k16`` B-operand registers hold, decodes them in place (``mxfp4._FP16_PAIRS``,
fp16 ``e2m1 * 2**-14``) and feeds them to ``mma_v2``. The query's columns are permuted to
match when it is loaded (the dot sums over the columns, so any order that pairs each query
element with its key element is the same dot).

The column order (:func:`key_column`): a group's keys are two ``[16 virtual k, 128 tokens]``
B operands, the low nibbles' and the high nibbles' (one ``K = 16`` dot each), where virtual
``k = 8 * b1 + 2 * c + b0`` holds element ``8 * c + 4 * b1 + 2 * b0 + nib`` of the group: lane
``c = lane % 4`` loads the group's code word ``c`` (bytes ``4c .. 4c + 3``), and byte bits
``b0``, ``b1`` are the halves of a register and the register: exactly the decode's output
registers, so nothing is repacked.

Scores are those of ``index_scores_kernel``'s group-dot tiling (SPEC §4, §5, §15.3, §15.18),
from the same helpers: four ``K = 32`` dots per page, each rescaled by ``2**(s_g - smax)``,
NaN for a token with a scale byte 255, the maximum over the tokens each row sees with NaN kept.
Tiles hold up to 16 dot rows (``ROWS * H``); one block per program.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2

from jax_mxfp4.gpu.kernels import mxfp4
from jax_mxfp4.gpu.kernels.index_scores_triton import _max_nan, _poison_infinite, tile_rows

WARPS = 4
"""Warps per program: each takes 32 of a page's 128 tokens (the tile's N)."""

ACC = gl.constexpr(gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, WARPS],
                                             instr_shape=[16, 8]))
KEYS = gl.constexpr(gl.DotOperandLayout(operand_index=1, parent=ACC.value, k_width=2))
QUERY = gl.constexpr(gl.DotOperandLayout(operand_index=0, parent=ACC.value, k_width=2))
CODES = gl.constexpr(gl.BlockedLayout(size_per_thread=[1, 4], threads_per_warp=[8, 4],
                                      warps_per_cta=[WARPS, 1], order=[1, 0]))
"""A group's code bytes ``[128 tokens, 16]``: a thread holds one 4-byte code word; tokens
spread over lanes, warps and registers exactly as the accumulator's columns."""


@triton.jit
def key_column(v, nib: tl.constexpr):
    """The element of a scale group (0..31) that virtual column ``v`` (0..15) of the group's
    low-nibble (``nib = 0``) or high-nibble dot holds (see the module docstring). Plain
    ``triton.jit`` (elementwise, no layout), so the interpreter runs it in the tests."""
    b1 = v // 8
    c = (v // 2) % 4
    b0 = v % 2
    return 8 * c + 4 * b1 + 2 * b0 + nib


@gluon.jit
def group_keys(page_ptr, ok, g: gl.constexpr):
    """Scale group ``g``'s keys of a page as two B operands ``fp16 [16, 128]`` (virtual k,
    token; the low and the high nibbles), fp16 ``e2m1 * 2**-14``, decoded in the registers
    that hold them (zeros where ``ok``, a scalar, is false)."""
    tok = gl.arange(0, 128, layout=gl.SliceLayout(1, CODES))
    byte = gl.arange(0, 16, layout=gl.SliceLayout(0, CODES))
    raw = gl.load(page_ptr + tok[:, None] * 64 + 16 * g + byte[None, :], mask=ok, other=0)
    lo, hi = gl.inline_asm_elementwise(mxfp4._FP16_PAIRS, "=r,=r,=r,=r,r", [raw],
                                       dtype=(gl.float16, gl.float16), is_pure=True, pack=4)
    return _operand(lo), _operand(hi)


@triton.jit
def operand_order(half):
    """``[128 tok, 16 bytes]`` of one nibble per byte -> ``[16 virtual k, 128 tok]`` in
    :func:`key_column` order. Plain ``triton.jit``, as :func:`key_column`."""
    quads = tl.reshape(half, (128, 4, 2, 2))  # [tok, c, b1, b0]
    return tl.reshape(tl.permute(quads, (2, 1, 3, 0)), (16, 128))  # [b1, c, b0 | tok]


@gluon.jit
def _operand(half):
    """``[128 tok, 16 bytes]`` of one nibble -> the B operand ``[16 virtual k, 128 tok]``."""
    return gl.convert_layout(operand_order(half), KEYS)  # the same registers: no data moves


@gluon.jit
def query_group(q_ptr, qrow, row_ok, g: gl.constexpr, ROUND_Q: gl.constexpr):
    """Scale group ``g`` of the query rows ``qrow`` (int64 [16], rows of ``[., 128]``) as the
    two A operands ``fp16 [16, 16]`` of :func:`group_keys`' two dots, in :func:`key_column`
    order; a bf16 query rounded to e4m3 (``ROUND_Q``), an e4m3 one converted exactly."""
    return (_query_half(q_ptr, qrow, row_ok, g, 0, ROUND_Q),
            _query_half(q_ptr, qrow, row_ok, g, 1, ROUND_Q))


@gluon.jit
def _query_half(q_ptr, qrow, row_ok, g: gl.constexpr, nib: gl.constexpr,
                ROUND_Q: gl.constexpr):
    v = gl.arange(0, 16, layout=gl.SliceLayout(0, QUERY))
    rows = gl.convert_layout(qrow, gl.SliceLayout(1, QUERY))
    ok = gl.convert_layout(row_ok, gl.SliceLayout(1, QUERY))
    x = gl.load(q_ptr + rows[:, None] * 128 + 32 * g + key_column(v, nib)[None, :],
                mask=ok[:, None], other=0.0)
    if ROUND_Q:
        return mxfp4.round_e4m3(x.to(gl.float32), True).to(gl.float16)
    return x.to(gl.float16)


@gluon.jit
def _group_dot(qa, page_ptr, ok, g: gl.constexpr, zero):
    """One scale group's ``q_g . K_g^T``: two ``K = 16`` dots (low, then high nibbles)."""
    k_lo, k_hi = group_keys(page_ptr, ok, g)
    return mma_v2(qa[1], k_hi, mma_v2(qa[0], k_lo, zero))


@gluon.jit
def page_logits(qa0, qa1, qa2, qa3, page_ptr, ok):
    """``mxfp4.key_logits`` of a page on the tensor cores with in-register keys: ``(dots f32
    [16, 128], exponent int32 [128])``, ``q . k = dots * 2**exponent``, NaN for a token with a
    scale byte 255."""
    tok = gl.arange(0, 128, layout=gl.SliceLayout(0, ACC))
    words = page_ptr.to(gl.pointer_type(gl.uint32)) + mxfp4.SCALE_OFFSET // 4
    scales = gl.load(words + tok, mask=ok, other=0)
    s0, s1 = mxfp4.scale_byte(scales, 0), mxfp4.scale_byte(scales, 1)
    s2, s3 = mxfp4.scale_byte(scales, 2), mxfp4.scale_byte(scales, 3)
    smax = gl.maximum(gl.maximum(s0, s1), gl.maximum(s2, s3))
    zero = gl.zeros((16, 128), gl.float32, layout=ACC)
    dots = _group_dot(qa0, page_ptr, ok, 0, zero) * mxfp4.pow2(s0 - smax)[None, :]
    dots += _group_dot(qa1, page_ptr, ok, 1, zero) * mxfp4.pow2(s1 - smax)[None, :]
    dots += _group_dot(qa2, page_ptr, ok, 2, zero) * mxfp4.pow2(s2 - smax)[None, :]
    dots += _group_dot(qa3, page_ptr, ok, 3, zero) * mxfp4.pow2(s3 - smax)[None, :]
    dots = gl.where((smax == mxfp4.NAN_BYTE)[None, :], float("nan"), dots)
    return dots, smax - 127 + 14


@gluon.jit
def index_tile_kernel(q_ptr, pool_ptr, table_ptr, pos_ptr, req_ptr, out_ptr, T, B, W, P, NB,
                      score_scale, H: gl.constexpr, ROWS: gl.constexpr,
                      ROUND_Q: gl.constexpr):
    """``out f32[H, T, NB]``; q ``[T, H, 128]``, pool ``u8[P, 8704]``, table ``s32[B, W]``,
    positions and requests ``s32[T]``. Program ``(i, j)``: rows ``i * ROWS ..`` (all ``H``
    heads, ``ROWS * H <= 16`` dot rows) against block ``j``."""
    rows_layout: gl.constexpr = gl.SliceLayout(1, ACC)
    row, head, row_ok, pos, req, live = tile_rows(gl.arange(0, 16, layout=rows_layout),
                                                  gl.program_id(0) * ROWS, pos_ptr, req_ptr,
                                                  T, B, H, ROWS)
    qrow = row.to(gl.int64) * H + head
    qa0 = query_group(q_ptr, qrow, row_ok, 0, ROUND_Q)
    qa1 = query_group(q_ptr, qrow, row_ok, 1, ROUND_Q)
    qa2 = query_group(q_ptr, qrow, row_ok, 2, ROUND_Q)
    qa3 = query_group(q_ptr, qrow, row_ok, 3, ROUND_Q)
    j = gl.program_id(1)
    tok = j * 128 + gl.arange(0, 128, layout=gl.SliceLayout(0, ACC))
    reach = gl.max(gl.where(live, pos, -1), axis=0)
    req_lo = gl.min(gl.where(live, req, B), axis=0)
    req_hi = gl.max(gl.where(live, req, -1), axis=0)
    best = gl.full((16,), float("-inf"), gl.float32, layout=rows_layout)
    if j * 128 <= reach:
        # The tile's requests: one in the common case (rows are request-major).
        for req_r in range(req_lo, req_hi + 1):
            page = gl.load(table_ptr + req_r.to(gl.int64) * W + j)
            sel = live & (req == req_r)
            ok = (page >= 0) & (page < P) & (gl.max(sel.to(gl.int32), axis=0) > 0)
            page_ptr = pool_ptr + gl.where(ok, page, 0).to(gl.int64) * mxfp4.PAGE_BYTES
            dots, expo = page_logits(qa0, qa1, qa2, qa3, page_ptr, ok)
            logits = _poison_infinite(mxfp4.mul_pow2(dots, expo[None, :]))
            seen = sel[:, None] & (tok[None, :] <= pos[:, None]) & ok
            tile = gl.reduce(gl.where(seen, logits, float("-inf")), 1, _max_nan)
            best = gl.maximum(best, tile, propagate_nan=tl.PropagateNan.ALL)
    out = out_ptr + head.to(gl.int64) * T * NB + row.to(gl.int64) * NB + j
    gl.store(out, best * score_scale, mask=row_ok)
