"""The generic GPU launcher's Python side: registration with XLA and the custom call.

One XLA FFI target, ``jax_mxfp4_gpu_launch`` (C++ in ``ffi/gpu``), registered for the
platforms "CUDA" and "ROCM" with the command-buffer-compatible trait, launches any code object
that its attributes carry (layout in ``ffi/gpu/launch.h``). :func:`emit` writes one such call
into the lowered module from a :class:`Launch`: the compiled kernel, its grid, and what each
kernel parameter is (an operand or result buffer, a scalar, or a null scratch pointer). The
code object travels base64-encoded and zlib-compressed inside the attributes, so
``jax.export`` and serialized executables carry the kernel.
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import hashlib
import struct
import zlib
from collections.abc import Sequence

import jax
import numpy as np

from jax_mxfp4._src.gpu.compiled import Compiled

TARGET = "jax_mxfp4_gpu_launch"
PLATFORMS = ("CUDA", "ROCM")

BUFFER, I32, I64, F32, NULL = 0, 1, 2, 3, 4
"""Kinds of kernel parameters (``param_kinds``)."""


@dataclasses.dataclass(frozen=True)
class Param:
    kind: int
    value: int


def buffer(index: int) -> Param:
    """The address of buffer ``index`` of (operands..., results...)."""
    return Param(BUFFER, int(index))


def i32(value: int) -> Param:
    return Param(I32, int(np.int32(value)))


def i64(value: int) -> Param:
    return Param(I64, int(value))


def f32(value: float) -> Param:
    return Param(F32, struct.unpack("<I", struct.pack("<f", float(value)))[0])


def null() -> Param:
    return Param(NULL, 0)


@dataclasses.dataclass(frozen=True)
class Launch:
    """One kernel launch: a compiled kernel, its grid, and its parameters in order."""

    kernel: Compiled
    grid: tuple[int, int, int]
    params: tuple[Param, ...]

    def attributes(self) -> dict:
        k = self.kernel
        if len(self.params) != len(k.param_types):
            raise ValueError(
                f"{k.symbol}: {len(self.params)} parameters for a kernel that takes "
                f"{len(k.param_types)}"
            )
        for i, (p, t) in enumerate(zip(self.params, k.param_types, strict=True)):
            expected = {BUFFER: "*", NULL: "*", I32: "i32", I64: "i64", F32: "fp32"}[p.kind]
            if not (t.startswith("*") if expected == "*" else t == expected):
                raise ValueError(f"{k.symbol}: parameter {i} is {t}, the launch passes kind "
                                 f"{p.kind}")
        return {
            "code": _encoded(k.code),
            "code_size": np.int64(len(k.code)),
            "code_hash": k.code_hash,
            "symbol": k.symbol,
            "grid": np.asarray(self.grid, np.int64),
            "block": np.asarray(k.block, np.int64),
            "shared_mem": np.int64(k.shared_mem),
            "param_kinds": np.asarray([p.kind for p in self.params], np.int32),
            "param_values": np.asarray([p.value for p in self.params], np.int64),
        }


@functools.lru_cache(maxsize=512)
def _encoded(code: bytes) -> str:
    return base64.b64encode(zlib.compress(code, 6)).decode("ascii")


def with_scratch(params: Sequence[Param]) -> tuple[Param, ...]:
    """The user parameters followed by Triton's two (unused, null) scratch pointers."""
    return (*params, null(), null())


@functools.cache
def _load_launcher() -> tuple[frozenset[str], str | None]:
    """(platforms registered, problem): the problem names the file, the error and the fix."""
    try:
        from jax_mxfp4 import _ffi_gpu
    except ImportError as error:
        return frozenset(), (
            f"the GPU launcher (jax_mxfp4/_ffi_gpu*.so) could not be loaded: {error}; "
            f"reinstall jax_mxfp4 so that its C++ extension is built"
        )
    from jaxlib.xla_client import CustomCallTargetTraits

    done = set()
    for platform, stages in _ffi_gpu.registrations().items():
        jax.ffi.register_ffi_target(
            TARGET, stages, platform=platform, api_version=1,
            traits=CustomCallTargetTraits.COMMAND_BUFFER_COMPATIBLE,
        )
        done.add(platform)
    return frozenset(done), None


def register_gpu_targets() -> frozenset[str]:
    """Register the launcher for the GPU platforms once per process; the platform names
    registered (empty when the extension cannot be loaded). Registering opens no GPU
    library."""
    return _load_launcher()[0]


_emulator: list = []  # the installed emulator callable (at most one)


def register_emulator(emulate) -> None:
    """Register the launcher's CPU form for platform "cpu" (once per process) and hand its
    launches to ``emulate(image, symbol, grid, block, shared, params, buffers)``
    (``ffi/gpu/emulated.h`` says what each holds), replacing any emulator installed before."""
    from jax_mxfp4 import _ffi_gpu

    if not _emulator:
        jax.ffi.register_ffi_target(TARGET, _ffi_gpu.emulated_handler(), platform="cpu")
    if _emulator != [emulate]:
        _ffi_gpu.set_emulator(emulate)
        _emulator[:] = [emulate]


def problem(target) -> str | None:
    """Why the launcher cannot carry ``target``'s kernels (a ``core.targets.Target``), or
    ``None``."""
    why = _load_launcher()[1]
    if why is not None:
        return why
    if target.emulated:
        return None if _emulator else "no CDNA emulator is registered"
    if target.platform.upper() not in register_gpu_targets():
        return f"the GPU launcher is not registered for platform {target.platform}"
    return None


def cache_stats() -> dict[str, int]:
    """Counters of the launcher's module cache (modules loaded, instantiations...)."""
    from jax_mxfp4 import _ffi_gpu

    return _ffi_gpu.cache_stats()


_ASSEMBLY: dict[str, str] = {}


def assembly_of(code: bytes) -> str | None:
    """The assembly text of a ROCm code object this process lowered (what the CDNA emulator
    executes), or ``None``."""
    return _ASSEMBLY.get(hashlib.sha256(code).hexdigest())


def _record_assembly(launch: Launch) -> None:
    """Keep a ROCm launch's assembly for the CDNA emulator (:func:`assembly_of`)."""
    if launch.kernel.isa:
        _ASSEMBLY.setdefault(hashlib.sha256(launch.kernel.code).hexdigest(), launch.kernel.isa)


_BUFFERS: dict[tuple, tuple] = {}


def _launch_key(code: bytes, symbol: str, grid, kinds_and_values) -> tuple:
    """What identifies a launch both at lowering (a :class:`Param` value) and when the
    launcher runs it (a packed 8-byte slot): the code, symbol, grid and each parameter's
    kind, with the scalars' bits (a buffer's index and address differ, so they are left out)."""
    bits = {I32: 0xFFFFFFFF, F32: 0xFFFFFFFF, I64: 0xFFFFFFFFFFFFFFFF}
    params = tuple((kind, value & bits[kind] if kind in bits else None)
                   for kind, value in kinds_and_values)
    return hashlib.sha256(code).hexdigest(), symbol, tuple(int(g) for g in grid), params


def _record_buffers(launch: Launch, operand_avals, result_avals) -> None:
    """Keep a ROCm launch's buffer names, shapes and dtypes (:func:`buffers_of`)."""
    if not launch.kernel.isa:
        return
    avals = (*operand_avals, *result_avals)
    names = [""] * len(avals)
    # Triton's code objects carry no names (param_names is empty): no strict zip
    for param, name in zip(launch.params, launch.kernel.param_names, strict=False):
        if param.kind == BUFFER and not names[param.value]:
            names[param.value] = name
    key = _launch_key(launch.kernel.code, launch.kernel.symbol, launch.grid,
                      [(p.kind, p.value) for p in launch.params])
    _BUFFERS[key] = tuple((name, tuple(a.shape), np.dtype(a.dtype))
                          for name, a in zip(names, avals, strict=True))


def buffers_of(code: bytes, symbol: str, grid, params) -> tuple | None:
    """``(name, shape, dtype)`` of each buffer (operands, then results) of a ROCm launch this
    process lowered, found from what the launcher hands the emulator (``params``: its
    ``(kind, slot)`` pairs); the name is the kernel parameter that receives the buffer (``""``
    where the toolchain names none). ``None`` when no lowering matches. The launcher itself
    passes each buffer's address and size only: a launch bundle reads better with these."""
    return _BUFFERS.get(_launch_key(code, symbol, grid, params))


def call(launch: Launch, operands: Sequence, result_avals: Sequence) -> list:
    """``launch`` as one launcher custom call on ``operands`` outside any lowering rule
    (``jax.ffi.ffi_call``, under ``jax.jit`` or eagerly): how a probe kernel that belongs to no
    operation runs (``bench/latency_floor.py``). Returns the results, shaped as
    ``result_avals``."""
    register_gpu_targets()
    _record_assembly(launch)
    shapes = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in result_avals]
    custom_call = jax.ffi.ffi_call(TARGET, shapes)
    return list(custom_call(*operands, **launch.attributes(), aliases=np.zeros(0, np.int64)))


def emit(ctx, launch: Launch, operands: Sequence, operand_avals: Sequence,
         result_avals: Sequence, aliases: dict[int, int] | None = None) -> list:
    """Emit one launcher custom call inside a lowering rule; returns its result values.

    ``operand_avals`` / ``result_avals`` describe this call (not necessarily the rule's own
    avals: a multi-kernel lowering passes its intermediates here).
    """
    register_gpu_targets()
    _record_assembly(launch)
    _record_buffers(launch, operand_avals, result_avals)
    sub = ctx.replace(avals_in=list(operand_avals), avals_out=list(result_avals))
    rule = jax.ffi.ffi_lowering(TARGET, operand_output_aliases=aliases)
    pairs = [i for pair in sorted((aliases or {}).items()) for i in pair]
    out = rule(sub, *operands, **launch.attributes(), aliases=np.asarray(pairs, np.int64))
    return list(out)


__all__ = [
    "PLATFORMS",
    "TARGET",
    "Launch",
    "Param",
    "assembly_of",
    "buffer",
    "buffers_of",
    "cache_stats",
    "call",
    "emit",
    "f32",
    "i32",
    "i64",
    "null",
    "problem",
    "register_emulator",
    "register_gpu_targets",
    "with_scratch",
]
