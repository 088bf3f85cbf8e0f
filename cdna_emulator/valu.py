"""Compiling vector ALU instructions (VOP1/VOP2/VOP3/VOPC, SDWA and DPP forms) to closures.

:func:`build` turns one parsed instruction into ``(run, info)``: ``run(m, w)`` executes it for
waves ``w`` of machine ``m``; ``info`` lists the registers it reads and writes (the fault model
uses them). Source modifiers (neg, abs, SDWA selects and sign extension, DPP lane moves) and
result modifiers (omod, clamp, SDWA destination selects) are applied here; each opcode's own
arithmetic is in ``valu_ops.py`` or ``valu_special.py``. A modifier the emulator does not model
raises ``EmulatorFault("unsupported")`` at compile time.

Rules not in the opcode pseudocode, with their sources (see README.md):

* 16-bit results on GFX9 (gfx90a/gfx942/gfx950) zero the high 16 bits of the destination
  (LLVM ``GCNSubtarget::zeroesHigh16BitsOfDest``, "derived from experimentation").
* SDWA: a selected BYTE/WORD is zero-extended, or sign-extended with ``sext()``; the result is
  placed by ``dst_sel`` with the other bits zeroed (UNUSED_PAD), sign-extended (UNUSED_SEXT)
  or kept (UNUSED_PRESERVE) (GCN3/Vega ISA SDWA description; LLVM AMDGPUModifierSyntax).
* DPP (GFX9 "DPP8"-less form): rows of 16 lanes; an invalid source lane (outside the row or the
  wave, or with EXEC clear) reads 0 with ``bound_ctrl:1`` and otherwise leaves the destination
  lane unwritten; ``row_mask``/``bank_mask`` bits clear leave lanes unwritten.
"""

from __future__ import annotations

import numpy as np

from . import numerics as nx
from . import valu_ops
from .machine import mask_to_bits
from .sources import Context, registers_read, vector_reader_32, vector_reader_64

U32, U64, I32 = np.uint32, np.uint64, np.int32
F32, F64 = np.float32, np.float64

WIDE = {"u64", "b64", "i64", "f64"}
HALF = {"u16", "b16", "i16", "f16"}
SIGN_BITS = {"f32": U32(0x80000000), "f16": U32(0x8000), "f64": U64(1 << 63)}
VALID_MODIFIERS = {
    "": set(), "e32": set(), "e64": {"clamp", "mul", "div", "op_sel"},
    "sdwa": {"dst_sel", "dst_unused", "src0_sel", "src1_sel", "clamp", "mul", "div"},
    "dpp": {"quad_perm", "row_shl", "row_shr", "row_ror", "row_mirror", "row_half_mirror",
            "row_bcast", "wave_shl", "wave_shr", "wave_rol", "wave_ror", "row_mask",
            "bank_mask", "bound_ctrl"},
}
SEL = {"BYTE_0": (0, 8), "BYTE_1": (8, 8), "BYTE_2": (16, 8), "BYTE_3": (24, 8),
       "WORD_0": (0, 16), "WORD_1": (16, 16), "DWORD": (0, 32)}


def split_mnemonic(mnemonic: str) -> tuple[str, str]:
    for enc in ("e32", "e64", "sdwa", "dpp"):
        if mnemonic.endswith("_" + enc):
            return mnemonic[: -len(enc) - 1], enc
    return mnemonic, ""


def to_type(raw, t):
    """Raw bits (uint32 / uint64) as a value of source type ``t``."""
    if t in ("u32", "b32", "u64", "b64"):
        return raw
    if t == "i32":
        return raw.view(I32)
    if t == "f32":
        return raw.view(F32)
    if t in ("u16", "b16"):
        return raw & U32(0xFFFF)
    if t == "i16":
        return ((raw & U32(0xFFFF)).astype(I32) ^ I32(0x8000)) - I32(0x8000)
    if t == "f16":
        return nx.f16_bits_to_f32(raw).astype(F64)
    if t == "i64":
        return raw.view(np.int64)
    if t == "f64":
        return raw.view(F64)
    raise ValueError(t)


def to_bits(res, t, saturate=False):
    """A result of type ``t`` as raw uint32 (uint64 for 64-bit types) bits."""
    if t == "f32":
        return np.asarray(res, F32).view(U32)
    if t == "f16":
        with np.errstate(all="ignore"):
            return np.asarray(res, F64).astype(np.float16).view(np.uint16).astype(U32)
    if t in ("u16", "b16", "i16"):
        res = np.asarray(res)
        if saturate:
            res = np.clip(res, 0, 0xFFFF)
        return res.astype(U32) & U32(0xFFFF)
    if t == "f64":
        return np.asarray(res, F64).view(U64)
    if t in WIDE:
        return np.asarray(res).astype(U64)
    res = np.asarray(res)
    if saturate:
        res = np.clip(res, 0, 0xFFFFFFFF)
    return res.astype(U32)


def float_modifiers(op, t, ctx):
    """(and_mask, xor_mask) applying abs/neg to raw bits, or None."""
    if not (op.neg or op.abs):
        return None
    if t not in SIGN_BITS:
        raise ctx.fail(f"neg/abs on a {t} source ({op.text})")
    sign = SIGN_BITS[t]
    dtype = U64 if t == "f64" else U32
    and_mask = dtype(~sign & (2**64 - 1 if t == "f64" else 0xFFFFFFFF)) if op.abs else None
    return and_mask, (sign if op.neg else None)


def sdwa_select(raw, sel, sext):
    shift, width = SEL[sel]
    if width == 32:
        return raw
    v = (raw >> U32(shift)) & U32((1 << width) - 1)
    if sext:
        top = U32(1 << (width - 1))
        v = ((v ^ top).astype(np.int64) - int(top)).astype(I32).view(U32)
    return v


def make_source(ctx, op, t, enc, mods, index):
    """Reader returning the typed value of source ``index``."""
    if t in WIDE:
        raw = vector_reader_64(ctx, op, "f64" if t == "f64" else "b64")
    else:
        kind = "f16" if t == "f16" else ("b16" if t in HALF else "b32")
        raw = vector_reader_32(ctx, op, kind)
    if enc == "sdwa":
        sel = mods.get(f"src{index}_sel", "DWORD")
        if sel not in SEL:
            raise ctx.fail(f"src{index}_sel:{sel}")
        if sel != "DWORD" or op.sext:
            base = raw
            def raw(m, w, b=base, s=sel, x=op.sext):
                return (sdwa_select(
                            np.asarray(b(m, w), U32), s, x))
    elif op.sext:
        raise ctx.fail(f"sext() outside SDWA ({op.text})")
    fm = float_modifiers(op, t, ctx)
    if fm is not None:
        base, (and_mask, xor_mask) = raw, fm

        def raw(m, w, b=base, a=and_mask, x=xor_mask):
            v = b(m, w)
            if a is not None:
                v = v & a
            if x is not None:
                v = v ^ x
            return v
    if t in ("u32", "b32", "u64", "b64"):
        return raw
    return lambda m, w, r=raw: to_type(r(m, w), t)


def make_post(ctx, t, mods, enc, base):
    """Result modifiers: omod (mul:2/4, div:2) and clamp, applied to the typed result."""
    scale = 1.0
    if "mul" in mods:
        scale = float(mods["mul"])
    if "div" in mods:
        scale = 1.0 / float(mods["div"])
    clamp = bool(mods.get("clamp"))
    if scale != 1.0 and t not in ("f32", "f16"):
        raise ctx.fail(f"omod on a {t} result")
    saturate = clamp and base in valu_ops.UNSIGNED_SATURATING
    if clamp and not saturate and t not in ("f32", "f16"):
        raise ctx.fail(f"clamp on {base}")
    float_clamp = clamp and t in ("f32", "f16")

    def post(res):
        if scale != 1.0:
            with np.errstate(all="ignore"):
                res = (np.asarray(res, F64) * scale).astype(F32 if t == "f32" else F64)
        if float_clamp:
            with np.errstate(invalid="ignore"):
                res = np.where(np.isnan(res), 0.0, np.clip(res, 0.0, 1.0)).astype(
                    F32 if t == "f32" else F64)
        return to_bits(res, t, saturate)
    return post


def make_dest(ctx, op, t, enc, mods):
    """Writer of a result (raw bits) to the destination VGPR(s); ``mask`` = extra lane mask."""
    if t in WIDE:
        r = ctx.vreg(op, 2)

        def write64(m, w, bits, mask=None):
            bits = np.asarray(bits, U64)
            m.write_v(w, r, (bits & U64(0xFFFFFFFF)).astype(U32), mask)
            m.write_v(w, r + 1, (bits >> U64(32)).astype(U32), mask)
        return write64, (r, r + 1)
    r = ctx.vreg(op, 1)
    if enc == "sdwa":
        sel = mods.get("dst_sel", "DWORD")
        unused = mods.get("dst_unused", "UNUSED_PAD")
        if sel not in SEL or unused not in ("UNUSED_PAD", "UNUSED_SEXT", "UNUSED_PRESERVE"):
            raise ctx.fail(f"dst_sel:{sel} dst_unused:{unused}")
        shift, width = SEL[sel]
        if width < 32:
            field = U32(((1 << width) - 1) << shift)

            def write_sel(m, w, bits, mask=None):
                v = (np.asarray(bits, U32) << U32(shift)) & field
                if unused == "UNUSED_PRESERVE":
                    v = v | (m.v[r][w] & ~field)
                elif unused == "UNUSED_SEXT":
                    top = (v >> U32(shift + width - 1)) & U32(1)
                    high = U32((0xFFFFFFFF << (shift + width)) & 0xFFFFFFFF)
                    v = v | np.where(top == 1, high, U32(0))
                m.write_v(w, r, v, mask)
            return write_sel, (r,)
    return (lambda m, w, bits, mask=None: m.write_v(w, r, bits, mask)), (r,)


def check_modifiers(ctx, enc, mods, extra=()):
    allowed = VALID_MODIFIERS.get(enc, set()) | set(extra)
    for name in mods:
        if name not in allowed:
            raise ctx.fail(f"modifier {name!r} is not modelled for this instruction")


def build_generic(ctx: Context, pi, base: str, enc: str):
    """Element-wise opcodes of ``valu_ops.OPS`` (and v_bitop3_*)."""
    mods = dict(pi.modifiers)
    if base in valu_ops.BITOP3:
        spec = (valu_ops.BITOP3[base], ("b32",) * 3 if base.endswith("32") else ("b16",) * 3,
                valu_ops.bitop3(int(mods.pop("bitop3", 0))))
    else:
        spec = valu_ops.OPS[base]
    dst_t, src_ts, func = spec
    check_modifiers(ctx, enc, mods)
    if "op_sel" in mods and any(mods["op_sel"]):
        raise ctx.fail(f"op_sel on {base}")
    ops = pi.operands
    if len(ops) != 1 + len(src_ts):
        raise ctx.fail(f"{base} takes {1 + len(src_ts)} operands, got {len(ops)}", "parse")
    dpp = make_dpp(ctx, mods) if enc == "dpp" else None
    readers = [make_source(ctx, op, t, enc, mods, i) for i, (op, t) in
               enumerate(zip(ops[1:], src_ts, strict=True))]
    post = make_post(ctx, dst_t, mods, enc, base)
    write, dst_regs = make_dest(ctx, ops[0], dst_t, enc, mods)
    if base in valu_ops.PRESERVE_HIGH:
        low_write, dreg = write, ctx.vreg(ops[0], 1)

        def write(m, w, bits, mask=None):
            low_write(m, w, (m.v[dreg][w] & U32(0xFFFF0000)) | bits, mask)
    counts = [2 if t in WIDE else 1 for t in src_ts]
    vsrc, ssrc = registers_read(ctx, ops[1:], counts)
    if dpp is not None:
        run = dpp_run(ctx, ops[1], src_ts[0], readers, func, post, write, dpp)
    elif len(readers) == 1:
        r0 = readers[0]

        def run(m, w):
            write(m, w, post(func(r0(m, w))))
    elif len(readers) == 2:
        r0, r1 = readers

        def run(m, w):
            write(m, w, post(func(r0(m, w), r1(m, w))))
    else:
        r0, r1, r2 = readers

        def run(m, w):
            write(m, w, post(func(r0(m, w), r1(m, w), r2(m, w))))
    return run, dict(vsrc=vsrc, ssrc=ssrc, vdst=set(dst_regs), sdst=set(),
                     dpp_src=(ctx.vreg(ops[1], 1) if dpp is not None else None),
                     dpp=dpp)


# ---- DPP ----------------------------------------------------------------------------------------

def dpp_lanes(ctx, mods) -> tuple[np.ndarray, np.ndarray]:
    """(source lane of each lane, whether that source is in range) for a DPP control."""
    lane = np.arange(64)
    row, pos = lane // 16, lane % 16
    src, valid = lane.copy(), np.ones(64, bool)
    if "quad_perm" in mods:
        sel = np.asarray(mods["quad_perm"])
        src = (lane & ~3) + sel[lane & 3]
    elif "row_shl" in mods:
        n = int(mods["row_shl"])
        src, valid = lane + n, pos + n < 16
    elif "row_shr" in mods:
        n = int(mods["row_shr"])
        src, valid = lane - n, pos >= n
    elif "row_ror" in mods:
        n = int(mods["row_ror"])
        src = row * 16 + (pos - n) % 16
    elif "row_mirror" in mods:
        src = row * 16 + 15 - pos
    elif "row_half_mirror" in mods:
        src = lane - lane % 8 + 7 - lane % 8
    elif "row_bcast" in mods:
        n = int(mods["row_bcast"])
        if n == 15:
            src, valid = row * 16 - 1, row >= 1
        elif n == 31:
            src, valid = np.full(64, 31), row >= 2
        else:
            raise ctx.fail(f"row_bcast:{n}")
    elif "wave_shl" in mods:
        src, valid = lane + 1, lane < 63
    elif "wave_shr" in mods:
        src, valid = lane - 1, lane > 0
    elif "wave_rol" in mods:
        src = (lane + 1) % 64
    elif "wave_ror" in mods:
        src = (lane - 1) % 64
    return np.clip(src, 0, 63).astype(np.int64), valid


def make_dpp(ctx, mods):
    src, valid = dpp_lanes(ctx, mods)
    row_mask = int(mods.get("row_mask", 0xF))
    bank_mask = int(mods.get("bank_mask", 0xF))
    lane = np.arange(64)
    enabled = (((row_mask >> (lane // 16)) & 1) == 1) & (((bank_mask >> ((lane % 16) // 4))
                                                         & 1) == 1)
    return dict(src=src, valid=valid, enabled=enabled, bound_ctrl=bool(mods.get("bound_ctrl",
                                                                                  0)))


def dpp_run(ctx, op0, t0, readers, func, post, write, dpp):
    """DPP moves src0 (a VGPR) across lanes before the operation."""
    if op0.kind not in ("v", "a"):
        raise ctx.fail("DPP src0 must be a VGPR")
    src_lane, valid, enabled, bound = dpp["src"], dpp["valid"], dpp["enabled"], dpp[
        "bound_ctrl"]
    r0 = ctx.vreg(op0, 1)
    rest = readers[1:]
    fm = float_modifiers(op0, t0, ctx)

    def run(m, w):
        raw = m.v[r0][w][:, src_lane]
        ok = valid[None, :] & m.exec[w][:, src_lane]
        if bound:
            raw = np.where(ok, raw, U32(0))
            lanes = np.broadcast_to(enabled, ok.shape)
        else:
            lanes = ok & enabled[None, :]
        if fm is not None:
            and_mask, xor_mask = fm
            raw = raw & and_mask if and_mask is not None else raw
            raw = raw ^ xor_mask if xor_mask is not None else raw
        x0 = raw if t0 in ("u32", "b32") else to_type(raw, t0)
        write(m, w, post(func(x0, *(r(m, w) for r in rest))), lanes)
    return run


# ---- VOPC ---------------------------------------------------------------------------------------

INT_CMP = {"f": lambda a, b: np.zeros(np.broadcast(a, b).shape, bool), "lt": np.less,
           "eq": np.equal, "le": np.less_equal, "gt": np.greater, "ne": np.not_equal,
           "lg": np.not_equal, "ge": np.greater_equal,
           "t": lambda a, b: np.ones(np.broadcast(a, b).shape, bool)}
FLOAT_CMP = {"f": INT_CMP["f"], "t": INT_CMP["t"], "tru": INT_CMP["t"], "lt": np.less,
             "eq": np.equal, "le": np.less_equal, "gt": np.greater, "lg": lambda a, b: (a < b)
             | (a > b), "ge": np.greater_equal, "o": lambda a, b: ~(np.isnan(a) | np.isnan(b)),
             "u": lambda a, b: np.isnan(a) | np.isnan(b), "nge": lambda a, b: ~(a >= b),
             "nlg": lambda a, b: ~((a < b) | (a > b)), "ngt": lambda a, b: ~(a > b),
             "nle": lambda a, b: ~(a <= b), "neq": lambda a, b: ~(a == b),
             "nlt": lambda a, b: ~(a < b)}


def f32_class_in(x, mask):
    """V_CMP_CLASS_F32: whether fp32 ``x``'s class is among the ``mask`` bits (CDNA4 ISA:
    bit 0 signaling NaN, 1 quiet NaN, 2 -inf, 3 -normal, 4 -denormal, 5 -0, 6 +0, 7 +denormal,
    8 +normal, 9 +inf)."""
    bits = np.asarray(x, np.float32).view(U32)
    mask = np.asarray(mask, U32)
    negative = (bits >> U32(31)) == 1
    magnitude = bits & U32(0x7FFFFFFF)
    nan = magnitude > U32(0x7F800000)
    quiet = nan & ((bits & U32(0x400000)) != 0)
    inf = magnitude == U32(0x7F800000)
    zero = magnitude == 0
    denormal = (magnitude < U32(0x800000)) & ~zero
    normal = ~(nan | inf | zero | denormal)
    classes = (nan & ~quiet, quiet, negative & inf, negative & normal, negative & denormal,
               negative & zero, ~negative & zero, ~negative & denormal, ~negative & normal,
               ~negative & inf)
    hit = np.zeros(np.broadcast(bits, mask).shape, bool)
    for bit, members in enumerate(classes):
        hit |= members & (((mask >> U32(bit)) & U32(1)) == 1)
    return hit


def build_vopc(ctx: Context, pi, base: str, enc: str):
    parts = base.split("_")  # v_cmp[x]_<op>_<type>
    cmpx = parts[1] == "cmpx"
    op_name, t = parts[2], parts[3]
    table = FLOAT_CMP if t[0] == "f" else INT_CMP
    if op_name == "class" and t == "f32":
        table = {"class": f32_class_in}
    if op_name not in table:
        raise ctx.fail(f"compare {op_name!r} on {t}")
    cmp = table[op_name]
    mods = dict(pi.modifiers)
    check_modifiers(ctx, enc, mods)
    ops = pi.operands
    if enc == "e64" or (enc == "sdwa" and ops[0].kind == "s" and len(ops) == 3) or (
            len(ops) == 3):
        dst, srcs = ops[0], ops[1:]
    else:
        raise ctx.fail(f"{pi.mnemonic}: expected dst, src0, src1", "parse")
    if dst.kind != "s" or dst.count != 2:
        raise ctx.fail(f"compare destination {dst.text!r}")
    types = (t, "u32") if op_name == "class" else (t, t)  # a class mask is an integer
    readers = [make_source(ctx, op, types[i], enc, mods, i) for i, op in enumerate(srcs)]
    r0, r1 = readers
    d = dst.index
    counts = [2 if t in WIDE else 1] * 2
    vsrc, ssrc = registers_read(ctx, srcs, counts)

    def run(m, w):
        with np.errstate(invalid="ignore"):
            res = cmp(r0(m, w), r1(m, w))
        active = m.exec[w]
        res = np.broadcast_to(res, active.shape) & active
        lo, hi = mask_to_bits(res)
        m.write_s(w, d, lo)
        m.write_s(w, d + 1, hi)
        if cmpx:
            m.write_s(w, 126, lo)
            m.write_s(w, 127, hi)
    sdst = {d, d + 1} | ({126, 127} if cmpx else set())
    return run, dict(vsrc=vsrc, ssrc=ssrc, vdst=set(), sdst=sdst, mask_from=(vsrc, ssrc))


def all_waves(m, w):
    return np.arange(m.W)[w]
