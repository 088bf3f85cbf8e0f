"""The narrow-format conversion instructions of gfx942/gfx950 (fp8, bf8, fp4, with and without
an e8m0 scale) and their byte/word selects.

Pseudocode (CDNA4 ISA): ``V_CVT_PK_FP8_F32`` writes ``{fp8(S1), fp8(S0)}`` into the low word
of D, or the high word when OPSEL[3], keeping the other word; ``V_CVT_SCALEF32_*`` take the
scale as ``exponent(S.f32)`` (the biased exponent bits [30:23] of an fp32 operand);
up-conversions multiply by 2**(scale-127); ``V_CVT_SCALEF32_PK_F32_FP4`` reads the byte
``OPSEL[1:0]`` (assembly ``op_sel:[x,y,...]`` gives OPSEL[0]=x, OPSEL[1]=y: LLVM commit
1a86d44c80d2, "MC support for v_cvt_scale_fp4<->f32 of gfx950") with the low nibble first;
the ``_PK_F32_FP8``/``_PK_F16_FP8`` forms read the word OPSEL[0]. Down-conversions divide by
the scale (AMD's rocjitsu emulator's test of ``v_cvt_scalef32_pk_fp8_f32``: scale 2.0 gives
fp8(x/2)); our kernels pass scale 1.0. fp8 means e4m3fn/e5m2 (OCP) on gfx950 and the FNUZ
variants on gfx942. Overflow: NaN (e4m3) or inf (e5m2) unless MODE.FP16_OVFL (bit 23, which
Triton sets with ``s_setreg_imm32_b32 hwreg(HW_REG_MODE, 23, 1), 1``) saturates (Triton PR
#7337 turns the bit on for exactly this reason).
"""

from __future__ import annotations

import numpy as np

from . import numerics as nx
from .defined import lane_defined, set_vdef
from .sources import registers_read
from .valu import check_modifiers, make_dest, make_source

U32 = np.uint32
FP16_OVFL_BIT = 23


def _op_sel(mods, n):
    sel = tuple(mods.get("op_sel", (0,) * n))
    return sel + (0,) * (n - len(sel))


def _saturate(m, w):
    return (((m.mode[w] >> U32(FP16_OVFL_BIT)) & U32(1)) == 1)[:, None]


def build_cvt_pk_fp8(ctx, pi, base, enc):
    """v_cvt_pk_{fp8,bf8}_f32 vD, s0, s1 [op_sel:[0,0,1]] and the scalef32 forms."""
    mods = dict(pi.modifiers)
    check_modifiers(ctx, "e64", mods)
    scaled = "scalef32" in base
    fmt = nx.fp8_formats(ctx.arch)[0 if "fp8_f32" in base else 1]
    ops = pi.operands
    n_src = 3 if scaled else 2
    sel = _op_sel(mods, n_src + 1)
    if any(sel[:n_src]):
        raise ctx.fail(f"op_sel {sel} on {base}: only the destination-word bit is modelled")
    high_word = bool(sel[n_src])
    r0 = make_source(ctx, ops[1], "f32", "e64", {}, 0)
    r1 = make_source(ctx, ops[2], "f32", "e64", {}, 1)
    rs = make_source(ctx, ops[3], "b32", "e64", {}, 2) if scaled else None
    d = ctx.vreg(ops[0], 1)
    write, dregs = make_dest(ctx, ops[0], "b32", "e64", {})
    shift = U32(16 if high_word else 0)
    keep = U32(0x0000FFFF if high_word else 0xFFFF0000)

    def run(m, w):
        a, b = r0(m, w), r1(m, w)
        if rs is not None:
            e = nx.f32_exponent_field(rs(m, w)).astype(np.int64)
            with np.errstate(all="ignore"):
                div = np.ldexp(1.0, (e - 127).astype(np.int32))
                a = (np.asarray(a, np.float64) / div).astype(np.float32)
                b = (np.asarray(b, np.float64) / div).astype(np.float32)
        sat = _saturate(m, w)
        word = nx.f32_to_fp8(a, fmt, sat) | (nx.f32_to_fp8(b, fmt, sat) << U32(8))
        write(m, w, (m.v[d][w] & keep) | (word.astype(U32) << shift))
    vs, ss = registers_read(ctx, (*ops[1:], ops[0]))
    src_vs, src_ss = registers_read(ctx, ops[1:])

    def defined(m, w, run_):
        """Per half: the written word is defined where its sources are, the kept word keeps
        its own definedness (Triton's gfx950 attention writes v48's low word from the query,
        then its high word from other registers, and reads the low word back)."""
        new = lane_defined(m, w, src_vs, src_ss)
        new = np.ones(m.exec[w].shape, bool) if new is None else new
        kept = m.half_defined(w, d, 0 if high_word else 1)
        run_(m, w)
        m.write_half_def(w, d, *((kept, new) if high_word else (new, kept)))
    return run, dict(vsrc=vs, ssrc=ss, vdst=set(dregs), sdst=set(), special=defined)


UP_CONVERSIONS = {
    # name: (source format, elements out, out type, select: "byte" | "word")
    "v_cvt_scalef32_pk_f32_fp4": ("fp4", 2, "f32", "byte"),
    "v_cvt_scalef32_pk_f32_fp8": ("fp8", 2, "f32", "word"),
    "v_cvt_scalef32_pk_f32_bf8": ("bf8", 2, "f32", "word"),
    "v_cvt_scalef32_pk_f16_fp8": ("fp8", 2, "f16", "word"),
    "v_cvt_scalef32_pk_f16_bf8": ("bf8", 2, "f16", "word"),
    "v_cvt_scalef32_pk_bf16_fp8": ("fp8", 2, "bf16", "word"),
    "v_cvt_scalef32_pk_bf16_bf8": ("bf8", 2, "bf16", "word"),
    "v_cvt_scalef32_f32_fp8": ("fp8", 1, "f32", "byte"),
    "v_cvt_scalef32_f32_bf8": ("bf8", 1, "f32", "byte"),
}


def build_cvt_scale_up(ctx, pi, base, enc):
    """Scaled up-conversions: narrow codes x 2**(exponent(scale)-127), one rounding."""
    fmt_name, count, out_t, select = UP_CONVERSIONS[base]
    mods = dict(pi.modifiers)
    check_modifiers(ctx, "e64", mods)
    sel = _op_sel(mods, 3)
    if select == "byte":
        offset = 8 * (sel[0] + 2 * sel[1])
    else:
        if sel[1]:
            raise ctx.fail(f"op_sel {sel} on {base}")
        offset = 16 * sel[0]
    fmt = (None if fmt_name == "fp4" else nx.fp8_formats(ctx.arch)[0 if fmt_name == "fp8"
                                                                    else 1])
    ops = pi.operands
    rsrc = make_source(ctx, ops[1], "b32", "e64", {}, 0)
    rscale = make_source(ctx, ops[2], "b32", "e64", {}, 1)
    wide = out_t == "f32" and count == 2
    d = ctx.vreg(ops[0], 2 if wide else 1)

    def decode(code):
        return nx.fp4_to_f32(code) if fmt is None else nx.fp8_to_f32(code, fmt)

    def run(m, w):
        src = np.asarray(rsrc(m, w), U32) >> U32(offset)
        scale = nx.e8m0_scale(nx.f32_exponent_field(rscale(m, w)))
        if fmt is None:
            codes = [src & U32(0xF), (src >> U32(4)) & U32(0xF)]
        else:
            codes = [src & U32(0xFF), (src >> U32(8)) & U32(0xFF)]
        with np.errstate(all="ignore"):
            vals = [decode(c).astype(np.float64) * scale for c in codes[:count]]
        if out_t == "f32":
            for i, v in enumerate(vals):
                m.write_v(w, d + i, v.astype(np.float32).view(U32))
        else:
            # f16: numpy's rounding; bf16: RNE from fp32 (an fp8 value times a power of two
            # is exact in fp32, so one rounding either way)
            narrow = (nx.f32_to_f16_bits if out_t == "f16" else
                      lambda v: nx.f32_to_bf16_bits(v.view(U32)))
            halves = [np.asarray(narrow(v.astype(np.float32)), U32) for v in vals]
            m.write_v(w, d, halves[0] | (halves[1] << U32(16)))
    vs, ss = registers_read(ctx, ops[1:3])
    scale_vs, scale_ss = registers_read(ctx, ops[2:3])
    dsts = range(d, d + (2 if wide else 1))

    def defined(m, w, run_):
        """The result is defined where the scale and the 16-bit half of the source holding
        the selected codes are (a word write may have left the other half undefined)."""
        ok = lane_defined(m, w, scale_vs, scale_ss)
        ok = np.ones(m.exec[w].shape, bool) if ok is None else ok
        if ops[1].kind in ("v", "a"):
            ok = ok & m.half_defined(w, ctx.vreg(ops[1], 1), offset // 16)
        else:
            src = lane_defined(m, w, *registers_read(ctx, ops[1:2]))
            ok = ok if src is None else ok & src
        run_(m, w)
        set_vdef(m, w, dsts, ok)
    return run, dict(vsrc=vs, ssrc=ss, vdst=set(dsts), sdst=set(), special=defined)


def build_cvt_f32_fp8(ctx, pi, base, enc):
    """v_cvt_f32_{fp8,bf8} (byte by SDWA src0_sel) and v_cvt_pk_f32_{fp8,bf8} (word by
    src0_sel WORD_1), unscaled."""
    mods = dict(pi.modifiers)
    sel = mods.pop("src0_sel", "BYTE_0" if "_pk_" not in base else "WORD_0")
    mods.pop("dst_sel", None)
    mods.pop("dst_unused", None)
    check_modifiers(ctx, "e64", mods)
    fmt = nx.fp8_formats(ctx.arch)[0 if base.endswith("fp8") else 1]
    ops = pi.operands
    rsrc = make_source(ctx, ops[1], "b32", "e64", {}, 0)
    pk = "_pk_" in base
    offsets = {"BYTE_0": 0, "BYTE_1": 8, "BYTE_2": 16, "BYTE_3": 24, "WORD_0": 0,
               "WORD_1": 16, "DWORD": 0}
    if sel not in offsets:
        raise ctx.fail(f"src0_sel:{sel}")
    offset = offsets[sel]
    d = ctx.vreg(ops[0], 2 if pk else 1)

    def run(m, w):
        src = np.asarray(rsrc(m, w), U32) >> U32(offset)
        m.write_v(w, d, nx.fp8_to_f32(src & U32(0xFF), fmt).view(U32))
        if pk:
            m.write_v(w, d + 1, nx.fp8_to_f32((src >> U32(8)) & U32(0xFF), fmt).view(U32))
    vs, ss = registers_read(ctx, ops[1:2])
    return run, dict(vsrc=vs, ssrc=ss, vdst=set(range(d, d + (2 if pk else 1))), sdst=set())
