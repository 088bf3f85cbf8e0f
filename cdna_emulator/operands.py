"""Operands of AMDGPU assembly as LLVM prints them (GFX9 family: gfx90a, gfx942, gfx950).

Registers: ``v5``, ``v[2:3]``, ``s7``, ``s[0:1]``, ``a[0:3]``, the named SGPRs (``vcc``,
``vcc_lo``, ``exec``, ``m0``, ``flat_scratch``...), constants (inline integers -16..64, the
inline floats +-0.5, 1, 2, 4 and 1/(2*pi), and 32-bit literals), ``off`` and labels.
Source modifiers: ``-x`` (neg), ``|x|`` / ``abs(x)`` (abs), ``sext(x)`` (SDWA sign extension).

The scalar register file is indexed as the hardware encodes it (LLVM ``SIRegisterInfo``,
GFX9): s0..s101, FLAT_SCRATCH 102-103, XNACK_MASK 104-105, VCC 106-107, M0 124,
EXEC 126-127; the emulator keeps all of them in one array of :data:`SGPR_FILE` entries.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import struct

SGPR_FILE = 128
NAMED_SGPRS = {
    "flat_scratch": (102, 2), "flat_scratch_lo": (102, 1), "flat_scratch_hi": (103, 1),
    "xnack_mask": (104, 2), "xnack_mask_lo": (104, 1), "xnack_mask_hi": (105, 1),
    "vcc": (106, 2), "vcc_lo": (106, 1), "vcc_hi": (107, 1),
    "m0": (124, 1),
    "exec": (126, 2), "exec_lo": (126, 1), "exec_hi": (127, 1),
}
VCC, M0, EXEC = 106, 124, 126
INV_2PI = 0.15915494309189532
INLINE_FLOATS = (0.5, -0.5, 1.0, -1.0, 2.0, -2.0, 4.0, -4.0)


@dataclasses.dataclass(frozen=True)
class Operand:
    """One parsed operand.

    ``kind``: ``"v"`` (VGPR), ``"a"`` (AGPR), ``"s"`` (SGPR file, named registers included),
    ``"const"`` (an integer or float constant), ``"off"``, ``"label"``, ``"special"``
    (``scc`` and friends, read by name). ``index``/``count``: first register and number of
    32-bit registers. ``value``: the integer, float or label name. ``literal``: whether a
    constant needs a literal dword (it is not an inline constant).
    """

    kind: str
    index: int = 0
    count: int = 1
    value: object = None
    literal: bool = False
    neg: bool = False
    abs: bool = False
    sext: bool = False
    text: str = ""

    @property
    def is_reg(self) -> bool:
        return self.kind in ("v", "a", "s")

    def regs(self) -> range:
        return range(self.index, self.index + self.count)

    def with_count(self, count: int) -> Operand:
        return dataclasses.replace(self, count=count)


_REG = re.compile(r"^([vsa])(\d+)$")
_RANGE = re.compile(r"^([vsa])\[(\d+):(\d+)\]$")
_NUMBER = re.compile(r"^-?(0x[0-9a-fA-F]+|\d+)$")
_FLOAT = re.compile(r"^-?\d+\.\d*(e-?\d+)?$")
_LABEL = re.compile(r"^[.A-Za-z_$][\w.$@]*$")


@functools.lru_cache(maxsize=65536)
def parse_operand(text: str) -> Operand:
    """An :class:`Operand` from its text; ``ValueError`` if the form is unknown."""
    raw = text.strip()
    body, neg, absolute, sext = raw, False, False, False
    if body.startswith("-") and not _NUMBER.match(body) and not _FLOAT.match(body):
        neg, body = True, body[1:].strip()
    if body.startswith("|") and body.endswith("|"):
        absolute, body = True, body[1:-1].strip()
    elif body.startswith("abs(") and body.endswith(")"):
        absolute, body = True, body[4:-1].strip()
    elif body.startswith("neg(") and body.endswith(")"):
        neg, body = True, body[4:-1].strip()
    if body.startswith("sext(") and body.endswith(")"):
        sext, body = True, body[5:-1].strip()
    op = _plain(body)
    return dataclasses.replace(op, neg=neg, abs=absolute, sext=sext, text=raw)


def _plain(body: str) -> Operand:
    m = _REG.match(body)
    if m:
        return Operand(m.group(1), int(m.group(2)), 1)
    m = _RANGE.match(body)
    if m:
        lo, hi = int(m.group(2)), int(m.group(3))
        if hi < lo:
            raise ValueError(f"register range {body!r}")
        return Operand(m.group(1), lo, hi - lo + 1)
    if body in NAMED_SGPRS:
        index, count = NAMED_SGPRS[body]
        return Operand("s", index, count)
    if body == "off":
        return Operand("off")
    if body in ("scc", "src_scc", "vccz", "execz"):
        return Operand("special", value=body)
    if _NUMBER.match(body):
        value = int(body, 0)
        return Operand("const", value=value, literal=not -16 <= value <= 64)
    if _FLOAT.match(body):
        value = float(body)
        inline = value in INLINE_FLOATS or abs(value - INV_2PI) < 1e-7
        if not inline:
            raise ValueError(f"float literal {body!r} is not an inline constant")
        return Operand("const", value=INV_2PI if abs(value - INV_2PI) < 1e-7 else value)
    if _LABEL.match(body):
        return Operand("label", value=body)
    raise ValueError(f"operand {body!r}")


def f32_bits(x: float) -> int:
    return struct.unpack("<I", struct.pack("<f", x))[0]


def f16_bits(x: float) -> int:
    return struct.unpack("<H", struct.pack("<e", x))[0]


def f64_bits(x: float) -> int:
    return struct.unpack("<Q", struct.pack("<d", x))[0]


def constant_bits(op: Operand, kind: str) -> int:
    """The raw bits a constant operand supplies to a source of type ``kind``.

    ``kind``: ``"b32"``/``"f32"`` (32-bit), ``"b16"``/``"f16"`` (16-bit), ``"b64"``/``"f64"``
    (64-bit). Inline integers are sign-extended to the operand width; inline floats take the
    operand's float format (f16/f64 sources get f16/f64 encodings; integer sources the f32
    encoding, as the hardware's inline-constant table does); a 32-bit literal is used as is
    (its low 16 bits for a 16-bit source; for a 64-bit float source, the high dword).
    """
    value = op.value
    if isinstance(value, float):
        if kind == "f16":
            return f16_bits(value)
        if kind == "f64":
            return f64_bits(value)
        if kind == "b64":
            return f64_bits(value) if op.literal else f32_bits(value)
        return f32_bits(value) & (0xFFFF if kind in ("b16", "bf16") else 0xFFFFFFFF)
    if not isinstance(value, int):
        raise ValueError(f"not a constant: {op.text!r}")
    if kind in ("b64", "f64"):
        if op.literal:
            return (value & 0xFFFFFFFF) << 32 if kind == "f64" else value & (2**64 - 1)
        return value & (2**64 - 1)
    if kind in ("b16", "f16", "bf16"):
        return value & 0xFFFF
    return value & 0xFFFFFFFF
