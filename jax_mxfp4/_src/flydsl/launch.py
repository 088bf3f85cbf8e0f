"""What every gfx950 (FlyDSL) lowering shares: when the kernels apply, their code objects, and
a launch through the generic GPU launcher derived from the kernel's argument list.

The lowering functions themselves (``available`` / ``covers`` / ``lower`` / ``kernel_name``,
see :class:`jax_mxfp4._src.dispatch.lowering.KernelModule`) live in each operation's
``flydsl`` module, next to its builder.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence

import jax.numpy as jnp
import numpy as np

from jax_mxfp4._src.core.reasons import FLYDSL_REQUIREMENT, LoadFailure
from jax_mxfp4._src.flydsl.abi import Specialization
from jax_mxfp4._src.flydsl.code_object import ARCHES, code_object
from jax_mxfp4._src.flydsl.flydsl_process import flydsl_installed
from jax_mxfp4._src.gpu import launch as launcher
from jax_mxfp4._src.gpu.compiled import Compiled

WAVE = 64
POWERS = (1, 2, 4, 8, 16)
"""Head counts (index heads H, q heads per kv head G) the kernels are built for."""


def available(target, config) -> str | None:
    """Why the FlyDSL kernels cannot serve ``target`` at all (another arch, opted out, no
    launcher), or ``None``."""
    if target.arch not in ARCHES:
        return f"FlyDSL kernels are built for {'/'.join(ARCHES)}, not {target.arch}"
    if config.gfx950_kernels != "flydsl":
        return "jax_mxfp4_gfx950_kernels / JAX_MXFP4_GFX950_KERNELS asks for the Triton kernels"
    problem = launcher.problem(target)
    return None if problem is None else LoadFailure(problem)


def code_object_problem(spec: Specialization, arch: str) -> str | None:
    """Why the code object of ``spec`` cannot be had here (not prebuilt, not cached, and no
    FlyDSL installed to compile it), or ``None``. FlyDSL compiles in a process of its own with
    a stand-in for torch (``flydsl_process``), so being installed is enough; an in-process
    import (which needs torch) is not asked for."""
    if flydsl_installed():
        return None
    try:
        code_object(spec, arch=arch, compile=False)
    except FileNotFoundError:
        return LoadFailure(f"no prebuilt or cached {spec.symbol} and FlyDSL is not installed; "
                           f"{FLYDSL_REQUIREMENT}")
    return None


def compiled(co) -> Compiled:
    """A FlyDSL code object as the launcher's :class:`Compiled` (static LDS only: 0 dynamic
    shared bytes; no Triton scratch parameters)."""
    block = co.block[0] * co.block[1] * co.block[2]
    digest = hashlib.sha256(co.hsaco).hexdigest()[:16]
    param_types = tuple({"pointer": "*u8", "i32": "i32", "f32": "fp32", "i64": "i64"}[s.kind]
                        for s in co.kernarg_layout)
    return Compiled(code=co.hsaco, symbol=co.symbol, shared_mem=0, num_warps=block // WAVE,
                    warp_size=WAVE, param_types=param_types,
                    code_hash=f"{co.content_hash}-{digest}", isa=co.isa,
                    param_names=tuple(s.name for s in co.kernarg_layout))


_SCALAR = {"i32": (np.int32, launcher.i32), "f32": (np.float32, launcher.f32),
           "i64": (np.int64, launcher.i64)}


def launch(co, grid: Sequence[int], *, buffers: Sequence[str | None],
           scalars: Mapping[str, int | float], nulls: Sequence[str] = ()) -> launcher.Launch:
    """The launch of code object ``co``: ``buffers[i]`` names the pointer argument that
    receives buffer ``i`` of the custom call (operands, then results; ``None``: not passed),
    ``nulls`` the pointer arguments passed as null, ``scalars`` every other argument by name.
    The parameter order and kinds come from the kernel's argument list."""
    slot = {name: i for i, name in enumerate(buffers) if name is not None}
    params = []
    for arg in co.kernarg_layout:
        if arg.kind == "pointer":
            if arg.name in slot:
                params.append(launcher.buffer(slot[arg.name]))
            elif arg.name in nulls:
                params.append(launcher.null())
            else:
                raise TypeError(f"{co.symbol}: no buffer for pointer argument {arg.name!r}")
        elif arg.name in scalars:
            cast, param = _SCALAR[arg.kind]
            params.append(param(cast(scalars[arg.name])))
        else:
            raise TypeError(f"{co.symbol}: no value for argument {arg.name!r}")
    extra = set(scalars) - {a.name for a in co.kernarg_layout}
    if extra:
        raise TypeError(f"{co.symbol}: no arguments named {sorted(extra)}")
    return launcher.Launch(compiled(co), tuple(int(g) for g in grid), tuple(params))


def empty_or(grid, *sizes) -> tuple[int, int, int]:
    """``grid``, or an empty grid (nothing launched) when any of ``sizes`` is 0."""
    return tuple(grid) if all(sizes) else (0, 1, 1)


def q_dtype(aval) -> str:
    return "e4m3" if jnp.dtype(aval.dtype) == jnp.float8_e4m3fn else "bf16"


__all__ = ["POWERS", "available", "code_object_problem", "compiled", "empty_or", "launch",
           "q_dtype"]
