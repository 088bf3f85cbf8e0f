"""Programs and kernels: parse once, compile per architecture, run."""

from __future__ import annotations

import hashlib
import threading

from .asm import KernelDescriptor, parse_program
from .compile import compile_program
from .errors import EmulatorFault
from .launch import ALL_CHECKS, run_kernel

_CACHE: dict[str, Program] = {}
_CACHE_LOCK = threading.Lock()
_CACHE_SIZE = 64


class Kernel:
    """One kernel of a :class:`Program`: its descriptor (``.amdhsa_*`` directives joined with
    the metadata note) and its code, compiled once per architecture."""

    def __init__(self, program: Program, descriptor: KernelDescriptor):
        self.program = program
        self.descriptor = descriptor
        self._code: dict[str, list] = {}
        self._lock = threading.Lock()

    def __getattr__(self, name):
        return getattr(self.descriptor, name)

    def code(self, arch: str):
        with self._lock:
            if arch not in self._code:
                self._code[arch] = compile_program(self.program.parsed, arch, self.descriptor)
            return self._code[arch]

    def __repr__(self) -> str:
        d = self.descriptor
        return (f"Kernel({d.symbol!r}, vgprs={d.next_free_vgpr}, accum_offset="
                f"{d.accum_offset}, lds={d.group_segment_size}, kernarg={d.kernarg_size})")


class Program:
    """Every kernel of one assembly text. Use :meth:`from_asm` (cached by the text's hash)."""

    def __init__(self, text: str):
        self.text = text
        self.parsed = parse_program(text)
        self.kernels = {name: Kernel(self, d) for name, d in self.parsed.kernels.items()}

    @classmethod
    def from_asm(cls, text: str) -> Program:
        key = hashlib.sha256(text.encode()).hexdigest()
        with _CACHE_LOCK:
            program = _CACHE.get(key)
        if program is None:
            program = cls(text)
            with _CACHE_LOCK:
                if len(_CACHE) >= _CACHE_SIZE:
                    _CACHE.pop(next(iter(_CACHE)))
                _CACHE[key] = program
        return program

    @property
    def arch(self) -> str:
        """The processor the text was assembled for (``gfx950`` of ``.amdgcn_target
        "amdgcn-amd-amdhsa--gfx950"``; features after a ``:`` dropped)."""
        target = self.parsed.target
        if not target:
            raise EmulatorFault("launch", "the assembly names no .amdgcn_target")
        return target.rsplit("-", 1)[-1].split(":", 1)[0]

    def kernel(self, symbol: str) -> Kernel:
        symbol = symbol.removesuffix(".kd")
        if symbol not in self.kernels:
            raise EmulatorFault("launch", f"no kernel {symbol!r} in the program (has "
                                f"{sorted(self.kernels)})")
        return self.kernels[symbol]


_RUN_LOCK = threading.Lock()


def run(kernel: Kernel, *, grid, block, dynamic_lds: int = 0, kernarg=b"", memory=None,
        arch: str = "gfx950", max_steps: int = 5_000_000, checks=ALL_CHECKS, workgroups=None,
        trace: bool = False):
    """Execute ``kernel`` for one launch and return its :class:`RunReport`.

    ``grid``: workgroups per dimension; ``block``: work-items per workgroup; ``kernarg``: the
    kernel-argument bytes (placed by the emulator in a read-only region); ``memory``: the
    :class:`Memory` holding every buffer the kernel may touch; ``arch``: "gfx950" or "gfx942";
    ``max_steps``: instruction issues before a ``step-budget`` fault; ``checks``: subset of
    {"undefined", "waitcnt", "lds-race"} (out-of-bounds checks are always on);
    ``workgroups``: None (every workgroup), an int n (n workgroups spread over the grid: a
    sample for profiling large launches; the other workgroups' outputs are not written) or a
    ``[k, 3]`` array of workgroup ids; ``trace``: record each wave's path and the cache
    lines of its memory instructions (``report.trace``, what the timing model runs on).
    """
    code = kernel.code(arch)
    with _RUN_LOCK:
        return run_kernel(kernel.descriptor, code, grid=grid, block=block,
                          dynamic_lds=dynamic_lds, kernarg=kernarg, memory=memory, arch=arch,
                          max_steps=max_steps, checks=checks, workgroups=workgroups,
                          trace=trace)
