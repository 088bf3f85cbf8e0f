"""What the launcher launches: a code object (a cubin or an HSACO) and what a launch needs to
know about it. Triton's compile (``triton.triton_compile``) and FlyDSL's build
(``flydsl.launch``) each make one; ``gpu.launch`` carries it in a custom call's attributes."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Compiled:
    """A compiled kernel: the code object and what a launch needs to know about it."""

    code: bytes
    symbol: str
    shared_mem: int
    num_warps: int
    warp_size: int
    param_types: tuple[str, ...]  # the runtime args, then the Triton scratch pointers
    code_hash: str
    isa: str = ""  # the AMDGPU assembly of a ROCm code object (what the CDNA emulator runs)
    param_names: tuple[str, ...] = ()  # each parameter's name, where the toolchain gives them
    # (FlyDSL's kernarg layout): launch bundles name their buffers with them

    @property
    def block(self) -> tuple[int, int, int]:
        return (self.num_warps * self.warp_size, 1, 1)
