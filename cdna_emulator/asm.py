"""Reading AMDGPU assembly text: instructions, labels, kernel descriptors and metadata.

:func:`parse_program` turns the text LLVM prints (FlyDSL's ``.s``, Triton's ``amdgcn``) into
:class:`ParsedInstruction` s (mnemonic, operands, modifiers, source line) in program order,
labels mapped to instruction indices, and one :class:`KernelDescriptor` per
``.amdhsa_kernel`` block, joined with its entry in the ``.amdgpu_metadata`` note (arguments,
wavefront size, sizes). Directives the emulator needs are read; the rest (``.loc``,
``.cfi_*``, sections...) are skipped. Nothing is guessed: an instruction line that cannot be
split into operands and modifiers raises :class:`EmulatorFault` ``parse`` naming the line.
"""

from __future__ import annotations

import dataclasses
import re

from .errors import EmulatorFault
from .metadata import parse_yaml
from .operands import Operand, parse_operand


@dataclasses.dataclass(frozen=True)
class ParsedInstruction:
    """One instruction line: ``mnemonic`` as printed (``_e32``/``_e64``/``_sdwa``/``_dpp``
    kept), ``operands`` in order, ``modifiers`` (``name -> value``; bare flags map to True),
    ``text`` and 1-based ``line``."""

    mnemonic: str
    operands: tuple[Operand, ...]
    modifiers: dict
    text: str
    line: int


@dataclasses.dataclass(frozen=True)
class KernelArg:
    offset: int
    size: int
    value_kind: str
    name: str = ""


@dataclasses.dataclass(frozen=True)
class KernelDescriptor:
    """What the launch needs from the ``.amdhsa_*`` directives and the metadata note."""

    symbol: str
    entry: int  # instruction index of the kernel's first instruction
    directives: dict
    metadata: dict

    def d(self, name: str, default: int = 0) -> int:
        return int(self.directives.get(name, default))

    @property
    def user_sgpr_count(self) -> int:
        return self.d("user_sgpr_count")

    @property
    def next_free_vgpr(self) -> int:
        return self.d("next_free_vgpr")

    @property
    def next_free_sgpr(self) -> int:
        return self.d("next_free_sgpr")

    @property
    def accum_offset(self) -> int:
        return self.d("accum_offset", self.next_free_vgpr)

    @property
    def agpr_count(self) -> int:
        return int(self.metadata.get(".agpr_count", 0))

    @property
    def vgpr_file(self) -> int:
        """Size of the unified VGPR file the kernel may touch (ArchVGPRs, then AGPRs)."""
        return max(self.next_free_vgpr, self.accum_offset + self.agpr_count)

    @property
    def group_segment_size(self) -> int:
        return self.d("group_segment_fixed_size")

    @property
    def private_segment_size(self) -> int:
        return self.d("private_segment_fixed_size")

    @property
    def kernarg_size(self) -> int:
        return self.d("kernarg_size")

    @property
    def wavefront_size(self) -> int:
        return int(self.metadata.get(".wavefront_size", 64))

    @property
    def args(self) -> tuple[KernelArg, ...]:
        return tuple(
            KernelArg(int(a[".offset"]), int(a[".size"]), str(a[".value_kind"]),
                      str(a.get(".name", "")))
            for a in self.metadata.get(".args", []) or []
        )

    @property
    def reqd_workgroup_size(self) -> tuple[int, ...] | None:
        size = self.metadata.get(".reqd_workgroup_size")
        return tuple(int(x) for x in size) if size else None

    @property
    def max_flat_workgroup_size(self) -> int:
        return int(self.metadata.get(".max_flat_workgroup_size", 1024))


@dataclasses.dataclass
class ParsedProgram:
    instructions: list[ParsedInstruction]
    labels: dict[str, int]
    kernels: dict[str, KernelDescriptor]
    target: str


_MODIFIER = re.compile(r"^([a-z_0-9]+):(.+)$")
_BARE_MODIFIERS = {"off", "offen", "idxen", "glc", "slc", "nt", "sc0", "sc1", "lds", "clamp",
                   "tfe", "gds", "addr64", "dlc", "scc"}


_TOP_COMMA = re.compile(r",(?![^\[(]*[\])])")
_TOP_SPACE = re.compile(r"\s+(?![^\[(]*[\])])")


def _split_top(text: str) -> list[str]:
    """Split at commas outside brackets and parentheses (which never nest here)."""
    return _TOP_COMMA.split(text)


def _split_words(text: str) -> list[str]:
    """Split at whitespace outside brackets and parentheses."""
    return [w for w in _TOP_SPACE.split(text.strip()) if w]


def _modifier(word: str) -> tuple[str, object]:
    m = _MODIFIER.match(word)
    if m:
        value = m.group(2)
        if value.startswith("["):
            return m.group(1), tuple(int(x, 0) for x in value[1:-1].split(","))
        try:
            return m.group(1), int(value, 0)
        except ValueError:
            return m.group(1), value
    return word, True


_NO_OPERANDS = frozenset({"buffer_wbl2", "buffer_inv"})  # cache control: scope bits only


def parse_instruction(text: str, line: int) -> ParsedInstruction:
    """Split one instruction line into mnemonic, operands and modifiers."""
    body = text.split(";", 1)[0].split("//", 1)[0].strip()
    mnemonic, _, rest = body.partition(" ")
    rest = rest.strip()
    operands: list[Operand] = []
    modifiers: dict = {}
    try:
        if mnemonic == "s_waitcnt":
            for word in _split_words(rest.replace("&", " ")):
                m = re.match(r"^(vmcnt|expcnt|lgkmcnt)\((\d+)\)$", word)
                if m:
                    modifiers[m.group(1)] = int(m.group(2))
                else:
                    modifiers["raw"] = int(word, 0)
            return ParsedInstruction(mnemonic, (), modifiers, text, line)
        if mnemonic in _NO_OPERANDS:  # only modifiers: "buffer_wbl2 sc1"
            for word in _split_words(rest):
                name, value = _modifier(word)
                modifiers[name] = value
            return ParsedInstruction(mnemonic, (), modifiers, text, line)
        if mnemonic.startswith("s_setreg") or mnemonic.startswith("s_getreg"):
            parts = [p.strip() for p in _split_top(rest)]
            hw = re.match(r"^hwreg\((\w+)(?:,\s*(\d+),\s*(\d+))?\)$", parts[0 if "set" in
                                                                        mnemonic else 1])
            if not hw:
                raise ValueError(f"hwreg operand in {rest!r}")
            modifiers["hwreg"] = (hw.group(1), int(hw.group(2) or 0), int(hw.group(3) or 32))
            other = parts[1] if "set" in mnemonic else parts[0]
            operands.append(parse_operand(other))
            return ParsedInstruction(mnemonic, tuple(operands), modifiers, text, line)
        pieces = [p.strip() for p in _split_top(rest)] if rest else []
        if pieces:
            words = _split_words(pieces[-1])
            pieces[-1] = words[0] if words else ""
            for word in words[1:]:
                name, value = _modifier(word)
                modifiers[name] = value
            # A trailing bare word like "off" belongs to the operands when it follows a comma.
        for piece in pieces:
            if piece == "":
                continue
            operands.append(parse_operand(piece))
    except ValueError as e:
        raise EmulatorFault("parse", f"cannot read instruction: {e}", instruction=text,
                            line=line) from None
    return ParsedInstruction(mnemonic, tuple(operands), modifiers, text, line)


_AMDHSA = re.compile(r"^\.amdhsa_(\w+)\s+(.+)$")
_LABEL_LINE = re.compile(r"^([.A-Za-z_$][\w.$@]*):(.*)$")


def parse_program(text: str) -> ParsedProgram:
    """Instructions, labels and kernel descriptors of an assembly file."""
    instructions: list[ParsedInstruction] = []
    labels: dict[str, int] = {}
    descriptors: dict[str, dict] = {}
    metadata_text: list[str] = []
    in_kernel, in_metadata, in_text = None, False, True
    target = ""
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split(";", 1)[0].strip() if not in_metadata else raw
        if in_metadata:
            if raw.strip().startswith(".end_amdgpu_metadata"):
                in_metadata = False
            else:
                metadata_text.append(raw)
            continue
        if not line:
            continue
        if in_kernel is not None:
            if line.startswith(".end_amdhsa_kernel"):
                in_kernel = None
                continue
            m = _AMDHSA.match(line)
            if m:
                descriptors[in_kernel][m.group(1)] = int(m.group(2).strip(), 0)
            continue
        if line.startswith(".amdhsa_kernel"):
            in_kernel = line.split()[1]
            descriptors[in_kernel] = {}
            continue
        if line.startswith(".amdgpu_metadata"):
            in_metadata = True
            continue
        if line.startswith(".amdgcn_target"):
            target = line.split(None, 1)[1].strip().strip('"')
            continue
        if line.startswith((".text", ".section", ".data", ".rodata", ".bss")):
            in_text = line.startswith(".text") or ".text" in line.split(",")[0]
            continue
        label = _LABEL_LINE.match(line)
        if label:
            if in_text:
                labels[label.group(1)] = len(instructions)
            line = label.group(2).strip()
            if not line:
                continue
        if line.startswith(".") or not in_text:
            continue
        instructions.append(parse_instruction(raw.strip(), number))
    meta = parse_yaml("\n".join(metadata_text)) if metadata_text else {}
    by_symbol = {}
    for entry in (meta or {}).get("amdhsa.kernels", []) or []:
        name = str(entry.get(".name", str(entry.get(".symbol", "")).removesuffix(".kd")))
        by_symbol[name] = entry
    kernels = {}
    for symbol, directives in descriptors.items():
        if symbol not in labels:
            raise EmulatorFault("parse", f"kernel {symbol!r} has a descriptor but no code")
        kernels[symbol] = KernelDescriptor(symbol, labels[symbol], directives,
                                           by_symbol.get(symbol, {}))
    return ParsedProgram(instructions, labels, kernels, target)
