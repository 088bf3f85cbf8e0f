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


def _formats(ctx, name, kind, scaled, mods):
    """((A format, bits), (B format, bits), f8f6f4?) from the opcode and cbsz/blgp."""
    if kind == "f8f6f4":
        a_code, b_code = int(mods.pop("cbsz", 0)), int(mods.pop("blgp", 0))
        if a_code not in F8F6F4 or b_code not in F8F6F4:
            raise ctx.fail(f"{name}: cbsz:{a_code} blgp:{b_code} (fp6 formats are not "
                           "modelled)")
        return F8F6F4[a_code], F8F6F4[b_code], True
    if kind in DENSE_TYPES and not scaled:
        for field in ("cbsz", "abid", "blgp"):
            if int(mods.pop(field, 0)):
                raise ctx.fail(f"{name}: {field} broadcast controls are not modelled")
        a_fmt, b_fmt, bits = DENSE_TYPES[kind]
        return (a_fmt, bits), (b_fmt, bits), False
    raise ctx.fail(f"opcode {name!r} is not modelled")


class Mfma:
    """One compiled MFMA: operand decoders, accumulator and result layout."""

    def __init__(self, ctx, pi, name):
        match = _NAME.match(name)
        if not match:
            raise ctx.fail(f"opcode {name!r} is not modelled")
        self.scaled = bool(match.group(1))
        m_dim, n_dim, k_dim = (int(match.group(i)) for i in (2, 3, 4))
        if m_dim != n_dim or m_dim not in (16, 32):
            raise ctx.fail(f"{name}: only 16x16 and 32x32 single-block MFMAs are modelled")
        mods = dict(pi.modifiers)
        (a_fmt, a_bits), (b_fmt, b_bits), f8f6f4 = _formats(ctx, name, match.group(5),
                                                              self.scaled, mods)
        if any(tuple(mods.pop("op_sel", ())) + tuple(mods.pop("op_sel_hi", ()))):
            raise ctx.fail(f"{name}: op_sel/op_sel_hi scale-byte selects are not modelled")
        if int(mods.pop("abid", 0)):  # an A-block broadcast select: not modelled, refused
            raise ctx.fail(f"{name}: abid broadcast controls are not modelled")
        if mods:
            raise ctx.fail(f"{name}: modifier(s) {sorted(mods)} are not modelled")
        ops = pi.operands
        if len(ops) != (6 if self.scaled else 4):
            raise ctx.fail(f"{name} takes {6 if self.scaled else 4} operands", "parse")
        self.m_dim, self.n_dim, self.blocks = m_dim, n_dim, k_dim // 32
        self.a = Operand(ctx, ops[1], m_dim, k_dim, a_fmt, a_bits, f8f6f4, transpose=False)
        self.b = Operand(ctx, ops[2], n_dim, k_dim, b_fmt, b_bits, f8f6f4, transpose=True)
        self.out_reg, self.out_lane = output_slot(m_dim)
        self.nout = m_dim * n_dim // 64
        if ops[0].kind not in ("v", "a") or ops[0].count != self.nout:
            raise ctx.fail(f"{ops[0].text}: the result needs {self.nout} registers")
        self.d = ctx.vreg(ops[0], self.nout)
        self.c_reg, self.c_const = self._accumulator_operand(ctx, ops[3])
        self.scales = [_scale_reader(ctx, op) for op in ops[4:6]] if self.scaled else []
        self.block_lanes = np.arange(m_dim)[:, None] + m_dim * np.arange(self.blocks)[None, :]
        self.inst = ctx.inst
        self.sources = self.a.regs() | self.b.regs() | self._c_regs()
        for _, regs in self.scales:
            self.sources |= regs
        self.scalar_sources = {o.index for o in ops[4:6] if o.kind == "s"}

    def _accumulator_operand(self, ctx, c_op):
        if c_op.kind == "const":
            return None, np.float64(np.uint32(constant_bits(c_op, "f32")).view(np.float32))
        if c_op.count != self.nout:
            raise ctx.fail(f"{c_op.text}: C needs {self.nout} registers")
        return ctx.vreg(c_op, self.nout), None

    def _c_regs(self):
        return set(range(self.c_reg, self.c_reg + self.nout)) if self.c_reg is not None \
            else set()

    def _accumulator(self, m, w):
        if self.c_reg is None:
            return self.c_const
        regs = np.stack([m.v[self.c_reg + r][w] for r in range(self.nout)], axis=1)
        return regs[:, self.out_reg, self.out_lane].view(np.float32).astype(np.float64)

    def _product(self, m, w):
        """float64 ``[n, M, N]``: A @ B, block-scaled for the scaled forms."""
        av, bv = self.a.values(m, w), self.b.values(m, w)  # [n, M, K], [n, K, N]
        if not self.scaled:
            return np.matmul(av, bv)
        sa = nx.e8m0_scale(self.scales[0][0](m, w)[:, self.block_lanes])  # [n, M, blocks]
        sb = nx.e8m0_scale(self.scales[1][0](m, w)[:, self.block_lanes])  # [n, N, blocks]
        ab = av.reshape(av.shape[0], self.m_dim, self.blocks, 32)
        bb = bv.reshape(bv.shape[0], self.blocks, 32, self.n_dim)
        partial = np.einsum("nmbk,nbkj->nmjb", ab, bb)
        return np.einsum("nmjb,nmb,njb->nmj", partial, sa, sb)

    def run(self, m, w):
        if not m.all_active(w):
            raise m.fault("unsupported", "MFMA issued with a partial EXEC mask", self.inst, w)
        with np.errstate(all="ignore"):
            res = (self._product(m, w) + self._accumulator(m, w)).astype(np.float32)
        bits = res.view(U32)
        out = np.empty((bits.shape[0], self.nout, 64), U32)
        out[:, self.out_reg, self.out_lane] = bits
        for r in range(self.nout):
            m.write_v(w, self.d + r, out[:, r])
        if m.check_undefined and not self.sources.isdisjoint(m.v_undef):
            self._propagate(m, w)

    def _propagate(self, m, w):
        """D[i][j] is defined iff A's row i, B's column j, C[i][j] and their scales are."""
        ok = self.a.defined_rows(m, w)[:, :, None] & self.b.defined_rows(m, w)[:, None, :]
        if self.c_reg is not None:
            dc = np.stack([m.vdef[self.c_reg + r][w] for r in range(self.nout)], axis=1)
            ok &= dc[:, self.out_reg, self.out_lane]
        for side, (_, scale_regs) in enumerate(self.scales):
            for r in scale_regs:
                per = m.vdef[r][w][:, self.block_lanes].all(axis=2)  # [n, M]
                ok &= per[:, :, None] if side == 0 else per[:, None, :]
        full = np.empty((ok.shape[0], self.nout, 64), bool)
        full[:, self.out_reg, self.out_lane] = ok
        for r in range(self.nout):
            m.write_v_def(w, self.d + r, full[:, r])


def build_mfma(ctx, pi, name):
    op = Mfma(ctx, pi, name)
    return op.run, dict(vsrc=op.sources, ssrc=op.scalar_sources,
                        vdst=set(range(op.d, op.d + op.nout)), sdst=set(), self_defining=True)
