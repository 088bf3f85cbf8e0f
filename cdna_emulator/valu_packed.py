"""Packed (VOP3P) vector instructions: v_pk_*_f32 on register pairs, v_pk_*_f16/u16 on the two
halves of one register, and v_fma_mix_f32.

Operand selection (LLVM AMDGPUModifierSyntax, VOP3P ``op_sel``/``op_sel_hi``; CDNA4 ISA
V_PK_*_F32 pseudocode): for each source i, ``op_sel[i]`` picks the half (dword of a pair for
the F32 forms, 16-bit half for the 16-bit forms) that feeds the low result and ``op_sel_hi[i]``
the one that feeds the high result; the defaults are op_sel 0 and op_sel_hi 1. ``neg_lo`` /
``neg_hi`` negate a source's contribution to the low / high result. For v_fma_mix_f32,
``op_sel_hi[i] = 1`` makes source i an f16 taken from the half ``op_sel[i]``, 0 an f32.
"""

from __future__ import annotations

import numpy as np

from . import numerics as nx
from .defined import lane_defined
from .sources import registers_read, vector_reader_32, vector_reader_64
from .valu import check_modifiers

U32, U64, F32 = np.uint32, np.uint64, np.float32

PK_F32 = {
    "v_pk_add_f32": (2, lambda a, b: (a + b).astype(F32)),
    "v_pk_mul_f32": (2, lambda a, b: (a * b).astype(F32)),
    "v_pk_fma_f32": (3, nx.fma_f32),
    "v_pk_mov_b32": (2, None),
}
PK_16 = {
    "v_pk_mul_f16": (2, "f16", lambda a, b: a * b),
    "v_pk_add_f16": (2, "f16", lambda a, b: a + b),
    "v_pk_fma_f16": (3, "f16", lambda a, b, c: a * b + c),
    "v_pk_max_f16": (2, "f16", np.fmax),
    "v_pk_max_u16": (2, "u16", np.maximum),
    "v_pk_min_u16": (2, "u16", np.minimum),
    "v_pk_add_u16": (2, "u16", lambda a, b: (a + b) & U32(0xFFFF)),
    "v_pk_mul_lo_u16": (2, "u16", lambda a, b: (a * b) & U32(0xFFFF)),
    # AMD CDNA4 ISA guide, "Instructions" chapter, VOP3P opcodes 4-6 (the CDNA3 guide has
    # the same three), V_PK_LSHLREV_B16: "tmp[31:16].u16 = (S1[31:16].u16 << S0.u32[19:16]);
    # tmp[15:0].u16 = (S1[15:0].u16 << S0.u32[3:0])" (pseudocode as tinygrad extracts it,
    # autogen/amd/cdna/str_pcode.py): each half of S1 shifted by the low 4 bits of the same
    # half of S0, the halves as op_sel / op_sel_hi select them. Triton's gfx942/gfx950 index
    # kernel (a bf16 query) shifts bytes into place with it.
    "v_pk_lshlrev_b16": (2, "u16", lambda a, b: (b << (a & U32(15))) & U32(0xFFFF)),
    "v_pk_lshrrev_b16": (2, "u16", lambda a, b: b >> (a & U32(15))),
    "v_pk_ashrrev_i16": (2, "u16", lambda a, b: (
        b.astype(np.uint16).view(np.int16) >> (a & U32(15)).astype(np.int16)).view(
        np.uint16).astype(U32)),
}
VOP3P_MODS = ("op_sel", "op_sel_hi", "neg_lo", "neg_hi", "clamp")


def _sel(mods, name, n, default):
    v = tuple(mods.get(name, (default,) * n))
    return v + (default,) * (n - len(v))


def build_pk_f32(ctx, pi, base, enc):
    n, fn = PK_F32[base]
    mods = dict(pi.modifiers)
    check_modifiers(ctx, enc, mods, extra=VOP3P_MODS)
    if mods.get("clamp"):
        raise ctx.fail(f"clamp on {base}")
    ops = pi.operands
    if len(ops) != n + 1:
        raise ctx.fail(f"{base} takes {n + 1} operands", "parse")
    lo_sel, hi_sel = _sel(mods, "op_sel", n, 0), _sel(mods, "op_sel_hi", n, 1)
    if fn is None:
        # v_pk_mov_b32: D.lo = S0's dword op_sel[0], D.hi = S1's dword op_sel[1]; op_sel_hi
        # plays no part (LLVM's SIInstrInfo::copyPhysReg copies a pair as op_sel:[0,1] and
        # swaps its halves as op_sel:[1,0], both with op_sel_hi [1,1]).
        hi_sel = (lo_sel[1], lo_sel[1])
    neg_lo, neg_hi = _sel(mods, "neg_lo", n, 0), _sel(mods, "neg_hi", n, 0)
    readers = []
    for i, op in enumerate(ops[1:]):
        if op.kind == "const" and (lo_sel[i] or hi_sel[i]):
            raise ctx.fail(f"constant {op.text} read through a high dword")
        readers.append(vector_reader_64(ctx, op) if op.kind != "const" else
                       vector_reader_32(ctx, op, "f32"))
    d = ctx.vreg(ops[0], 2)

    def halves(m, w):
        lo_args, hi_args = [], []
        for i, r in enumerate(readers):
            v = np.asarray(r(m, w))
            words = ((v & U64(0xFFFFFFFF)).astype(U32), (v >> U64(32)).astype(U32)) if \
                v.dtype == U64 else (v.astype(U32), v.astype(U32))
            lo, hi = words[lo_sel[i]], words[hi_sel[i]]
            if neg_lo[i]:
                lo = lo ^ nx.F32_SIGN
            if neg_hi[i]:
                hi = hi ^ nx.F32_SIGN
            lo_args.append(lo)
            hi_args.append(hi)
        return lo_args, hi_args

    def run(m, w):
        lo_args, hi_args = halves(m, w)
        if fn is None:
            lo, hi = lo_args[0], hi_args[1]
        else:
            with np.errstate(all="ignore"):
                lo = np.asarray(fn(*(a.view(F32) for a in lo_args)), F32).view(U32)
                hi = np.asarray(fn(*(a.view(F32) for a in hi_args)), F32).view(U32)
        m.write_v(w, d, lo)
        m.write_v(w, d + 1, hi)
    # The registers each result half reads: source i's dword op_sel[i] (low result) and
    # op_sel_hi[i] (high result); a pair read only through its low dword reads one register.
    lo_regs, hi_regs, s_regs = set(), set(), set()
    feeds = ((True, False), (False, True)) if fn is None else ((True, True),) * n
    for i, op in enumerate(ops[1:]):
        dwords = [s for s, used in zip((lo_sel[i], hi_sel[i]), feeds[i], strict=True) if used]
        if op.kind in ("v", "a"):
            base = ctx.vreg(op, 2)
            if feeds[i][0]:
                lo_regs.add(base + lo_sel[i])
            if feeds[i][1]:
                hi_regs.add(base + hi_sel[i])
        elif op.kind == "s":
            s_regs.update(op.index + s for s in dwords)

    def defined(m, w, run_):
        d_lo = lane_defined(m, w, lo_regs, s_regs)
        d_hi = lane_defined(m, w, hi_regs, s_regs)
        run_(m, w)
        if d_lo is not None:
            m.write_v_def(w, d, d_lo)
        if d_hi is not None:
            m.write_v_def(w, d + 1, d_hi)
    return run, dict(vsrc=lo_regs | hi_regs, ssrc=s_regs, vdst={d, d + 1}, sdst=set(),
                     special=defined)


def build_pk_16(ctx, pi, base, enc):
    n, t, fn = PK_16[base]
    mods = dict(pi.modifiers)
    check_modifiers(ctx, enc, mods, extra=VOP3P_MODS)
    if mods.get("clamp"):
        raise ctx.fail(f"clamp on {base}")
    ops = pi.operands
    lo_sel, hi_sel = _sel(mods, "op_sel", n, 0), _sel(mods, "op_sel_hi", n, 1)
    neg_lo, neg_hi = _sel(mods, "neg_lo", n, 0), _sel(mods, "neg_hi", n, 0)
    if t != "f16" and (any(neg_lo) or any(neg_hi)):
        raise ctx.fail(f"neg_lo/neg_hi on {base}")
    for i, op in enumerate(ops[1:]):
        if op.kind == "const" and hi_sel[i]:
            raise ctx.fail(f"constant {op.text} read through a high half")
    readers = [vector_reader_32(ctx, op, "f16" if t == "f16" else "b16") for op in ops[1:]]
    d = ctx.vreg(ops[0], 1)

    def value(bits, neg):
        h = bits & U32(0xFFFF)
        if t == "f16":
            if neg:
                h = h ^ U32(0x8000)
            return nx.f16_bits_to_f32(h).astype(np.float64)
        return h

    def out_bits(v):
        if t == "f16":
            with np.errstate(all="ignore"):
                return np.asarray(v, np.float64).astype(np.float16).view(np.uint16).astype(U32)
        return np.asarray(v).astype(U32) & U32(0xFFFF)

    def run(m, w):
        raws = [np.asarray(r(m, w), U32) for r in readers]
        lo = fn(*(value(raw >> U32(16 * lo_sel[i]), neg_lo[i]) for i, raw in enumerate(raws)))
        hi = fn(*(value(raw >> U32(16 * hi_sel[i]), neg_hi[i]) for i, raw in enumerate(raws)))
        m.write_v(w, d, out_bits(lo) | (out_bits(hi) << U32(16)))
    vs, ss = registers_read(ctx, ops[1:])
    return run, dict(vsrc=vs, ssrc=ss, vdst={d}, sdst=set())


def build_fma_mix(ctx, pi, base, enc):
    """v_fma_mix_f32: fp32 fma of sources that are each f32 or a selected f16 half."""
    mods = dict(pi.modifiers)
    check_modifiers(ctx, enc, mods, extra=VOP3P_MODS)
    if mods.get("clamp") or "neg_hi" in mods:
        raise ctx.fail(f"clamp/neg_hi on {base}")
    ops = pi.operands
    sel, is_half = _sel(mods, "op_sel", 3, 0), _sel(mods, "op_sel_hi", 3, 0)
    readers = [vector_reader_32(ctx, op, "f16" if is_half[i] else "f32")
               for i, op in enumerate(ops[1:])]
    negs = [op.neg for op in ops[1:]]
    abss = [op.abs for op in ops[1:]]
    d = ctx.vreg(ops[0], 1)

    def operand(i, raw):
        raw = np.asarray(raw, U32)
        if is_half[i]:
            v = nx.f16_bits_to_f32((raw >> U32(16 * sel[i])) & U32(0xFFFF))
        else:
            v = raw.view(F32)
        if abss[i]:
            v = np.abs(v)
        return -v if negs[i] else v

    def run(m, w):
        a, b, c = (operand(i, r(m, w)) for i, r in enumerate(readers))
        m.write_v(w, d, nx.fma_f32(a, b, c).view(U32))
    vs, ss = registers_read(ctx, ops[1:])
    return run, dict(vsrc=vs, ssrc=ss, vdst={d}, sdst=set())
