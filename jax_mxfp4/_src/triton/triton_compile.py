"""Triton's compile of one kernel specialization, in this process: what a Triton kernel is
compiled from (:class:`KernelSpec`), for (:class:`Target`) and into (:class:`Compiled`).

``compiler`` adds the caches and the per-architecture worker processes around
:func:`triton_compile`; ``compile_worker``'s child process runs it too, so it lives below both.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from typing import Any

from jax_mxfp4._src.gpu.compiled import Compiled

TRITON_EXTRA_PARAMS = 2
"""Triton 3.x kernels take a global-scratch and a profile-scratch pointer after the user's."""


@dataclasses.dataclass(frozen=True)
class Target:
    """A GPU architecture: ``backend`` "cuda" (``arch`` e.g. 90) or "hip" (e.g. "gfx942")."""

    backend: str
    arch: int | str
    warp_size: int

    @property
    def platform(self) -> str:
        return "CUDA" if self.backend == "cuda" else "ROCM"


SM90 = Target("cuda", 90, 32)
GFX942 = Target("hip", "gfx942", 64)


@dataclasses.dataclass(frozen=True)
class KernelSpec:
    """One specialization of a Triton kernel.

    ``signature``: ``(name, type)`` for every argument of the kernel in order; a type is a
    Triton type string (``"*u8"``, ``"*bf16"``, ``"i32"``...) or ``"constexpr"``.
    ``constants``: the value of every constexpr argument.
    """

    fn: Any  # triton.runtime.jit.JITFunction
    signature: tuple[tuple[str, str], ...]
    constants: tuple[tuple[str, Any], ...]
    num_warps: int = 4
    num_stages: int = 2
    # registers per thread at most (ptxas's ``maxnreg``; Triton's HIP backend has no such
    # option and drops it); None: the compiler's choice
    max_registers: int | None = None

    def runtime_args(self) -> list[tuple[str, str]]:
        return [(n, t) for n, t in self.signature if t != "constexpr"]


def _divisibility_attrs(spec: KernelSpec) -> dict:
    """Pointers are 16-byte aligned (XLA's buffers are), which lets Triton vectorize."""
    names = [n for n, _ in spec.signature]
    return {
        (names.index(n),): [["tt.divisibility", 16]]
        for n, t in spec.signature if t.startswith("*")
    }


def _is_gluon(fn) -> bool:
    """Whether ``fn`` is a ``@gluon.jit`` kernel (Triton with explicit layouts)."""
    try:
        from triton.experimental.gluon._runtime import GluonJITFunction
    except ImportError:
        return False
    return isinstance(fn, GluonJITFunction)


def triton_compile(spec: KernelSpec, target: Target) -> Compiled:
    """Triton's compile of ``spec`` for ``target``, in this process."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    constants = dict(spec.constants)
    source_type = ASTSource
    if _is_gluon(spec.fn):
        from triton.experimental.gluon._runtime import GluonASTSource as source_type
    source = source_type(
        spec.fn,
        signature=dict(spec.signature),
        constexprs=constants,
        attrs=_divisibility_attrs(spec),
    )
    options = {"num_warps": spec.num_warps, "num_stages": spec.num_stages}
    if spec.max_registers is not None:
        options["maxnreg"] = spec.max_registers
    kernel = triton.compile(
        source, target=GPUTarget(target.backend, target.arch, target.warp_size), options=options
    )
    md = kernel.metadata
    for field in ("global_scratch_size", "profile_scratch_size"):
        if getattr(md, field, 0):
            raise RuntimeError(f"{spec.fn.__name__}: {field} = {getattr(md, field)} is unsupported")
    code = kernel.asm["cubin" if target.backend == "cuda" else "hsaco"]
    runtime = [t for _, t in spec.runtime_args()]
    params = (*runtime, *(["*i8"] * TRITON_EXTRA_PARAMS))
    counted = count_params(kernel.asm, target)
    if counted != len(params):
        raise RuntimeError(
            f"{spec.fn.__name__}: the compiled kernel takes {counted} parameters, the launcher "
            f"would pass {len(params)}"
        )
    return Compiled(
        code=bytes(code), symbol=md.name, shared_mem=int(md.shared), num_warps=md.num_warps,
        warp_size=target.warp_size, param_types=params,
        code_hash=hashlib.sha256(bytes(code)).hexdigest(),
        isa=kernel.asm.get("amdgcn", "") if target.backend == "hip" else "",
    )


def count_params(asm: dict, target: Target) -> int:
    """Parameters of the compiled entry point, read from its PTX or its AMDGPU metadata."""
    if target.backend == "cuda":
        ptx = asm["ptx"]
        start = ptx.index(".entry")
        header = ptx[start : ptx.index(")", start)]
        return len(re.findall(r"\.param\s", header))
    text = asm["amdgcn"]
    args = text[text.index(".args:") : text.index(".group_segment_fixed_size")]
    return len(re.findall(r"\.offset:", args))
