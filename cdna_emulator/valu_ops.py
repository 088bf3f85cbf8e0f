"""Element-wise semantics of the vector ALU opcodes, after the ISA pseudocode.

Each entry of :data:`OPS` is ``(result type, source types, function)``: the function takes
numpy arrays already converted to the source types (see ``valu.py``: ``u32``/``b32`` uint32,
``i32`` int32, ``f32`` float32, ``u16``/``b16`` uint32 holding 16 bits, ``i16`` int32,
``f16`` float64 holding an f16 value exactly, 64-bit types as uint64/int64/float64) and
returns the result in the result type's natural dtype. Semantics follow the CDNA4 ISA
pseudocode (AMD's ``amd-instinct-cdna4-instruction-set-architecture.pdf``, as extracted
verbatim into tinygrad's ``autogen/amd/cdna/str_pcode.py``); float min/max/med3 follow its
IEEE-mode rules (the kernels run with ``.amdhsa_ieee_mode 1``).
"""

from __future__ import annotations

import numpy as np

from . import numerics as nx

U32, I32, U64, I64 = np.uint32, np.int32, np.uint64, np.int64
M32 = U32(31)
M64 = U64(63)


def _u64(x):
    return np.asarray(x).astype(U64)


def _i64(x):
    return np.asarray(x).astype(I64)


# ---- IEEE-mode float min/max (V_MAX_F32 / V_MIN_F32 pseudocode) ------------------------------

def fmax(a, b):
    """V_MAX_F32 with WAVE_MODE.IEEE = 1: a signalling NaN input returns it quieted, another
    NaN is ignored, +0 > -0, else the larger."""
    return _minmax(a, b, True)


def fmin(a, b):
    return _minmax(a, b, False)


def _minmax(a, b, is_max):
    a = np.asarray(a, np.float32)
    b = np.asarray(b, np.float32)
    ab, bb = a.view(U32), b.view(U32)
    with np.errstate(invalid="ignore"):
        if is_max:
            pick_a = (a > b) | ((a == b) & ((ab & nx.F32_SIGN) == 0))
        else:
            pick_a = (a < b) | ((a == b) & ((ab & nx.F32_SIGN) != 0))
    out = np.where(pick_a, ab, bb)
    a_nan, b_nan = nx.is_nan_bits(ab), nx.is_nan_bits(bb)
    out = np.where(a_nan & ~b_nan, bb, out)
    out = np.where(b_nan & ~a_nan, ab, out)
    out = np.where(a_nan & b_nan, ab | nx.F32_QUIET, out)
    out = np.where(nx.is_snan_bits(bb), bb | nx.F32_QUIET, out)
    out = np.where(nx.is_snan_bits(ab), ab | nx.F32_QUIET, out)
    return out.view(np.float32)


def fmax3(a, b, c):
    return fmax(fmax(a, b), c)


def fmaximum(a, b):
    """IEEE 754-2019 ``maximum`` (V_MAXIMUM3_F32, gfx950): a NaN input gives a quiet NaN, then
    the larger, ``+0 > -0``. LLVM lowers ``llvm.maximum.f32`` to ``v_maximum3_f32`` on gfx950
    ([S]: LLVM's AMDGPU instruction selection; the CDNA4 guide's entry states no NaN payload,
    so the canonical quiet NaN is returned)."""
    return _minimum_maximum(a, b, True)


def fminimum(a, b):
    return _minimum_maximum(a, b, False)


def _minimum_maximum(a, b, is_max):
    a = np.asarray(a, np.float32)
    b = np.asarray(b, np.float32)
    nan = nx.is_nan_bits(a.view(U32)) | nx.is_nan_bits(b.view(U32))
    ordered = _minmax(a, b, is_max).view(U32)
    return np.where(nan, U32(0x7FC00000), ordered).view(np.float32)


def fmin3(a, b, c):
    return fmin(fmin(a, b), c)


def fmed3(a, b, c):
    """V_MED3_F32: any NaN input gives v_min3_f32; else the median (via max3 equality)."""
    a, b, c = (np.asarray(x, np.float32) for x in (a, b, c))
    mx = fmax3(a, b, c)
    with np.errstate(invalid="ignore"):
        med = np.where(mx == a, fmax(b, c), np.where(mx == b, fmax(a, c), fmax(a, b)))
    nan = np.isnan(a) | np.isnan(b) | np.isnan(c)
    return np.where(nan, fmin3(a, b, c), med).astype(np.float32)


def imed3(a, b, c):
    mx = np.maximum(np.maximum(a, b), c)
    return np.where(mx == a, np.maximum(b, c), np.where(mx == b, np.maximum(a, c),
                                                        np.maximum(a, b)))


# ---- float arithmetic in fp32 ------------------------------------------------------------------

def _f32(op):
    def f(*args):
        with np.errstate(all="ignore"):
            return op(*args).astype(np.float32)
    return f


def _mul_lo(a, b):
    return (_u64(a) * _u64(b)) & U64(0xFFFFFFFF)


def _mul_hi_u(a, b):
    return (_u64(a) * _u64(b)) >> U64(32)


def _mul_hi_i(a, b):
    return (_i64(a) * _i64(b)) >> I64(32)


def _u24(x):
    return np.asarray(x).astype(U32) & U32(0xFFFFFF)


def _i24(x):
    v = np.asarray(x).astype(U32) & U32(0xFFFFFF)
    return (v.astype(I64) ^ 0x800000) - 0x800000


def _bfe_u(x, off, width):
    off = np.asarray(off).astype(U32) & M32
    width = np.asarray(width).astype(U32) & M32
    mask = ((U64(1) << width.astype(U64)) - U64(1)).astype(U64)
    return ((np.asarray(x).astype(U64) >> off.astype(U64)) & mask).astype(U32)


def _bfe_i(x, off, width):
    width = np.asarray(width).astype(U32) & M32
    u = _bfe_u(x, off, width).astype(I64)
    w = width.astype(I64)
    sign = np.where(w > 0, I64(1) << np.maximum(w - 1, 0), 0)
    return np.where(w == 0, 0, (u ^ sign) - sign)


def _alignbit(a, b, c):
    wide = (_u64(a) << U64(32)) | _u64(b)
    return (wide >> (_u64(c) & U64(31))) & U64(0xFFFFFFFF)


def _perm(s0, s1, sel):
    """V_PERM_B32: each result byte picks a byte of {S0, S1} (S1 low) or a constant."""
    data = (_u64(s0) << U64(32)) | _u64(s1)
    sel = np.asarray(sel).astype(U32)
    out = np.zeros(np.broadcast(data, sel).shape, U32)
    for byte in range(4):
        s = (sel >> U32(8 * byte)) & U32(0xFF)
        picked = ((data >> (np.minimum(s, 7).astype(U64) * U64(8))) & U64(0xFF)).astype(U32)
        sign_of = lambda k: ((data >> U64(8 * k + 7)) & U64(1)).astype(U32) * U32(0xFF)  # noqa: E731
        v = np.where(s >= 13, U32(0xFF), np.where(s == 12, U32(0), picked))
        for code, k in ((8, 1), (9, 3), (10, 5), (11, 7)):
            v = np.where(s == code, sign_of(k), v)
        out |= (v.astype(U32) << U32(8 * byte))
    return out


def _bitop3(table):
    def f(a, b, c):
        a, b, c = (np.asarray(x).astype(U32) for x in (a, b, c))
        out = np.zeros(np.broadcast(a, b, c).shape, U32)
        for bit in range(8):
            if table >> bit & 1:
                ta = a if bit & 4 else ~a
                tb = b if bit & 2 else ~b
                tc = c if bit & 1 else ~c
                out |= ta & tb & tc
        return out
    return f


def _brev(x):
    x = np.asarray(x).astype(U32)
    out = np.zeros_like(x)
    for i in range(32):
        out |= ((x >> U32(i)) & U32(1)) << U32(31 - i)
    return out


def _u16(x):
    return np.asarray(x).astype(U32) & U32(0xFFFF)


def _f16(x):
    """f16 result of a float64 computation (one RNE rounding to f16)."""
    return np.asarray(x, np.float64)


# name -> (result type, source types, function)
_LANE = np.arange(64, dtype=U64)


def _mbcnt(half: int):
    """V_MBCNT_LO/HI_U32_B32 (CDNA4 ISA pseudocode): ``ThreadMask = (1 << laneId) - 1;
    MaskedValue = S0.u32 & ThreadMask[31:0]`` (LO) or ``ThreadMask[63:32]`` (HI); ``D0 = S1 +
    popcount(MaskedValue)``: the set bits of the mask's half below this lane, plus S1."""
    mask = (((U64(1) << _LANE) - U64(1)) >> U64(32 * half)) & U64(0xFFFFFFFF)
    return lambda a, b: np.bitwise_count(_u64(a) & mask).astype(U64) + _u64(b)


OPS = {
    # moves
    "v_mov_b32": ("b32", ("b32",), lambda a: a),
    "v_mov_b64": ("b64", ("b64",), lambda a: a),
    "v_accvgpr_read_b32": ("b32", ("b32",), lambda a: a),
    "v_accvgpr_write_b32": ("b32", ("b32",), lambda a: a),
    "v_accvgpr_mov_b32": ("b32", ("b32",), lambda a: a),
    "v_not_b32": ("b32", ("b32",), lambda a: ~np.asarray(a).astype(U32)),
    "v_bfrev_b32": ("b32", ("b32",), _brev),
    # float
    "v_add_f32": ("f32", ("f32", "f32"), _f32(lambda a, b: a + b)),
    "v_sub_f32": ("f32", ("f32", "f32"), _f32(lambda a, b: a - b)),
    "v_subrev_f32": ("f32", ("f32", "f32"), _f32(lambda a, b: b - a)),
    "v_mul_f32": ("f32", ("f32", "f32"), _f32(lambda a, b: a * b)),
    "v_max_f32": ("f32", ("f32", "f32"), fmax),
    "v_min_f32": ("f32", ("f32", "f32"), fmin),
    "v_max3_f32": ("f32", ("f32", "f32", "f32"), fmax3),
    "v_min3_f32": ("f32", ("f32", "f32", "f32"), fmin3),
    "v_med3_f32": ("f32", ("f32", "f32", "f32"), fmed3),
    "v_maximum3_f32": ("f32", ("f32",) * 3, lambda a, b, c: fmaximum(fmaximum(a, b), c)),
    "v_minimum3_f32": ("f32", ("f32",) * 3, lambda a, b, c: fminimum(fminimum(a, b), c)),
    "v_fma_f32": ("f32", ("f32", "f32", "f32"), nx.fma_f32),
    "v_mad_f32": ("f32", ("f32", "f32", "f32"), _f32(lambda a, b, c: a * b + c)),
    "v_exp_f32": ("f32", ("f32",), nx.exp2_f32),
    "v_log_f32": ("f32", ("f32",), nx.log2_f32),
    "v_rcp_f32": ("f32", ("f32",), nx.rcp_f32),
    "v_rcp_iflag_f32": ("f32", ("f32",), nx.rcp_f32),
    "v_sqrt_f32": ("f32", ("f32",), nx.sqrt_f32),
    "v_rsq_f32": ("f32", ("f32",), nx.rsq_f32),
    "v_cvt_f32_u32": ("f32", ("u32",), lambda a: np.asarray(a).astype(np.float32)),
    "v_cvt_f32_i32": ("f32", ("i32",), lambda a: np.asarray(a).astype(np.float32)),
    "v_cvt_u32_f32": ("u32", ("f32",), nx.f32_to_u32),
    "v_cvt_i32_f32": ("i32", ("f32",), nx.f32_to_i32),
    "v_cvt_f32_f16": ("f32", ("f16",), lambda a: np.asarray(a).astype(np.float32)),
    "v_cvt_f16_f32": ("f16", ("f32",), lambda a: np.asarray(a, np.float64)),
    "v_cvt_f32_bf16": ("f32", ("b16",), lambda a: nx.bf16_bits_to_f32(a)),
    # 16-bit
    "v_add_u16": ("u16", ("u16", "u16"), lambda a, b: _u16(a + b)),
    "v_sub_u16": ("u16", ("u16", "u16"), lambda a, b: _u16(a - b)),
    "v_mul_lo_u16": ("u16", ("u16", "u16"), lambda a, b: _u16(a * b)),
    "v_lshlrev_b16": ("u16", ("u16", "u16"), lambda a, b: _u16(b << (a & U32(15)))),
    "v_lshrrev_b16": ("u16", ("u16", "u16"), lambda a, b: _u16(b >> (a & U32(15)))),
    "v_ashrrev_i16": ("u16", ("u16", "i16"), lambda a, b: _u16(b >> (a & U32(15)))),
    "v_max_u16": ("u16", ("u16", "u16"), np.maximum),
    "v_min_u16": ("u16", ("u16", "u16"), np.minimum),
    "v_max_i16": ("u16", ("i16", "i16"), lambda a, b: _u16(np.maximum(a, b))),
    "v_min_i16": ("u16", ("i16", "i16"), lambda a, b: _u16(np.minimum(a, b))),
    "v_max3_u16": ("u16", ("u16",) * 3, lambda a, b, c: np.maximum(np.maximum(a, b), c)),
    "v_min3_u16": ("u16", ("u16",) * 3, lambda a, b, c: np.minimum(np.minimum(a, b), c)),
    "v_med3_u16": ("u16", ("u16",) * 3, imed3),
    "v_max3_i16": ("u16", ("i16",) * 3, lambda a, b, c: _u16(np.maximum(np.maximum(a, b), c))),
    "v_min3_i16": ("u16", ("i16",) * 3, lambda a, b, c: _u16(np.minimum(np.minimum(a, b), c))),
    "v_med3_i16": ("u16", ("i16",) * 3, lambda a, b, c: _u16(imed3(a, b, c))),
    "v_mul_f16": ("f16", ("f16", "f16"), lambda a, b: _f16(a * b)),
    "v_add_f16": ("f16", ("f16", "f16"), lambda a, b: _f16(a + b)),
    "v_sub_f16": ("f16", ("f16", "f16"), lambda a, b: _f16(a - b)),
    # 32-bit integer
    "v_add_u32": ("u32", ("u32", "u32"), lambda a, b: _u64(a) + _u64(b)),
    "v_sub_u32": ("u32", ("u32", "u32"), lambda a, b: _i64(a) - _i64(b)),
    "v_subrev_u32": ("u32", ("u32", "u32"), lambda a, b: _i64(b) - _i64(a)),
    "v_add3_u32": ("u32", ("u32", "u32", "u32"), lambda a, b, c: _u64(a) + _u64(b) + _u64(c)),
    "v_xad_u32": ("u32", ("u32", "u32", "u32"), lambda a, b, c: _u64(a ^ b) + _u64(c)),
    "v_mbcnt_lo_u32_b32": ("u32", ("u32", "u32"), _mbcnt(0)),
    "v_mbcnt_hi_u32_b32": ("u32", ("u32", "u32"), _mbcnt(1)),
    "v_and_b32": ("b32", ("b32", "b32"), lambda a, b: a & b),
    "v_or_b32": ("b32", ("b32", "b32"), lambda a, b: a | b),
    "v_xor_b32": ("b32", ("b32", "b32"), lambda a, b: a ^ b),
    "v_or3_b32": ("b32", ("b32", "b32", "b32"), lambda a, b, c: a | b | c),
    "v_and_or_b32": ("b32", ("b32", "b32", "b32"), lambda a, b, c: (a & b) | c),
    "v_bfi_b32": ("b32", ("b32", "b32", "b32"), lambda a, b, c: (a & b) | (~a & c)),
    "v_lshlrev_b32": ("b32", ("u32", "u32"), lambda a, b: _u64(b) << (_u64(a) & U64(31))),
    "v_lshrrev_b32": ("b32", ("u32", "u32"), lambda a, b: b >> (a & M32)),
    "v_ashrrev_i32": ("b32", ("u32", "i32"), lambda a, b: b >> (a & M32).astype(I32)),
    "v_lshl_add_u32": ("u32", ("u32", "u32", "u32"),
                       lambda a, b, c: ((_u64(a) << (_u64(b) & U64(31))) & U64(0xFFFFFFFF))
                       + _u64(c)),
    "v_add_lshl_u32": ("u32", ("u32", "u32", "u32"),
                       lambda a, b, c: (_u64(a) + _u64(b)) << (_u64(c) & U64(31))),
    "v_lshl_or_b32": ("b32", ("u32", "u32", "u32"),
                      lambda a, b, c: (_u64(a) << (_u64(b) & U64(31))) | _u64(c)),
    "v_max_i32": ("i32", ("i32", "i32"), np.maximum),
    "v_min_i32": ("i32", ("i32", "i32"), np.minimum),
    "v_max_u32": ("u32", ("u32", "u32"), np.maximum),
    "v_min_u32": ("u32", ("u32", "u32"), np.minimum),
    "v_max3_i32": ("i32", ("i32", "i32", "i32"), lambda a, b, c: np.maximum(np.maximum(a, b),
                                                                            c)),
    "v_max3_u32": ("u32", ("u32", "u32", "u32"), lambda a, b, c: np.maximum(np.maximum(a, b),
                                                                            c)),
    "v_min3_i32": ("i32", ("i32", "i32", "i32"), lambda a, b, c: np.minimum(np.minimum(a, b),
                                                                            c)),
    "v_min3_u32": ("u32", ("u32", "u32", "u32"), lambda a, b, c: np.minimum(np.minimum(a, b),
                                                                            c)),
    "v_med3_i32": ("i32", ("i32", "i32", "i32"), imed3),
    "v_med3_u32": ("u32", ("u32", "u32", "u32"), imed3),
    "v_mul_lo_u32": ("u32", ("u32", "u32"), _mul_lo),
    "v_mul_hi_u32": ("u32", ("u32", "u32"), _mul_hi_u),
    "v_mul_hi_i32": ("i32", ("i32", "i32"), _mul_hi_i),
    "v_mul_u32_u24": ("u32", ("u32", "u32"), lambda a, b: _u64(_u24(a)) * _u64(_u24(b))),
    "v_mul_i32_i24": ("i32", ("u32", "u32"), lambda a, b: _i24(a) * _i24(b)),
    "v_mad_u32_u24": ("u32", ("u32", "u32", "u32"),
                      lambda a, b, c: _u64(_u24(a)) * _u64(_u24(b)) + _u64(c)),
    "v_mad_i32_i24": ("i32", ("u32", "u32", "i32"), lambda a, b, c: _i24(a) * _i24(b) + c),
    "v_bfe_u32": ("u32", ("u32", "u32", "u32"), _bfe_u),
    "v_bfe_i32": ("i32", ("u32", "u32", "u32"), _bfe_i),
    "v_alignbit_b32": ("b32", ("u32", "u32", "u32"), _alignbit),
    "v_perm_b32": ("b32", ("u32", "u32", "u32"), _perm),
    # 64-bit integer
    "v_lshlrev_b64": ("b64", ("u32", "u64"), lambda a, b: b << (_u64(a) & M64)),
    "v_lshrrev_b64": ("b64", ("u32", "u64"), lambda a, b: b >> (_u64(a) & M64)),
    "v_ashrrev_i64": ("b64", ("u32", "i64"), lambda a, b: b >> (_i64(a) & I64(63))),
    "v_lshl_add_u64": ("b64", ("u64", "u32", "u64"),
                       lambda a, b, c: (a << (_u64(b) & U64(7))) + c),
    # packing
    "v_pack_b32_f16": ("b32", ("b16", "b16"), lambda a, b: _u64(a) | (_u64(b) << U64(16))),
    "v_cvt_pk_bf16_f32": ("b32", ("f32", "f32"),
                          lambda a, b: nx.f32_to_bf16_bits(nx.bits32(a))
                          | (nx.f32_to_bf16_bits(nx.bits32(b)) << U32(16))),
}

# 16-bit VOP3-only opcodes that keep the destination's high half (GFX9 writes the half that
# op_sel[3] selects; LLVM's zeroesHigh16BitsOfDest does not list them as zeroing).
PRESERVE_HIGH = {"v_max3_u16", "v_min3_u16", "v_med3_u16", "v_max3_i16", "v_min3_i16",
                 "v_med3_i16"}

# Integer adds/subs whose VOP3 ``clamp`` saturates (unsigned) instead of wrapping.
UNSIGNED_SATURATING = {"v_add_u32", "v_sub_u32", "v_subrev_u32", "v_add_u16", "v_sub_u16"}

BITOP3 = {"v_bitop3_b32": "b32", "v_bitop3_b16": "b16"}


def bitop3(table: int):
    return _bitop3(table)
