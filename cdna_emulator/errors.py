"""The one exception the emulator raises: :class:`EmulatorFault`.

A fault names what went wrong (``kind``), where (instruction text, source line, program counter)
and for whom (wave, workgroup, lane, address), so a kernel bug can be traced to one instruction
of one lane. Parse-time faults (an opcode or modifier the emulator does not model) carry the
instruction and line only.
"""

from __future__ import annotations

FAULT_KINDS = (
    "parse",  # the assembly text or a directive could not be read
    "unsupported",  # an opcode, operand form or modifier the emulator does not model
    "launch",  # the launch parameters do not fit the kernel (block, LDS, kernarg size)
    "memory",  # a global/scalar/buffer access outside every mapped buffer, or a write to a
    # read-only one
    "lds-range",  # an LDS access outside the workgroup's allocation
    "scratch-range",  # a private (scratch) access outside the lane's private segment
    "undefined",  # a never-written register value reached an address, a store, a branch or
    # EXEC decision, or an MFMA
    "waitcnt",  # a loaded value was used (or its register overwritten) before the s_waitcnt
    # that retires the load
    "lds-race",  # two waves of a workgroup touched one LDS byte (one of them writing) with no
    # s_barrier between
    "barrier",  # the waves of a workgroup can never all meet at s_barrier
    "step-budget",  # the kernel did not reach s_endpgm within max_steps
)


class EmulatorFault(Exception):
    """A fault of the emulated kernel (or of its launch), with where it happened.

    Attributes: ``kind`` (one of :data:`FAULT_KINDS`), ``message``, ``instruction`` (the
    assembly text), ``line`` (1-based line in the assembly), ``pc`` (instruction index),
    ``wave`` (global wave index in the launch), ``workgroup`` (``(x, y, z)``), ``lane``,
    ``address`` (byte address: global, LDS or private, per ``kind``).
    """

    def __init__(self, kind: str, message: str, *, instruction: str | None = None,
                 line: int | None = None, pc: int | None = None, wave: int | None = None,
                 workgroup: tuple[int, int, int] | None = None, lane: int | None = None,
                 address: int | None = None):
        if kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault kind {kind!r}")
        self.kind = kind
        self.message = message
        self.instruction = instruction
        self.line = line
        self.pc = pc
        self.wave = wave
        self.workgroup = workgroup
        self.lane = lane
        self.address = address
        super().__init__(self._text())

    def _text(self) -> str:
        where = []
        if self.instruction is not None:
            where.append(f"at line {self.line}: {self.instruction.strip()!r}")
        for name in ("pc", "wave", "workgroup", "lane"):
            value = getattr(self, name)
            if value is not None:
                where.append(f"{name} {value}")
        if self.address is not None:
            where.append(f"address {self.address:#x}")
        suffix = f" ({'; '.join(where)})" if where else ""
        return f"[{self.kind}] {self.message}{suffix}"

    def located(self, **where) -> EmulatorFault:
        """A copy with the unset location fields filled from ``where``."""
        fields = {k: getattr(self, k) for k in ("instruction", "line", "pc", "wave",
                                                 "workgroup", "lane", "address")}
        for k, v in where.items():
            if fields.get(k) is None:
                fields[k] = v
        return EmulatorFault(self.kind, self.message, **fields)
