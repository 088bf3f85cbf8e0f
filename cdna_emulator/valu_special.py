"""Vector instructions that are not plain element-wise maps: carries and condition masks in
SGPR pairs, lane reads/writes, the division helpers, the narrow-format conversions with byte
or word selects, lane swaps, and the packed (VOP3P) operations.

Each builder returns ``(run, info)`` like ``valu.build_generic``. Semantics: the CDNA4 ISA
pseudocode of each opcode (see ``valu_ops.py`` for the source); conversion rules in
``numerics.py``.
"""

from __future__ import annotations

import numpy as np

from . import numerics as nx
from .defined import lane_defined, mask_defined, set_mask_def, set_vdef
from .machine import bits_to_mask, mask_to_bits
from .operands import VCC
from .sources import registers_read, scalar_reader_32, vector_reader_32, vector_reader_64
from .valu import check_modifiers, make_dest, make_post, make_source

U32, U64, I64, F32 = np.uint32, np.uint64, np.int64, np.float32


def _mask_reader(ctx, op):
    """Reader of a per-lane condition held in an SGPR pair (or VCC)."""
    if op.kind != "s" or op.count != 2:
        raise ctx.fail(f"expected an SGPR pair, got {op.text!r}")
    r = op.index
    return lambda m, w: bits_to_mask(m.s[r][w], m.s[r + 1][w]), {r, r + 1}


def _write_mask(m, w, r, mask):
    mask = np.broadcast_to(mask, m.exec[w].shape) & m.exec[w]
    lo, hi = mask_to_bits(mask)
    m.write_s(w, r, lo)
    m.write_s(w, r + 1, hi)


def _cndmask_source(ctx, op, enc, mods, index):
    """A v_cndmask_b32 source as raw bits; ``|x|`` / ``-x`` (VOP3) act on the fp32 sign bit
    (CDNA4 ISA: floating-point modifiers are valid when the sources are fp32 values)."""
    if not (op.neg or op.abs):
        return make_source(ctx, op, "b32", enc, mods, index)
    typed = make_source(ctx, op, "f32", enc, mods, index)
    return lambda m, w: np.asarray(typed(m, w), np.float32).view(np.uint32)


def build_cndmask(ctx, pi, base, enc):
    mods = dict(pi.modifiers)
    check_modifiers(ctx, enc, mods)
    ops = pi.operands
    if len(ops) != 4:
        raise ctx.fail("v_cndmask_b32 takes dst, src0, src1, condition", "parse")
    r0, r1 = (_cndmask_source(ctx, ops[i + 1], enc, mods, i) for i in (0, 1))
    cond, cond_regs = _mask_reader(ctx, ops[3])
    post = make_post(ctx, "b32", mods, enc, base)
    write, dst = make_dest(ctx, ops[0], "b32", enc, mods)

    def run(m, w):
        write(m, w, post(np.where(cond(m, w), r1(m, w), r0(m, w))))
    vs, ss = registers_read(ctx, ops[1:3])

    def defined(m, w, run_):
        """A lane's result is defined when its condition bit and the selected source are."""
        d0 = lane_defined(m, w, *registers_read(ctx, ops[1:2]))
        d1 = lane_defined(m, w, *registers_read(ctx, ops[2:3]))
        shape = m.exec[w].shape
        d0 = np.ones(shape, bool) if d0 is None else d0
        d1 = np.ones(shape, bool) if d1 is None else d1
        c = cond(m, w)
        d = np.where(c, d1, d0)
        cd = mask_defined(m, w, min(cond_regs))
        if cd is not None:
            d = d & cd
        run_(m, w)
        for r in dst:
            m.write_v_def(w, r, d)
    return run, dict(vsrc=vs, ssrc=ss | cond_regs, vdst=set(dst), sdst=set(),
                     special=defined)


CARRY_OPS = {
    # name: (uses carry in, function(a, b, cin) -> (result int64, carry out bool))
    "v_add_co_u32": (False, lambda a, b, c: (a + b, a + b > 0xFFFFFFFF)),
    "v_sub_co_u32": (False, lambda a, b, c: (a - b, b > a)),
    "v_subrev_co_u32": (False, lambda a, b, c: (b - a, a > b)),
    "v_addc_co_u32": (True, lambda a, b, c: (a + b + c, a + b + c > 0xFFFFFFFF)),
    "v_subb_co_u32": (True, lambda a, b, c: (a - b - c, b + c > a)),
    "v_subbrev_co_u32": (True, lambda a, b, c: (b - a - c, a + c > b)),
}


def build_carry(ctx, pi, base, enc):
    uses_cin, fn = CARRY_OPS[base]
    mods = dict(pi.modifiers)
    check_modifiers(ctx, enc, mods)
    ops = pi.operands
    need = 5 if uses_cin else 4
    if len(ops) != need:
        raise ctx.fail(f"{base} takes {need} operands", "parse")
    dst, sdst = ops[0], ops[1]
    if sdst.kind != "s" or sdst.count != 2:
        raise ctx.fail(f"carry destination {sdst.text!r}")
    ra = make_source(ctx, ops[2], "u32", enc, mods, 0)
    rb = make_source(ctx, ops[3], "u32", enc, mods, 1)
    cin, cin_regs = _mask_reader(ctx, ops[4]) if uses_cin else (None, set())
    saturate = bool(mods.get("clamp"))
    write, dregs = make_dest(ctx, dst, "u32", enc, {})
    s = sdst.index

    def run(m, w):
        a = np.asarray(ra(m, w)).astype(I64)
        b = np.asarray(rb(m, w)).astype(I64)
        c = cin(m, w).astype(I64) if cin is not None else 0
        res, carry = fn(a, b, c)
        if saturate:
            res = np.clip(res, 0, 0xFFFFFFFF)
        write(m, w, np.asarray(res).astype(U32))
        _write_mask(m, w, s, carry)
    vs, ss = registers_read(ctx, ops[2:4])
    return run, dict(vsrc=vs, ssrc=ss | cin_regs, vdst=set(dregs), sdst={s, s + 1},
                     cond=frozenset(cin_regs) or None)


def build_mad64(ctx, pi, base, enc):
    """v_mad_u64_u32 / v_mad_i64_i32: {carry, D64} = S0 * S1 + S2 (65-bit)."""
    check_modifiers(ctx, enc, dict(pi.modifiers), extra=("clamp",))
    ops = pi.operands
    signed = base == "v_mad_i64_i32"
    ra = vector_reader_32(ctx, ops[2])
    rb = vector_reader_32(ctx, ops[3])
    rc = vector_reader_64(ctx, ops[4])
    write, dregs = make_dest(ctx, ops[0], "u64", enc, {})
    s = ctx.sreg(ops[1])

    def run(m, w):
        # signed: bit 64 of the 65-bit two's complement sum is the sign of the true result.
        a = np.asarray(ra(m, w)).view(np.int32).astype(I64)
        b = np.asarray(rb(m, w)).view(np.int32).astype(I64)
        c = np.asarray(rc(m, w), U64).view(I64)
        p = a * b
        with np.errstate(over="ignore"):
            res = p + c
        overflow = ((p ^ res) & (c ^ res)) < 0
        write(m, w, res.view(U64))
        _write_mask(m, w, s, (res < 0) ^ overflow)

    def run_fast(m, w):
        # unsigned: a*b < 2**64, + c may carry
        a = np.asarray(ra(m, w)).astype(U64)
        b = np.asarray(rb(m, w)).astype(U64)
        c = np.asarray(rc(m, w), U64)
        prod = a * b
        low = prod + c
        write(m, w, low)
        _write_mask(m, w, s, low < prod)
    vs, ss = registers_read(ctx, ops[2:5], [1, 1, 2])
    lo_vs, lo_ss = registers_read(ctx, ops[2:5], [1, 1, 1])

    def defined(m, w, run_):
        """Per dword: ``D[31:0] = (S0 * S1 + S2[31:0]) mod 2**32`` (a carry moves only up),
        so the low dword is defined when S0, S1 and S2's low dword are; the high dword and
        the carry need all of S2. LLVM's 64 x 32-bit multiply adds the high partial product
        into a pair whose high dword it never wrote and keeps only the low dword
        (``v_mad_u64_u32 v[18:19], s[18:19], v9, s24, v[18:19]`` in Triton's select_blocks)."""
        d_lo = lane_defined(m, w, lo_vs, lo_ss)
        d_all = lane_defined(m, w, vs, ss)
        run_(m, w)
        set_vdef(m, w, dregs[:1], d_lo)
        set_vdef(m, w, dregs[1:], d_all)
        set_mask_def(m, w, {s, s + 1}, d_all)
    return (run if signed else run_fast), dict(vsrc=vs, ssrc=ss, vdst=set(dregs),
                                               sdst={s, s + 1}, special=defined)


def build_div_scale(ctx, pi, base, enc):
    check_modifiers(ctx, enc, dict(pi.modifiers))
    ops = pi.operands
    readers = [make_source(ctx, op, "f32", "e64", {}, i) for i, op in enumerate(ops[2:5])]
    write, dregs = make_dest(ctx, ops[0], "f32", enc, {})
    s = ctx.sreg(ops[1])

    def run(m, w):
        d, vcc = nx.div_scale_f32(*(r(m, w) for r in readers))
        write(m, w, d.view(U32))
        _write_mask(m, w, s, vcc)
    vs, ss = registers_read(ctx, ops[2:5])
    return run, dict(vsrc=vs, ssrc=ss, vdst=set(dregs), sdst={s, s + 1})


def build_div_fmas(ctx, pi, base, enc):
    check_modifiers(ctx, enc, dict(pi.modifiers))
    ops = pi.operands
    readers = [make_source(ctx, op, "f32", "e64", {}, i) for i, op in enumerate(ops[1:4])]
    write, dregs = make_dest(ctx, ops[0], "f32", enc, {})

    def run(m, w):
        vcc = bits_to_mask(m.s[VCC][w], m.s[VCC + 1][w])
        write(m, w, nx.div_fmas_f32(*(r(m, w) for r in readers), vcc).view(U32))
    vs, ss = registers_read(ctx, ops[1:4])
    return run, dict(vsrc=vs, ssrc=ss | {VCC, VCC + 1}, vdst=set(dregs), sdst=set(),
                     cond=frozenset({VCC, VCC + 1}))


def build_div_fixup(ctx, pi, base, enc):
    check_modifiers(ctx, enc, dict(pi.modifiers))
    ops = pi.operands
    readers = [make_source(ctx, op, "f32", "e64", {}, i) for i, op in enumerate(ops[1:4])]
    write, dregs = make_dest(ctx, ops[0], "f32", enc, {})

    def run(m, w):
        write(m, w, nx.div_fixup_f32(*(r(m, w) for r in readers)).view(U32))
    vs, ss = registers_read(ctx, ops[1:4])
    return run, dict(vsrc=vs, ssrc=ss, vdst=set(dregs), sdst=set())


def build_fmac(ctx, pi, base, enc):
    """v_fmac_f32 / v_mac_f32: D = S0 * S1 + D."""
    mods = dict(pi.modifiers)
    check_modifiers(ctx, enc, mods)
    ops = pi.operands
    r0 = make_source(ctx, ops[1], "f32", enc, mods, 0)
    r1 = make_source(ctx, ops[2], "f32", enc, mods, 1)
    rd = make_source(ctx, ops[0], "f32", "e64", {}, 2)
    post = make_post(ctx, "f32", mods, enc, base)
    write, dregs = make_dest(ctx, ops[0], "f32", enc, mods)
    exact = base == "v_fmac_f32"

    def run(m, w):
        a, b, c = r0(m, w), r1(m, w), rd(m, w)
        if exact:
            res = nx.fma_f32(a, b, c)
        else:
            with np.errstate(all="ignore"):
                res = (a * b).astype(F32) + c
        write(m, w, post(res))
    vs, ss = registers_read(ctx, ops[:3])
    return run, dict(vsrc=vs, ssrc=ss, vdst=set(dregs), sdst=set())


def build_readlane(ctx, pi, base, enc):
    ops = pi.operands
    check_modifiers(ctx, enc, dict(pi.modifiers))
    src = ctx.vreg(ops[1], 1)
    d = ctx.sreg(ops[0])
    if base == "v_readfirstlane_b32":
        def run(m, w):
            ex = m.exec[w]
            lane = np.where(ex.any(axis=1), ex.argmax(axis=1), 0)
            vals = m.v[src][w]
            m.write_s(w, d, vals[np.arange(vals.shape[0]), lane])
        return run, dict(vsrc={src}, ssrc=set(), vdst=set(), sdst={d}, lane_read=src,
                         lane_of=lambda m, w: (lambda ex: np.where(ex.any(axis=1),
                                                                   ex.argmax(axis=1), 0))(
                             m.exec[w]))
    sel = scalar_reader_32(ctx, ops[2])

    def run_lane(m, w):
        lane = (np.broadcast_to(sel(m, w), (m.v[src][w].shape[0],)) & U32(63)).astype(
            np.int64)
        vals = m.v[src][w]
        m.write_s(w, d, vals[np.arange(vals.shape[0]), lane])
    _, ss = registers_read(ctx, ops[2:3])
    return run_lane, dict(vsrc={src}, ssrc=ss, vdst=set(), sdst={d}, lane_read=src,
                          lane_of=lambda m, w: (np.broadcast_to(
                              sel(m, w), (m.v[src][w].shape[0],)) & U32(63)).astype(np.int64))


def build_writelane(ctx, pi, base, enc):
    """v_writelane_b32 vD, sS, lane: writes one lane whatever EXEC says."""
    ops = pi.operands
    check_modifiers(ctx, enc, dict(pi.modifiers))
    dst = ctx.vreg(ops[0], 1)
    val = scalar_reader_32(ctx, ops[1])
    sel = scalar_reader_32(ctx, ops[2])

    def run(m, w):
        n = m.v[dst][w].shape[0]
        lane = (np.broadcast_to(sel(m, w), (n,)) & U32(63)).astype(np.int64)
        waves = np.arange(m.W)[w]
        m.v[dst][waves, lane] = np.broadcast_to(val(m, w), (n,))
        if m.check_undefined:
            m.vdef[dst][waves, lane] = True
    _, ss = registers_read(ctx, ops[1:3])
    return run, dict(vsrc=set(), ssrc=ss, vdst=set(), sdst=set(), lane_write=dst)


def build_permlane_swap(ctx, pi, base, enc):
    """v_permlane16_swap_b32 / v_permlane32_swap_b32 vD, vS: swap lane blocks between the
    two registers (ISA pseudocode); EXEC is not consulted by the pseudocode."""
    ops = pi.operands
    check_modifiers(ctx, enc, dict(pi.modifiers), extra=("fi", "bound_ctrl"))
    d, s = ctx.vreg(ops[0], 1), ctx.vreg(ops[1], 1)
    lane = np.arange(64)
    if base == "v_permlane32_swap_b32":
        upper = lane >= 32
    else:
        upper = (lane % 32) >= 16
    partner = np.where(upper, lane - (32 if base.endswith("32_swap_b32") else 16),
                       lane + (32 if base.endswith("32_swap_b32") else 16))

    def run(m, w):
        vd, vs = m.v[d][w], m.v[s][w]
        # src lanes in the lower block take dst's upper block, and vice versa.
        new_s = np.where(upper[None, :], vs, vd[:, partner])
        new_d = np.where(upper[None, :], vs[:, partner], vd)
        m.v[s][w] = new_s
        m.v[d][w] = new_d
        if m.check_undefined:
            m.forget_halves(w, d)
            m.forget_halves(w, s)
            dd, ds = m.vdef[d][w], m.vdef[s][w]
            m.vdef[s][w] = np.where(upper[None, :], ds, dd[:, partner])
            m.vdef[d][w] = np.where(upper[None, :], ds[:, partner], dd)
            if not (m.vdef[s].all() and m.vdef[d].all()):
                m.v_undef.update((s, d))
    return run, dict(vsrc={d, s}, ssrc=set(), vdst=set(), sdst=set(), lane_write=d,
                     self_defining=True)
