"""The Triton launches of one public operation on ROCm, captured from the real lowering and
replayed in the emulator.

:func:`capture` lowers ``fn(*args)`` for the ROCm platform under
``jm.lowering_options(gpu_arch=...)`` (gfx942, or gfx950 with ``gfx950_kernels="triton"``),
recording every launcher call the lowering emits: the compiled kernel (and its ``amdgcn``
text, which the compile keeps), grid, block, dynamic LDS bytes and parameters, and where each
operand comes from (an argument of the operation, in order, or a result of an earlier
launch). :func:`replay` runs those launches on numpy buffers, packing each kernel's arguments
at the offsets of its own metadata, and returns the operation's outputs.
"""

from __future__ import annotations

import contextlib
import dataclasses

import jax
import numpy as np
from harness import Launch, garbage_like

from cdna_emulator import Program, run


@dataclasses.dataclass
class Captured:
    launch: object  # jax_mxfp4._src.gpu.launch.Launch
    amdgcn: str
    sources: list  # per operand: ("arg", i) or ("result", call, j)
    result_avals: list
    aliases: dict


@contextlib.contextmanager
def _rocm_lowering(arch: str):
    """Lower for ROCm ``arch`` with the Triton kernels (on gfx950 too)."""
    import jax_mxfp4 as jm

    with jm.lowering_options(gpu_arch=arch, gfx950_kernels="triton"):
        yield


def capture(monkeypatch, arch: str, fn, *args) -> list[Captured]:
    """The launches ``fn(*args)`` lowers to on ROCm ``arch``, in order."""
    from jax_mxfp4._src.gpu import launch as gpu_launch

    calls: list[Captured] = []
    produced: list[tuple[object, int, int]] = []  # (ir value, call, result index)
    next_arg = [0]
    original = gpu_launch.emit

    def recording_emit(ctx, launch, operands, operand_avals, result_avals, aliases=None):
        results = original(ctx, launch, operands, operand_avals, result_avals, aliases)
        sources = []
        for value in operands:
            hit = next(((c, j) for v, c, j in produced if v == value), None)
            if hit is not None:
                sources.append(("result", *hit))
            else:
                sources.append(("arg", next_arg[0]))
                next_arg[0] += 1
        for j, value in enumerate(results):
            produced.append((value, len(calls), j))
        calls.append(Captured(launch, "", sources, list(result_avals), dict(aliases or {})))
        return results

    with _rocm_lowering(arch):
        monkeypatch.setattr(gpu_launch, "emit", recording_emit)
        checks = [jax.export.DisabledSafetyCheck.custom_call(gpu_launch.TARGET)]
        jax.export.export(jax.jit(fn), platforms=["rocm"], disabled_checks=checks)(*args)
    for call in calls:
        call.amdgcn = call.launch.kernel.isa  # the compile's own amdgcn text
    return calls


def _pack_params(kernel, launch, addresses) -> bytes:
    """Kernarg bytes: parameter i at the offset of the kernel's metadata argument i."""
    from jax_mxfp4._src.gpu import launch as gpu_launch

    args = kernel.args
    if len(args) != len(launch.params):
        raise AssertionError(f"{kernel.symbol}: {len(args)} metadata arguments, "
                             f"{len(launch.params)} launch parameters")
    out = bytearray(kernel.kernarg_size)
    for arg, param in zip(args, launch.params, strict=True):
        if param.kind == gpu_launch.BUFFER:
            value = addresses[param.value].to_bytes(8, "little")
        elif param.kind == gpu_launch.NULL:
            value = bytes(8)
        elif param.kind == gpu_launch.I64:
            value = int(param.value).to_bytes(8, "little", signed=True)
        else:  # I32 (as a signed int) and F32 (as its bits)
            value = (int(param.value) & 0xFFFFFFFF).to_bytes(4, "little")
        out[arg.offset: arg.offset + len(value)] = value[: arg.size]
    return bytes(out)


def replay(calls: list[Captured], args, arch: str, reports=None) -> list[np.ndarray]:
    """Run the captured launches on ``args`` (numpy, in the operation's order); the last
    launch's results (an aliased operand when the result aliases it)."""
    results: list[list[np.ndarray]] = []
    for call in calls:
        launch = Launch()
        operands = []
        for source in call.sources:
            array = np.ascontiguousarray(args[source[1]] if source[0] == "arg" else
                                         results[source[1]][source[2]])
            operands.append(array)
        outs = []
        for j, aval in enumerate(call.result_avals):
            alias = next((i for i, r in call.aliases.items() if r == j), None)
            if alias is not None:
                operands[alias] = operands[alias].copy()
                outs.append(operands[alias])
            else:
                outs.append(garbage_like(aval.shape, np.dtype(aval.dtype)))
        written = {id(a) for a in outs}
        mapped: dict[int, int] = {}
        addresses = []
        for i, array in enumerate(operands + outs):  # buffer indices: operands, then results
            if id(array) not in mapped:
                mapped[id(array)] = launch.buffer(array, writable=id(array) in written,
                                                  name=f"buffer{i}")
            addresses.append(mapped[id(array)])
        kernel = Program.from_asm(call.amdgcn).kernel(call.launch.kernel.symbol)
        compiled = call.launch.kernel
        report = run(kernel, grid=call.launch.grid, block=compiled.block,
                     dynamic_lds=compiled.shared_mem, kernarg=_pack_params(
                         kernel, call.launch, addresses), memory=launch.memory, arch=arch)
        if reports is not None:
            reports.append(report)
        results.append(outs)
    return results[-1]
