"""Operand readers: closures that fetch an operand's raw bits for the selected waves.

A vector reader returns uint32 (or uint64 for 64-bit operands) broadcastable to ``[n, 64]``:
a VGPR plane ``[n, 64]``, an SGPR column ``[n, 1]`` or a numpy scalar constant. A scalar
reader returns ``[n]`` (or a scalar constant). The compile context maps AGPRs into the unified
VGPR file and refuses registers outside the kernel's allocation at parse time.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .errors import EmulatorFault
from .operands import EXEC, SGPR_FILE, Operand, constant_bits

U32, U64 = np.uint32, np.uint64


@dataclasses.dataclass
class Context:
    """What compiling one instruction of one kernel needs to know."""

    arch: str
    vgpr_file: int
    accum_offset: int
    text: str = ""
    line: int = 0
    inst: object = None  # the Instruction being compiled (faults name it)

    def fail(self, message: str, kind: str = "unsupported") -> EmulatorFault:
        return EmulatorFault(kind, message, instruction=self.text, line=self.line)

    def vreg(self, op: Operand, count: int | None = None) -> int:
        """Unified VGPR index of a v/a register operand (checked against the allocation)."""
        n = op.count if count is None else count
        if op.kind == "v":
            base = op.index
            if base + n > self.accum_offset and self.accum_offset < self.vgpr_file:
                # ArchVGPRs end at accum_offset when AGPRs are allocated after them.
                if base + n > self.vgpr_file:
                    raise self.fail(f"{op.text} is outside the kernel's {self.vgpr_file} VGPRs",
                                    "parse")
        elif op.kind == "a":
            base = self.accum_offset + op.index
        else:
            raise self.fail(f"expected a vector register, got {op.text!r}")
        if base + n > self.vgpr_file:
            raise self.fail(f"{op.text} is outside the kernel's register file "
                            f"({self.vgpr_file} VGPRs+AGPRs)", "parse")
        return base

    def sreg(self, op: Operand) -> int:
        if op.kind != "s" or op.index + op.count > SGPR_FILE:
            raise self.fail(f"expected a scalar register, got {op.text!r}")
        return op.index


def vector_reader_32(ctx: Context, op: Operand, kind: str = "b32"):
    """Reader of a 32-bit (or narrower) vector-instruction source."""
    if op.kind in ("v", "a"):
        r = ctx.vreg(op, 1)
        return lambda m, w: m.v[r][w]
    if op.kind == "s":
        r = ctx.sreg(op)
        return lambda m, w: m.s[r][w][:, None]
    if op.kind == "const":
        c = U32(constant_bits(op, kind))
        return lambda m, w: c
    raise ctx.fail(f"operand {op.text!r} cannot be a vector source")


def vector_reader_64(ctx: Context, op: Operand, kind: str = "b64"):
    """Reader of a 64-bit vector-instruction source (register pair or constant)."""
    if op.kind in ("v", "a"):
        r = ctx.vreg(op, 2)

        def read(m, w):
            return m.v[r][w].astype(U64) | (m.v[r + 1][w].astype(U64) << U64(32))
        return read
    if op.kind == "s":
        r = ctx.sreg(op)

        def read_s(m, w):
            return (m.s[r][w].astype(U64) | (m.s[r + 1][w].astype(U64) << U64(32)))[:, None]
        return read_s
    if op.kind == "const":
        c = U64(constant_bits(op, kind))
        return lambda m, w: c
    raise ctx.fail(f"operand {op.text!r} cannot be a 64-bit vector source")


def scalar_reader_32(ctx: Context, op: Operand, kind: str = "b32"):
    if op.kind == "s":
        r = ctx.sreg(op)
        return lambda m, w: m.s[r][w]
    if op.kind == "const":
        c = U32(constant_bits(op, kind))
        return lambda m, w: c
    if op.kind == "special" and op.value in ("scc", "src_scc"):
        return lambda m, w: m.scc[w].astype(U32)
    raise ctx.fail(f"operand {op.text!r} cannot be a scalar source")


def scalar_reader_64(ctx: Context, op: Operand, kind: str = "b64"):
    if op.kind == "s":
        r = ctx.sreg(op)
        return lambda m, w: m.s[r][w].astype(U64) | (m.s[r + 1][w].astype(U64) << U64(32))
    if op.kind == "const":
        c = U64(constant_bits(op, kind))
        return lambda m, w: c
    raise ctx.fail(f"operand {op.text!r} cannot be a 64-bit scalar source")


def registers_read(ctx: Context, ops, counts=None) -> tuple[set[int], set[int]]:
    """(VGPR indices, SGPR indices) that source operands ``ops`` read."""
    vs, ss = set(), set()
    for i, op in enumerate(ops):
        n = op.count if counts is None else counts[i]
        if op.kind in ("v", "a"):
            base = ctx.vreg(op, n)
            vs.update(range(base, base + n))
        elif op.kind == "s":
            ss.update(range(op.index, op.index + n))
    return vs, ss


def touches_exec(index: int, count: int) -> bool:
    return index <= EXEC + 1 and index + count > EXEC
