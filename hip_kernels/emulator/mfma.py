"""Matrix instructions (MFMA): dense f16/bf16/fp8/bf8 and the gfx950 f8f6f4 forms, with and
without e8m0 block scales.

Register layouts (which lane and register hold which element), with their sources:

* Output C/D, M = N = 16: D[i][j] is in register ``i % 4`` of lane ``16*(i//4) + j``;
  M = N = 32: register ``4*(i//8) + i%4`` of lane ``32*((i//4)%2) + j``. AMD Matrix
  Instruction Calculator (CDNA3 ``v_mfma_f32_16x16x16_f16`` / ``32x32x8_f16``: "C or D[i][j]
  GPR: (i % 4), Lane: 16 * floor(i / 4) + j" / "GPR: 4 * floor(i / 8) + (i % 4), Lane:
  (32 * floor(i / 4)) % 64 + j"); the same store loops in AMD's matrix-core blog post for
  CDNA3/CDNA4 (16x16x16f16, 32x32x2f32, 32x32x16 fp8, scaled 32x32x64).
* Dense A/B (every type but f8f6f4): lane ``i + M*(k // e)`` holds ``e = K*M/64``
  consecutive k of row i (column j for B), packed low element first. Calculator (CDNA3
  16x16x16_f16: "A[i][k] GPR: (floor(k/2) % 2).[16*(k%2)+15 : 16*(k%2)], Lane: 16*floor(k/4)+i")
  and AMD's composable_kernel warp-gemm attributes for the gfx950-only doubled-K forms
  (``WarpGemmAttributeMfmaImplBf16Bf16F32M16N16K32``: kABKLane 4, kABKPerLane 8).
* f8f6f4, 4-bit formats: lane ``i + M*g`` holds the ``32`` consecutive k ``32g..32g+31``
  (nibble t of the 128-bit lane value, low nibble first); 8-bit formats: lane ``i + M*g`` holds
  two chunks of 16: byte ``c*16 + t`` is k = ``16*(c*G + g) + t`` (G = 64/M lane groups).
  AMD's matrix-core blog post (CDNA4 ``__builtin_amdgcn_mfma_scale_f32_32x32x64_f8f6f4``:
  fp8 ``a_reg[i*16 + j] = A[row][(lane/32)*16 + i*32 + j]``; fp4 16 contiguous bytes from k =
  32*(lane/32)); the same rule for 16x16x128 in Triton's ``chooseScaledMfmaScaleLayout`` comment
  and AMD's rocjitsu ``input_loc``. The 6-bit formats are not modelled (sources disagree).
* Block scales (v_mfma_scale_*): the e8m0 scale of A row i for k-block b (32 k each) is a byte
  of lane ``i + M*b``'s scale register, B column j's of lane ``j + N*b`` (Triton
  ``chooseScaledMfmaScaleLayout``, rocjitsu ``read_mfma_scale_e8m0``, Modular's
  ``cdna4_block_scaled_mfma``; consistent with the blog's one scale entry per lane). Scales
  are applied to each block's dot product before accumulation (blog: "the scales Ax, Bx are
  applied after the normal dot product and prior to output/accumulation"); byte 255 gives NaN.
  A scale held in an SGPR or given as an inline constant uses bits [30:23] of the 32-bit value
  (LLVM PR #158117: "For all Inline/SGPR constants, SP HW use bits [30:23] as the scale").
  Only byte 0 of a scale VGPR (no op_sel) is modelled: which op_sel bit selects which byte is
  not established from a primary source.
* Formats (cbsz for A, blgp for B): 0 e4m3, 1 e5m2, 2 e2m3, 3 e3m2, 4 e2m1 (blog); fp8 is OCP
  on gfx950, FNUZ on gfx942 (blog).

Arithmetic: products are exact and summed in float64 (per 32-element block for the scaled
forms, then scaled exactly), C added, and the result rounded once to fp32. The hardware's
internal summation order and width are not published; results can differ from it in the last
bits when partial sums are not exact (SPEC's GPU tolerance covers this).
MFMAs execute for every lane; an MFMA issued with a partial EXEC is refused (the ISA behaviour
is not established here).
"""

from __future__ import annotations

import re

import numpy as np

from . import numerics as nx
from .sources import constant_bits

U32 = np.uint32

DENSE_TYPES = {
    # suffix: (A format, B format, bits per element)
    "f16": ("f16", "f16", 16), "bf16": ("bf16", "bf16", 16),
    "fp8_fp8": ("fp8", "fp8", 8), "fp8_bf8": ("fp8", "bf8", 8),
    "bf8_fp8": ("bf8", "fp8", 8), "bf8_bf8": ("bf8", "bf8", 8),
}
F8F6F4 = {0: ("fp8", 8), 1: ("bf8", 8), 4: ("fp4", 4)}
_NAME = re.compile(r"^v_mfma_(scale_)?f32_(\d+)x(\d+)x(\d+)_?([a-z0-9_]+)$")


def output_slot(m_dim: int) -> tuple[np.ndarray, np.ndarray]:
    """(register, lane) of D[i][j] for an M x M output, each ``[M, M]``."""
    i, j = np.meshgrid(np.arange(m_dim), np.arange(m_dim), indexing="ij")
    if m_dim == 16:
        return i % 4, 16 * (i // 4) + j
    return 4 * (i // 8) + i % 4, 32 * ((i // 4) % 2) + j


def input_slot(m_dim: int, k_dim: int, bits: int, f8f6f4: bool):
    """(lane, element index within the lane) of A[i][k] (B[k][j] with j for i), ``[M, K]``."""
    i, k = np.meshgrid(np.arange(m_dim), np.arange(k_dim), indexing="ij")
    groups = 64 // m_dim
    per_lane = k_dim // groups
    if f8f6f4 and bits == 8:
        chunk = k // 16
        return i + m_dim * (chunk % groups), (chunk // groups) * 16 + k % 16
    return i + m_dim * (k // per_lane), k % per_lane


class Operand:
    """Decoder of one MFMA source (A or B): registers -> float64 matrix and definedness."""

    def __init__(self, ctx, op, m_dim, k_dim, fmt, bits, f8f6f4, transpose):
        self.nregs = m_dim * k_dim * bits // (64 * 32)
        if op.kind not in ("v", "a") or op.count != self.nregs:
            raise ctx.fail(f"{op.text}: {fmt} operand needs {self.nregs} registers")
        self.reg = ctx.vreg(op, self.nregs)
        self.lane, self.elem = input_slot(m_dim, k_dim, bits, f8f6f4)
        self.fmt, self.bits, self.transpose = fmt, bits, transpose
        arch_fp8 = nx.fp8_formats(ctx.arch)
        self.fp8 = {"fp8": arch_fp8[0], "bf8": arch_fp8[1]}.get(fmt)

    def elements(self, m, w) -> np.ndarray:
        """Per-lane element codes ``[n, 64, per_lane]``."""
        regs = np.stack([m.v[self.reg + r][w] for r in range(self.nregs)], axis=2)
        raw = np.ascontiguousarray(regs).view(np.uint8)  # [n, 64, 4*nregs], little endian
        if self.bits == 8:
            return raw
        if self.bits == 4:
            return np.stack([raw & 15, raw >> 4], axis=3).reshape(raw.shape[0], 64, -1)
        return raw.view(np.uint16)

    def values(self, m, w) -> np.ndarray:
        codes = self.elements(m, w)[:, self.lane, self.elem]  # [n, M, K]
        if self.fmt == "f16":
            vals = codes.view(np.float16).astype(np.float64)
        elif self.fmt == "bf16":
            vals = (codes.astype(U32) << U32(16)).view(np.float32).astype(np.float64)
        elif self.fmt == "fp4":
            vals = nx.fp4_to_f32(codes).astype(np.float64)
        else:
            vals = nx.fp8_to_f32(codes, self.fp8).astype(np.float64)
        return vals.transpose(0, 2, 1) if self.transpose else vals

    def defined_rows(self, m, w) -> np.ndarray:
        """bool ``[n, M]``: every element of each row (column of B) defined (a lane holds
        elements of one row only, so lane-level definedness is exact)."""
        lane_ok = np.stack([m.vdef[self.reg + r][w] for r in range(self.nregs)],
                           axis=2).all(axis=2)
        return lane_ok[:, self.lane].all(axis=2)

    def regs(self):
        return set(range(self.reg, self.reg + self.nregs))


def _scale_reader(ctx, op):
    """Per-lane e8m0 bytes ``[n, 64]`` of a scale operand."""
    if op.kind in ("v", "a"):
        r = ctx.vreg(op, 1)
        return lambda m, w: (m.v[r][w] & U32(0xFF)).astype(np.int64), {r}
    if op.kind == "s":
        r = ctx.sreg(op)
        return (lambda m, w: np.broadcast_to(
            ((m.s[r][w] >> U32(23)) & U32(0xFF)).astype(np.int64)[:, None],
            m.exec[w].shape)), set()
    if op.kind == "const":
        byte = (constant_bits(op, "f32") >> 23) & 0xFF
        return (lambda m, w: np.full(m.exec[w].shape, byte, np.int64)), set()
    raise ctx.fail(f"scale operand {op.text!r}")


def build_mfma(ctx, pi, name):
    match = _NAME.match(name)
    if not match:
        raise ctx.fail(f"opcode {name!r} is not modelled")
    scaled = bool(match.group(1))
    m_dim, n_dim, k_dim = (int(match.group(i)) for i in (2, 3, 4))
    kind = match.group(5)
    mods = dict(pi.modifiers)
    if m_dim != n_dim or m_dim not in (16, 32):
        raise ctx.fail(f"{name}: only 16x16 and 32x32 single-block MFMAs are modelled")
    if kind == "f8f6f4":
        a_code, b_code = int(mods.pop("cbsz", 0)), int(mods.pop("blgp", 0))
        if a_code not in F8F6F4 or b_code not in F8F6F4:
            raise ctx.fail(f"{name}: cbsz:{a_code} blgp:{b_code} (fp6 formats are not "
                           "modelled)")
        (a_fmt, a_bits), (b_fmt, b_bits) = F8F6F4[a_code], F8F6F4[b_code]
        f8f6f4 = True
    elif kind in DENSE_TYPES and not scaled:
        a_fmt, b_fmt, a_bits = DENSE_TYPES[kind]
        b_bits = a_bits
        f8f6f4 = False
        for field in ("cbsz", "abid", "blgp"):
            if int(mods.pop(field, 0)):
                raise ctx.fail(f"{name}: {field} broadcast controls are not modelled")
    else:
        raise ctx.fail(f"opcode {name!r} is not modelled")
    op_sel = tuple(mods.pop("op_sel", ())) + tuple(mods.pop("op_sel_hi", ()))
    if any(op_sel):
        raise ctx.fail(f"{name}: op_sel/op_sel_hi scale-byte selects are not modelled")
    mods.pop("abid", None)
    if mods:
        raise ctx.fail(f"{name}: modifier(s) {sorted(mods)} are not modelled")
    ops = pi.operands
    if len(ops) != (6 if scaled else 4):
        raise ctx.fail(f"{name} takes {6 if scaled else 4} operands", "parse")
    a = Operand(ctx, ops[1], m_dim, k_dim, a_fmt, a_bits, f8f6f4, transpose=False)
    b = Operand(ctx, ops[2], n_dim, k_dim, b_fmt, b_bits, f8f6f4, transpose=True)
    out_reg, out_lane = output_slot(m_dim)
    nout = m_dim * n_dim // 64
    if ops[0].kind not in ("v", "a") or ops[0].count != nout:
        raise ctx.fail(f"{ops[0].text}: the result needs {nout} registers")
    d = ctx.vreg(ops[0], nout)
    c_op = ops[3]
    if c_op.kind == "const":
        c_const = np.float64(np.uint32(constant_bits(c_op, "f32")).view(np.float32))
        c_reg = None
    else:
        if c_op.count != nout:
            raise ctx.fail(f"{c_op.text}: C needs {nout} registers")
        c_reg, c_const = ctx.vreg(c_op, nout), None
    scales = [_scale_reader(ctx, op) for op in ops[4:6]] if scaled else []
    blocks = k_dim // 32
    inst = ctx.inst

    def accumulator(m, w):
        if c_reg is None:
            return c_const
        regs = np.stack([m.v[c_reg + r][w] for r in range(nout)], axis=1)  # [n, R, 64]
        return regs[:, out_reg, out_lane].view(np.float32).astype(np.float64)

    def run(m, w):
        if not m.all_active(w):
            raise m.fault("unsupported", "MFMA issued with a partial EXEC mask", inst, w)
        av, bv = a.values(m, w), b.values(m, w)  # [n, M, K], [n, K, N]
        with np.errstate(all="ignore"):
            if scaled:
                sa_lanes, sb_lanes = scales[0][0](m, w), scales[1][0](m, w)
                rows = np.arange(m_dim)[:, None] + m_dim * np.arange(blocks)[None, :]
                sa = nx.e8m0_scale(sa_lanes[:, rows])  # [n, M, blocks]
                sb = nx.e8m0_scale(sb_lanes[:, rows])  # [n, N, blocks]
                ab = av.reshape(av.shape[0], m_dim, blocks, 32)
                bb = bv.reshape(bv.shape[0], blocks, 32, n_dim)
                partial = np.einsum("nmbk,nbkj->nmjb", ab, bb)
                acc = np.einsum("nmjb,nmb,njb->nmj", partial, sa, sb)
            else:
                acc = np.matmul(av, bv)
            res = (acc + accumulator(m, w)).astype(np.float32)
        bits = res.view(U32)
        out = np.empty((bits.shape[0], nout, 64), U32)
        out[:, out_reg, out_lane] = bits
        for r in range(nout):
            m.write_v(w, d + r, out[:, r])
        if m.check_undefined:
            _propagate(m, w)

    def _propagate(m, w):
        srcs = a.regs() | b.regs() | (set(range(c_reg, c_reg + nout)) if c_reg is not None
                                      else set())
        for _, scale_regs in scales:
            srcs |= scale_regs
        if srcs.isdisjoint(m.v_undef):
            return
        ok = a.defined_rows(m, w)[:, :, None] & b.defined_rows(m, w)[:, None, :]
        if c_reg is not None:
            dc = np.stack([m.vdef[c_reg + r][w] for r in range(nout)], axis=1)
            ok &= dc[:, out_reg, out_lane]
        block_lanes = np.arange(m_dim)[:, None] + m_dim * np.arange(blocks)[None, :]
        for side, (_, scale_regs) in enumerate(scales):
            for r in scale_regs:
                per = m.vdef[r][w][:, block_lanes].all(axis=2)  # [n, M]
                ok &= per[:, :, None] if side == 0 else per[:, None, :]
        full = np.empty((ok.shape[0], nout, 64), bool)
        full[:, out_reg, out_lane] = ok
        for r in range(nout):
            m.write_v_def(w, d + r, full[:, r])

    srcs = a.regs() | b.regs() | (set(range(c_reg, c_reg + nout)) if c_reg is not None else
                                  set())
    for s in scales:
        srcs |= s[1]
    ssrc = {o.index for o in ops[4:6] if o.kind == "s"} if scaled else set()
    return run, dict(vsrc=srcs, ssrc=ssrc, vdst=set(range(d, d + nout)), sdst=set(),
                     self_defining=True)
