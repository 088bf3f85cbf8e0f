"""Scalar instructions: SOP1/SOP2/SOPC/SOPK arithmetic, EXEC manipulation, MODE writes and
scalar memory loads. Each runs for all selected waves at once (one value per wave).

Semantics follow the CDNA4 ISA pseudocode (SCC rules included: carries for the unsigned
add/sub, signed overflow for s_add_i32/s_sub_i32/s_addk_i32, ``result != 0`` for the logical
and shift operations, the comparison for s_min/s_max). Definedness is tracked per bit for
the logical operations and all-or-nothing for the others (see ``defined.py``).
"""

from __future__ import annotations

import numpy as np

from . import defined as definedness
from . import waitcnt
from .machine import FULL
from .memory import AccessError
from .operands import EXEC
from .sources import scalar_reader_32, scalar_reader_64

U32, U64, I32, I64 = np.uint32, np.uint64, np.int32, np.int64
MASK32 = U64(0xFFFFFFFF)


def _i(x):
    return np.asarray(x).astype(U32).view(I32).astype(I64)


def _u(x):
    return np.asarray(x).astype(U64)


# name -> (width, function(a, b, scc) -> (result, scc or None), definedness rule)
SOP2 = {
    "s_add_u32": (32, lambda a, b, c: (_u(a) + _u(b), (_u(a) + _u(b)) > MASK32), "arith"),
    "s_addc_u32": (32, lambda a, b, c: (_u(a) + _u(b) + _u(c), (_u(a) + _u(b) + _u(c))
                                        > MASK32), "arith"),
    "s_sub_u32": (32, lambda a, b, c: (_u(a) - _u(b), _u(b) > _u(a)), "arith"),
    "s_subb_u32": (32, lambda a, b, c: (_u(a) - _u(b) - _u(c), _u(b) + _u(c) > _u(a)),
                   "arith"),
    "s_add_i32": (32, lambda a, b, c: _signed_add(_i(a), _i(b)), "arith"),
    "s_sub_i32": (32, lambda a, b, c: _signed_add(_i(a), -_i(b)), "arith"),
    "s_and_b32": (32, lambda a, b, c: (a & b, (a & b) != 0), "and"),
    "s_or_b32": (32, lambda a, b, c: (a | b, (a | b) != 0), "or"),
    "s_xor_b32": (32, lambda a, b, c: (a ^ b, (a ^ b) != 0), "xor"),
    "s_andn2_b32": (32, lambda a, b, c: (a & ~b, (a & ~b) != 0), "andn2"),
    "s_orn2_b32": (32, lambda a, b, c: (a | ~b, (a | ~b) != 0), "orn2"),
    "s_and_b64": (64, lambda a, b, c: (a & b, (a & b) != 0), "and"),
    "s_or_b64": (64, lambda a, b, c: (a | b, (a | b) != 0), "or"),
    "s_xor_b64": (64, lambda a, b, c: (a ^ b, (a ^ b) != 0), "xor"),
    "s_andn2_b64": (64, lambda a, b, c: (a & ~b, (a & ~b) != 0), "andn2"),
    "s_orn2_b64": (64, lambda a, b, c: (a | ~b, (a | ~b) != 0), "orn2"),
    "s_lshl_b32": (32, lambda a, b, c: _scc_nz((_u(a) << (_u(b) & U64(31))) & MASK32),
                   "arith"),
    "s_lshr_b32": (32, lambda a, b, c: _scc_nz(_u(a) >> (_u(b) & U64(31))), "arith"),
    "s_ashr_i32": (32, lambda a, b, c: _scc_nz(_i(a) >> (_i(b) & 31)), "arith"),
    "s_lshl_b64": (64, lambda a, b, c: _scc_nz(_u(a) << (_u(b) & U64(63))), "arith"),
    "s_lshr_b64": (64, lambda a, b, c: _scc_nz(_u(a) >> (_u(b) & U64(63))), "arith"),
    "s_lshl1_add_u32": (32, lambda a, b, c: _shl_add(a, b, 1), "arith"),
    "s_lshl2_add_u32": (32, lambda a, b, c: _shl_add(a, b, 2), "arith"),
    "s_lshl3_add_u32": (32, lambda a, b, c: _shl_add(a, b, 3), "arith"),
    "s_lshl4_add_u32": (32, lambda a, b, c: _shl_add(a, b, 4), "arith"),
    "s_mul_i32": (32, lambda a, b, c: ((_i(a) * _i(b)), None), "arith"),
    "s_mul_hi_u32": (32, lambda a, b, c: ((_u(a) * _u(b)) >> U64(32), None), "arith"),
    "s_mul_hi_i32": (32, lambda a, b, c: ((_i(a) * _i(b)) >> 32, None), "arith"),
    "s_min_i32": (32, lambda a, b, c: (np.where(_i(a) < _i(b), a, b), _i(a) < _i(b)),
                  "arith"),
    "s_min_u32": (32, lambda a, b, c: (np.where(_u(a) < _u(b), a, b), _u(a) < _u(b)),
                  "arith"),
    "s_max_i32": (32, lambda a, b, c: (np.where(_i(a) > _i(b), a, b), _i(a) > _i(b)),
                  "arith"),
    "s_max_u32": (32, lambda a, b, c: (np.where(_u(a) > _u(b), a, b), _u(a) > _u(b)),
                  "arith"),
    "s_cselect_b32": (32, lambda a, b, c: (np.where(c, a, b), None), "cselect"),
    "s_cselect_b64": (64, lambda a, b, c: (np.where(c, a, b), None), "cselect"),
    "s_bfe_u32": (32, lambda a, b, c: _scc_nz(_bfe(_u(a), _u(b), 32)), "arith"),
    "s_bfe_i32": (32, lambda a, b, c: _scc_nz(_bfe_signed(a, b)), "arith"),
    "s_absdiff_i32": (32, lambda a, b, c: _scc_nz(np.abs(_i(a) - _i(b))), "arith"),
}
READS_SCC = {"s_addc_u32", "s_subb_u32", "s_cselect_b32", "s_cselect_b64"}


def _signed_add(a, b):
    r = a + b
    overflow = (r > 2**31 - 1) | (r < -(2**31))
    return r, overflow


def _scc_nz(r):
    return r, np.asarray(r) != 0


def _shl_add(a, b, n):
    t = (_u(a) << U64(n)) + _u(b)
    return t, t > MASK32


def _bfe(x, spec, bits):
    off = spec & U64(bits - 1)
    width = (spec >> U64(16)) & U64(0x7F)
    width = np.minimum(width, U64(bits))
    mask = np.where(width >= 64, U64(2**64 - 1), (U64(1) << width) - U64(1))
    return (x >> off) & mask


def _bfe_signed(a, b):
    width = (_u(b) >> U64(16)) & U64(0x7F)
    v = _bfe(_u(a), _u(b), 32).astype(I64)
    w = np.asarray(width).astype(I64)
    sign = np.where(w > 0, np.left_shift(I64(1), np.maximum(w - 1, 0)), 0)
    return np.where(w == 0, 0, (v ^ sign) - sign)


SOP1 = {
    "s_mov_b32": (32, lambda a, c: (a, None), "mov"),
    "s_mov_b64": (64, lambda a, c: (a, None), "mov"),
    "s_cmov_b32": (32, None, "cmov"),
    "s_cmov_b64": (64, None, "cmov"),
    "s_not_b32": (32, lambda a, c: (~_u(a) & MASK32, (~_u(a) & MASK32) != 0), "not"),
    "s_not_b64": (64, lambda a, c: (~_u(a), ~_u(a) != 0), "not"),
    "s_brev_b32": (32, lambda a, c: (_brev32(a), None), "arith"),
    "s_abs_i32": (32, lambda a, c: _scc_nz(np.abs(_i(a))), "arith"),
    "s_sext_i32_i8": (32, lambda a, c: (((_u(a) & U64(0xFF)).astype(I64) ^ 0x80) - 0x80,
                                        None), "arith"),
    "s_sext_i32_i16": (32, lambda a, c: (((_u(a) & U64(0xFFFF)).astype(I64) ^ 0x8000)
                                         - 0x8000, None), "arith"),
    "s_bcnt1_i32_b32": (32, lambda a, c: _scc_nz(_popcount(_u(a))), "arith"),
    "s_bcnt1_i32_b64": (64, lambda a, c: _scc_nz(_popcount(_u(a))), "arith32"),
    "s_ff1_i32_b64": (64, lambda a, c: (_ff1(_u(a)), None), "arith32"),
    "s_ff1_i32_b32": (32, lambda a, c: (_ff1(_u(a)), None), "arith"),
    # D = D with bit S0[4:0] cleared / set (read-modify-write of the destination; its
    # definedness, as s_cmov's, follows the source operand)
    "s_bitset0_b32": (32, None, "bitset0"),
    "s_bitset1_b32": (32, None, "bitset1"),
}
SAVEEXEC = {
    "s_and_saveexec_b64": lambda s, e: s & e,
    "s_or_saveexec_b64": lambda s, e: s | e,
    "s_xor_saveexec_b64": lambda s, e: s ^ e,
    "s_andn2_saveexec_b64": lambda s, e: s & ~e,
    "s_orn2_saveexec_b64": lambda s, e: s | ~e,
    "s_andn1_saveexec_b64": lambda s, e: ~s & e,
}


def _brev32(a):
    a = _u(a)
    out = np.zeros_like(a)
    for i in range(32):
        out |= ((a >> U64(i)) & U64(1)) << U64(31 - i)
    return out


def _popcount(x):
    x = np.asarray(x, U64)
    return np.bitwise_count(x).astype(I64) if hasattr(np, "bitwise_count") else np.array(
        [bin(int(v)).count("1") for v in np.ravel(x)]).reshape(x.shape)


def _ff1(x):
    x = np.asarray(x, U64)
    low = x & (~x + U64(1))
    pos = np.where(x == 0, -1, np.log2(np.maximum(low, 1).astype(np.float64)).astype(I64))
    return pos


SOPC = {"eq": np.equal, "lg": np.not_equal, "gt": np.greater, "ge": np.greater_equal,
        "lt": np.less, "le": np.less_equal}


class ScalarDest:
    """Writes a 32- or 64-bit result (and its defined bits) to an SGPR destination."""

    def __init__(self, ctx, op, width):
        self.r = ctx.sreg(op)
        self.width = width
        if op.count * 32 != width:
            raise ctx.fail(f"{op.text} is not a {width}-bit destination", "parse")
        self.regs = set(range(self.r, self.r + width // 32))

    def __call__(self, m, w, value, dbits=None):
        v = np.asarray(value).astype(U64) if self.width == 64 else np.asarray(
            value).astype(I64).astype(U64)
        lo = (v & MASK32).astype(U32)
        n = m.s[self.r][w].shape[0]
        lo = np.broadcast_to(lo, (n,))
        if dbits is None:
            m.write_s(w, self.r, lo)
            if self.width == 64:
                m.write_s(w, self.r + 1, np.broadcast_to((v >> U64(32)).astype(U32), (n,)))
        else:
            d = np.broadcast_to(np.asarray(dbits, U64), (n,))
            m.write_s(w, self.r, lo, (d & MASK32).astype(U32))
            if self.width == 64:
                m.write_s(w, self.r + 1, np.broadcast_to((v >> U64(32)).astype(U32), (n,)),
                          (d >> U64(32)).astype(U32))


def scalar_def_reader(ctx, op, width):
    """Reader of a source's defined bits as uint64 (constants: all defined)."""
    if op.kind != "s":
        full = U64(2**width - 1)
        return lambda m, w: full
    r = op.index
    if width == 64:
        return lambda m, w: _u(m.sdef[r][w]) | (_u(m.sdef[r + 1][w]) << U64(32))
    return lambda m, w: _u(m.sdef[r][w])


def combine_defined(rule, a, b, da, db, width, scc_defined):
    """Defined bits of a logical/arithmetic result from its sources' defined bits."""
    full = U64(2**width - 1)
    a, b = _u(a), _u(b)
    if rule == "and":
        return (da & db) | (da & ~a) | (db & ~b)
    if rule == "or":
        return (da & db) | (da & a) | (db & b)
    if rule == "andn2":
        return (da & db) | (da & ~a) | (db & b)
    if rule == "orn2":
        return (da & db) | (da & a) | (db & ~b)
    if rule == "xor":
        return da & db
    every = ((da & full) == full) & ((db & full) == full)
    return np.where(every, full, U64(0))


def _scc_defined(rule, value, dbits, width):
    """SCC = (result != 0) is decided when a defined bit is 1 or every bit is defined."""
    full = U64(2**width - 1)
    v = _u(value) & full
    return ((dbits & v) != 0) | ((dbits & full) == full)


def build_sop2(ctx, pi, base):
    width, fn, rule = SOP2[base]
    ops = pi.operands
    if len(ops) != 3:
        raise ctx.fail(f"{base} takes 3 operands", "parse")
    rd = (scalar_reader_64 if width == 64 else scalar_reader_32)
    ra, rb = rd(ctx, ops[1]), rd(ctx, ops[2])
    dest = ScalarDest(ctx, ops[0], width)
    da, db = scalar_def_reader(ctx, ops[1], width), scalar_def_reader(ctx, ops[2], width)
    reads_scc = base in READS_SCC
    srcs = {r for op in ops[1:] if op.kind == "s" for r in op.regs()}
    writes_exec = bool(dest.regs & {EXEC, EXEC + 1})
    rule_name = rule

    def run(m, w):
        a, b = ra(m, w), rb(m, w)
        c = m.scc[w] if reads_scc else None
        res, scc = fn(a, b, c)
        dbits = None
        if m.check_undefined and (not srcs.isdisjoint(m.s_undef) or (
                reads_scc and not np.all(m.scc_def[w]))):
            sccd = m.scc_def[w] if reads_scc else True
            if rule_name == "cselect":
                dbits = np.where(sccd, np.where(c, da(m, w), db(m, w)), U64(0))
            else:
                dbits = combine_defined(rule_name, a, b, da(m, w), db(m, w), width, sccd)
                if reads_scc:
                    dbits = np.where(sccd, dbits, U64(0))
            if writes_exec and np.any(dbits != U64(2**width - 1)):
                raise m.fault("undefined", "a new EXEC mask depends on undefined bits",
                              inst, w)
            if scc is not None:
                m.scc_def[w] = _scc_defined(rule_name, res, dbits, width)
        elif scc is not None and m.check_undefined:
            m.scc_def[w] = True
        dest(m, w, res, dbits)
        if scc is not None:
            m.scc[w] = scc
    inst = ctx.inst
    return run, dict(ssrc=srcs, sdst=dest.regs, reads_scc=reads_scc)


def build_sop1(ctx, pi, base):
    ops = pi.operands
    if base in SAVEEXEC:
        return build_saveexec(ctx, pi, base)
    width, fn, rule = SOP1[base]
    out_width = 32 if rule == "arith32" else width
    rd = (scalar_reader_64 if width == 64 else scalar_reader_32)
    ra = rd(ctx, ops[1])
    dest = ScalarDest(ctx, ops[0], out_width)
    da = scalar_def_reader(ctx, ops[1], width)
    srcs = {r for r in ops[1].regs()} if ops[1].kind == "s" else set()
    writes_exec = bool(dest.regs & {EXEC, EXEC + 1})
    inst = ctx.inst
    cmov = rule == "cmov"
    bitset = rule in ("bitset0", "bitset1")

    def run(m, w):
        a = ra(m, w)
        if cmov:
            res, scc = np.where(m.scc[w], _u(a), _u(m.s[dest.r][w]) if width == 32 else
                                _u(m.s[dest.r][w]) | (_u(m.s[dest.r + 1][w]) << U64(32))), None
        elif bitset:
            bit = U64(1) << (_u(a) & U64(31))
            old = _u(m.s[dest.r][w])
            res, scc = (old | bit) if rule == "bitset1" else (old & ~bit & MASK32), None
        else:
            res, scc = fn(a, None)
        dbits = None
        if m.check_undefined and not srcs.isdisjoint(m.s_undef):
            d = da(m, w)
            full = U64(2**width - 1)
            dbits = d if rule in ("mov", "not", "cmov") else np.where((d & full) == full,
                                                                       full, U64(0))
            if out_width != width:
                dbits = np.where(dbits == full, U64(0xFFFFFFFF), U64(0))
            if writes_exec and np.any(dbits != U64(2**out_width - 1)):
                raise m.fault("undefined", "a new EXEC mask depends on undefined bits",
                              inst, w)
            if scc is not None:
                m.scc_def[w] = _scc_defined(rule, res, dbits, out_width)
        elif scc is not None and m.check_undefined:
            m.scc_def[w] = True
        dest(m, w, res, dbits)
        if scc is not None:
            m.scc[w] = scc
    return run, dict(ssrc=srcs | ({dest.r} if cmov or bitset else set()), sdst=dest.regs,
                     reads_scc=cmov)


def build_saveexec(ctx, pi, base):
    """saveexec = EXEC; EXEC = op(S0, EXEC); D = saveexec; SCC = EXEC != 0."""
    fn = SAVEEXEC[base]
    ops = pi.operands
    src = scalar_reader_64(ctx, ops[1])
    dsrc = scalar_def_reader(ctx, ops[1], 64)
    dest = ScalarDest(ctx, ops[0], 64)
    srcs = set(ops[1].regs()) if ops[1].kind == "s" else set()
    inst = ctx.inst

    def run(m, w):
        exec64 = _u(m.s[EXEC][w]) | (_u(m.s[EXEC + 1][w]) << U64(32))
        s = src(m, w)
        new = fn(_u(s), exec64)
        if m.check_undefined and not srcs.isdisjoint(m.s_undef):
            d = dsrc(m, w)
            full = U64(2**64 - 1)
            rule = "and" if base == "s_and_saveexec_b64" else "or" if base == \
                "s_or_saveexec_b64" else "xor"
            dnew = combine_defined(rule, s, exec64, d, full, 64, True)
            if np.any(dnew != full):
                raise m.fault("undefined", "a new EXEC mask depends on undefined bits of "
                              f"{ops[1].text}", inst, w)
        dest(m, w, exec64)
        m.write_s(w, EXEC, (new & MASK32).astype(U32))
        m.write_s(w, EXEC + 1, (new >> U64(32)).astype(U32))
        m.scc[w] = new != 0
        if m.check_undefined:
            m.scc_def[w] = True
    return run, dict(ssrc=srcs | {EXEC, EXEC + 1}, sdst=dest.regs | {EXEC, EXEC + 1})


def build_sopc(ctx, pi, base):
    """s_cmp_<op>_<i32|u32|u64>."""
    _, _, op, t = base.split("_")
    if op not in SOPC:
        raise ctx.fail(f"comparison {op!r}")
    ops = pi.operands
    width = 64 if t.endswith("64") else 32
    rd = scalar_reader_64 if width == 64 else scalar_reader_32
    ra, rb = rd(ctx, ops[0]), rd(ctx, ops[1])
    conv = _i if t[0] == "i" else _u
    cmp = SOPC[op]
    srcs = {r for o in ops if o.kind == "s" for r in o.regs()}

    def run(m, w):
        m.scc[w] = cmp(conv(ra(m, w)), conv(rb(m, w)))
        if m.check_undefined:
            m.scc_def[w] = _all_defined(m, w, srcs)
    return run, dict(ssrc=srcs, sdst=set())


def _all_defined(m, w, regs):
    ok = np.ones(m.scc[w].shape, bool)
    for r in regs:
        if r in m.s_undef:
            ok &= m.sdef[r][w] == FULL
    return ok


def build_sopk(ctx, pi, base):
    """s_movk_i32, s_addk_i32, s_mulk_i32, s_cmpk_<op>_<i32|u32>: 16-bit immediates."""
    ops = pi.operands
    imm = int(ops[1].value)
    dst = ops[0]
    if base.startswith("s_cmpk_"):
        _, _, op, t = base.split("_")
        value = (imm & 0xFFFF) if t == "u32" else ((imm & 0xFFFF) ^ 0x8000) - 0x8000
        ra = scalar_reader_32(ctx, dst)
        conv = _i if t == "i32" else _u
        cmp = SOPC[op]
        srcs = set(dst.regs())

        def run_cmp(m, w):
            m.scc[w] = cmp(conv(ra(m, w)), value)
            if m.check_undefined:
                m.scc_def[w] = _all_defined(m, w, srcs)
        return run_cmp, dict(ssrc=srcs, sdst=set())
    simm = ((imm & 0xFFFF) ^ 0x8000) - 0x8000
    dest = ScalarDest(ctx, dst, 32)
    r = dest.r

    if base == "s_movk_i32":
        def run(m, w):
            dest(m, w, np.full(m.s[r][w].shape, simm, I64))
        return run, dict(ssrc=set(), sdst=dest.regs)
    if base not in ("s_addk_i32", "s_mulk_i32"):
        raise ctx.fail(f"{base}")
    add = base == "s_addk_i32"

    def run_k(m, w):
        a = _i(m.s[r][w])
        dbits = None
        if m.check_undefined and r in m.s_undef:
            dbits = np.where(m.sdef[r][w] == FULL, U64(0xFFFFFFFF), U64(0))
        if add:
            res, overflow = _signed_add(a, simm)
            m.scc[w] = overflow
            if m.check_undefined:
                m.scc_def[w] = True if dbits is None else dbits != 0
        else:
            res = a * simm
        dest(m, w, res, dbits)
    return run_k, dict(ssrc={r}, sdst=dest.regs)


def build_setreg(ctx, pi, base):
    """s_setreg_imm32_b32 hwreg(HW_REG_MODE, offset, size), value: MODE bits."""
    name, offset, size = pi.modifiers["hwreg"]
    if name != "HW_REG_MODE" or base != "s_setreg_imm32_b32":
        raise ctx.fail(f"{base} of {name}")
    value = int(pi.operands[0].value)
    mask = ((1 << size) - 1) << offset

    def run(m, w):
        m.mode[w] = (m.mode[w] & U32(~mask & 0xFFFFFFFF)) | U32((value << offset) & mask)
    return run, dict(ssrc=set(), sdst=set())


def build_smem(ctx, pi, base, memory_of):
    """s_load_dword{,x2,x4,x8,x16} sdst, sbase, offset: dwords from sbase + offset."""
    sizes = {"s_load_dword": 1, "s_load_dwordx2": 2, "s_load_dwordx4": 4,
             "s_load_dwordx8": 8, "s_load_dwordx16": 16}
    if base not in sizes:
        raise ctx.fail(base)
    n = sizes[base]
    ops = pi.operands
    mods = dict(pi.modifiers)
    for name in mods:
        if name not in ("glc", "dlc", "nv"):
            raise ctx.fail(f"modifier {name!r} on {base}")
    dst = ctx.sreg(ops[0])
    if ops[0].count != n:
        raise ctx.fail(f"{ops[0].text} for {n} dwords", "parse")
    sbase = scalar_reader_64(ctx, ops[1])
    offset = scalar_reader_32(ctx, ops[2]) if len(ops) > 2 else (lambda m, w: U32(0))
    addr_regs = set(ops[1].regs()) | (set(ops[2].regs()) if len(ops) > 2 and ops[2].kind ==
                                       "s" else set())
    inst = ctx.inst

    def run(m, w):
        definedness.require_scalar(m, w, inst, addr_regs, "the address register")
        addr = (_u(sbase(m, w)) + _u(offset(m, w))) & ~U64(3)
        addr = np.broadcast_to(addr, m.s[dst][w].shape)
        try:
            data = memory_of(m).read(addr, 4 * n)
        except AccessError as e:
            raise m.fault("memory", f"scalar load: {e}", inst, w, address=e.address,
                          wave_index=_wave(m, w, e.index)) from None
        words = data.view(U32).reshape(-1, n)
        for i in range(n):
            m.write_s(w, dst + i, words[:, i])
        m.stats["smem_bytes"] += data.size
        waitcnt.issue(m, w, inst, "lgkm", sregs=range(dst, dst + n), in_order=False)
    return run, dict(ssrc=addr_regs, sdst=set(range(dst, dst + n)),
                     memory=True)


def _wave(m, w, i):
    return int(np.arange(m.W)[w][i])
