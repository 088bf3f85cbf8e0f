"""The emulated ROCm backends: the gfx950 / gfx942 lowering, executed in the CDNA emulator.

``jm.set_backend("emulated-gfx950")`` (or ``backend_scope``, or ``JAX_MXFP4_BACKEND``) makes
every operation on the CPU lower exactly as it would on an MI355X: the FlyDSL code objects
where they cover the call, the Triton gfx950 code objects where they do not, through the same
lowering rules, grids and parameters. ``"emulated-gfx942"`` does the same for an MI300X (Triton
code objects). The custom call is the GPU launcher's, registered for the CPU in its CPU form
(``ffi/gpu/emulated.h``): it decodes the same attributes and packs the parameters with the same
code, then hands the launch to :func:`emulate`, which does what the HIP runtime would (placing
each parameter in the kernarg segment at its offset from the code object's metadata, filling
the hidden arguments) and runs the kernel's assembly in ``cdna_emulator`` over
the host buffers XLA gave the call. An emulator fault (an access outside the buffers, a value
used before its wait, an LDS race...) fails the call with the emulator's report.

Registering the backends is all this module does at import; the emulator is imported when a
call is first lowered for one of them.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import functools
from pathlib import Path

import numpy as np

from jax_mxfp4._src.core.targets import CPU, emulated
from jax_mxfp4._src.dispatch.backend import Backend, register_backend
from jax_mxfp4._src.flydsl.metadata import kernel_info
from jax_mxfp4._src.gpu import launch

EMULATED = {"emulated-gfx950": ("gfx950", 256), "emulated-gfx942": ("gfx942", 304)}
"""Backend name -> (arch, compute units of the GPU it stands for: MI355X, MI300X)."""


def install() -> None:
    """Register the launcher's CPU form with :func:`emulate` behind it."""
    launch.register_emulator(emulate)


def _target(arch: str, units: int):
    def target(platform: str, ctx, config):
        if platform != CPU:
            raise NotImplementedError(
                f"the emulated backends lower CPU computations, not {platform} ones")
        install()
        return emulated(arch, config.gpu_units or units)

    return target


for _name, (_arch, _units) in EMULATED.items():
    register_backend(Backend(
        _name, f"the ROCm {_arch} lowering, run in the CDNA emulator on the CPU",
        _target(_arch, _units), static_shapes=True))


# --- the emulated launch ---------------------------------------------------------------------

_HIDDEN_GRID = {"hidden_block_count_x": 0, "hidden_block_count_y": 1, "hidden_block_count_z": 2}
_HIDDEN_BLOCK = {"hidden_group_size_x": 0, "hidden_group_size_y": 1, "hidden_group_size_z": 2}


def kernarg_bytes(args, size: int, grid, block, params) -> bytes:
    """The kernarg segment a HIP runtime would build from the code object's metadata
    (``args``: ``(offset, size, value_kind)`` per argument, ``size``: the segment's):
    explicit argument ``i`` is the low bytes of the launcher's packed parameter ``i`` at its
    offset; the hidden arguments the kernel declares get the launch's grid (in workgroups),
    block and dimension count, and zero otherwise (no global offset, no remainder, no host
    services)."""
    explicit = [a for a in args if not a[2].startswith("hidden_")]
    if len(explicit) != len(params):
        raise ValueError(f"the launcher passes {len(params)} parameters to a kernel that takes "
                         f"{len(explicit)} explicit arguments")
    segment = bytearray(size)
    for (offset, width, _), (_, slot) in zip(explicit, params, strict=True):
        segment[offset:offset + width] = int(slot).to_bytes(8, "little")[:width]
    for offset, width, kind in args:
        if kind in _HIDDEN_GRID:
            value = grid[_HIDDEN_GRID[kind]]
        elif kind in _HIDDEN_BLOCK:
            value = block[_HIDDEN_BLOCK[kind]]
        elif kind == "hidden_grid_dims":
            value = 3 if grid[2] > 1 or block[2] > 1 else (2 if grid[1] > 1 or block[1] > 1 else 1)
        else:
            continue
        segment[offset:offset + width] = int(value).to_bytes(width, "little")
    return bytes(segment)


def _host_view(address: int, size: int) -> np.ndarray:
    """The ``size`` bytes at host ``address`` (an XLA CPU buffer) as a writable uint8 array."""
    return np.ctypeslib.as_array((ctypes.c_uint8 * size).from_address(address))


@functools.lru_cache(maxsize=64)
def _program(asm: str):
    import cdna_emulator as emulator

    return emulator.Program.from_asm(asm)


@dataclasses.dataclass
class _Profiling:
    workgroups: int | None
    profiles: list


_PROFILING: list[_Profiling] = []  # the innermost profiled() block last (XLA may run a
# custom call on a thread of its own, so this is process-wide, not per thread)


@contextlib.contextmanager
def profiled(workgroups: int | None = None):
    """Profile every emulated launch inside the block: yields a list that gets
    one ``cdna_emulator.Profile`` (instructions per wave by class, bytes, MI355X
    estimate) per launch. ``workgroups``: run only about that many workgroups of each grid,
    the timing model's sample (``cdna_emulator.timing.sample_workgroups``; the totals are
    scaled to the grid); **the other workgroups' outputs are then never written**, so results
    computed inside are for profiling only. None runs them all."""
    state = _Profiling(workgroups, [])
    _PROFILING.append(state)
    try:
        yield state.profiles
    finally:
        _PROFILING.remove(state)


@dataclasses.dataclass
class _Dumping:
    directory: Path
    what: str
    written: list


_DUMPING: list[_Dumping] = []  # the innermost dumped() block last (process-wide, as above)


@contextlib.contextmanager
def dumped(directory, what: str = ""):
    """Write every emulated launch inside the block as a launch bundle
    (``cdna_emulator.bundle``: the code object, its assembly and ``launch.json``) into
    ``directory/<nn>_<symbol>/``, before it runs; yields the list of folders written. Each
    bundle holds the launch's grid, block, LDS bytes, its kernel-argument segment as the
    runtime built it (explicit arguments typed, hidden ones and padding as ``u32`` words) and
    its buffers (operands, then results; an aliased pair is one buffer, named after the
    result): their values where small (every integer metadata buffer up to 4 MiB, so the
    bundle runs the same control flow), else a fill that each buffer's ``contents`` names.
    ``what`` is prefixed to each bundle's description (the benchmark cell, say)."""
    state = _Dumping(Path(directory), what, [])
    _DUMPING.append(state)
    try:
        yield state.written
    finally:
        _DUMPING.remove(state)


def kernarg_list(args, segment: bytes, params, names: dict[int, str]) -> list:
    """A kernarg segment as a launch bundle's ``[type, value]`` list, which packs back to the
    same bytes: each explicit argument (``args``: ``(offset, size, value_kind)``, ``params``:
    the launcher's ``(kind, slot)``) as its type, a buffer pointer as ``["ptr", name]``
    (``names``: buffer address -> bundle name), every other 4 bytes (hidden arguments, the
    padding before an 8-byte argument, a pointer to no mapped buffer) as a ``u32`` word."""
    explicit = [a for a in args if not a[2].startswith("hidden_")]
    at = {offset: (width, kind, slot)
          for (offset, width, _), (kind, slot) in zip(explicit, params, strict=True)}
    padded = segment + bytes(-len(segment) % 4)
    entries, pos = [], 0
    while pos < len(padded):
        width, kind, slot = at.get(pos, (4, None, None))
        raw = padded[pos:pos + width]
        if width == 8 and kind == launch.BUFFER and slot in names:
            entries.append(["ptr", names[slot]])
        elif width == 8 and kind == launch.I64:
            entries.append(["i64", int.from_bytes(raw, "little", signed=True)])
        elif width == 4 and kind == launch.I32:
            entries.append(["i32", int.from_bytes(raw, "little", signed=True)])
        elif width == 4 and kind == launch.F32 and np.isfinite(np.frombuffer(raw, "<f4")[0]):
            entries.append(["f32", float(np.frombuffer(raw, "<f4")[0])])
        else:
            width = 4
            entries.append(["u32", int.from_bytes(padded[pos:pos + 4], "little")])
        pos += width
    return entries


def _typed(view: np.ndarray, declared, index: int) -> tuple[str, np.ndarray]:
    """(name, array) of buffer ``index``: the kernel parameter's name and the array the
    lowering declared (``declared``: ``gpu.launch.buffers_of``) where they are known and fit
    its size, else no name and int32 words (bytes where the size is no multiple of 4)."""
    if declared is not None and len(declared) > index:
        name, shape, dtype = declared[index]
        if int(np.prod(shape, dtype=np.int64)) * dtype.itemsize == view.size:
            return name, view.view(dtype).reshape(shape)
    return "", view.view(np.int32) if view.size % 4 == 0 else view


def _bundle_buffers(buffers, declared) -> tuple[list[dict], dict[int, str]]:
    """(``launch.json`` buffer entries, bundle name at each address) of a launch's
    ``(address, size, result)`` buffers: one entry per distinct mapped address, named after
    the kernel parameter that receives it (else ``operand<i>`` / ``result<j>``)."""
    from cdna_emulator.bundle import buffer_spec

    operands = sum(not result for _, _, result in buffers)
    outputs = {address for address, size, result in buffers if result and size}
    inputs = {address for address, size, result in buffers if not result and size}
    specs, names = [], {}
    for index, (address, size, result) in enumerate(buffers):
        if not size or address in names or (not result and address in outputs):
            continue  # empty, seen, or an operand its aliased result stands for
        name, array = _typed(_host_view(address, size), declared, index)
        if not name or name in names.values():
            name = f"result{index - operands}" if result else f"operand{index}"
        names[address] = name
        specs.append(buffer_spec(name, array, writable=bool(result), seed=len(specs),
                                 output_only=bool(result) and address not in inputs))
    return specs, names


def _dump(state: _Dumping, image: bytes, asm: str, kernel, grid, block, shared: int,
          params, buffers, info, kernarg: bytes) -> None:
    """Write one launch as a bundle (see :func:`dumped`), checking that its kernel-argument
    list packs back to the segment the launch runs with."""
    from cdna_emulator.bundle import pack_kernarg, write_bundle

    declared = launch.buffers_of(image, kernel.symbol, grid, params)
    specs, names = _bundle_buffers(buffers, declared)
    entries = kernarg_list(info.args, kernarg, params, names)
    if pack_kernarg(entries, {n: a for a, n in names.items()}) != kernarg + bytes(
            -len(kernarg) % 4):
        raise RuntimeError(f"{kernel.symbol}: the bundle's kernel arguments do not pack back "
                           "to the launch's kernarg segment")
    number = len(state.written) + 1
    what = (f"{state.what}: " if state.what else "") + (
        f"jax_mxfp4 emulated launch {number}, {kernel.symbol}")
    if _PROFILING and _PROFILING[-1].workgroups is not None:
        what += (f" (dumped under a profile that runs {_PROFILING[-1].workgroups} workgroups "
                 "a launch: what earlier launches wrote into its inputs is incomplete)")
    folder = write_bundle(state.directory / f"{number:02d}_{kernel.symbol}", what=what,
                          asm=asm, code_object=image, symbol=kernel.symbol,
                          arch=kernel.program.arch, grid=grid, block=block, dynamic_lds=shared,
                          buffers=specs, kernarg=entries)
    state.written.append(folder)


def emulate(image: bytes, symbol: str, grid, block, shared: int, params, buffers) -> None:
    """Run one launch of the launcher's CPU form (see the module docstring); raises with the
    emulator's report on a fault."""
    import cdna_emulator as emulator

    asm = launch.assembly_of(image)
    if asm is None:
        raise RuntimeError(
            f"no assembly text for kernel {symbol!r}: the emulator runs the code objects this "
            f"process lowered (a deserialized export carries only their binary)")
    kernel = _program(asm).kernel(symbol)
    info = kernel_info(image, symbol)  # what a HIP runtime reads: the code object's metadata
    memory = emulator.Memory()
    results = {address for address, size, result in buffers if result and size}
    for index, (address, size, result) in enumerate(buffers):
        if size and (result or address not in results):
            memory.map(address, _host_view(address, size), writable=bool(result),
                       name=f"buffer {index}")
    kernarg = kernarg_bytes(info.args, info.kernarg_size, grid, block, params)
    if _DUMPING:
        _dump(_DUMPING[-1], image, asm, kernel, grid, block, shared, params, buffers, info,
              kernarg)
    state = _PROFILING[-1] if _PROFILING else None
    sample = None
    if state is not None and state.workgroups is not None:
        from cdna_emulator.timing import sample_workgroups

        sample = sample_workgroups(grid, state.workgroups)
    report = emulator.run(kernel, grid=tuple(grid), block=tuple(block), dynamic_lds=shared,
                          kernarg=kernarg, memory=memory, arch=kernel.program.arch,
                          workgroups=sample, trace=state is not None)
    if state is not None:
        state.profiles.append(emulator.profile(report))


__all__ = ["EMULATED", "dumped", "emulate", "install", "kernarg_bytes", "kernarg_list",
           "profiled"]
