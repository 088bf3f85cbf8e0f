"""One Triton kernel launch described by names, its signature derived from the kernel and avals.

A Triton lowering says which kernel argument receives which buffer of the custom call
(``buffers``: argument names in the order of the call's operands then results), which
arguments are null pointers, the scalars by name (numpy scalars: their dtype is the argument's
type) and the compile-time constants. :func:`launch` turns that into the compiled kernel and
its parameter list in the kernel's own argument order, as jax-triton derives a launch from
avals, so no lowering writes a buffer index or a type string by hand.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np

from jax_mxfp4._src.core.targets import CUDA, Target
from jax_mxfp4._src.gpu import launch as launcher
from jax_mxfp4._src.triton import compiler

_POINTER = {
    jnp.dtype(jnp.uint8): "*u8",
    jnp.dtype(jnp.int32): "*i32",
    jnp.dtype(jnp.bfloat16): "*bf16",
    jnp.dtype(jnp.float8_e4m3fn): "*fp8e4nv",
    jnp.dtype(jnp.float32): "*fp32",
}
_SCALAR = {np.dtype(np.int32): ("i32", launcher.i32), np.dtype(np.int64): ("i64", launcher.i64),
           np.dtype(np.float32): ("fp32", launcher.f32)}


def triton_target(target: Target) -> compiler.Target:
    """The Triton compile target of a kernel :class:`~jax_mxfp4._src.core.targets.Target`."""
    if target.device == CUDA:
        return compiler.Target("cuda", int(target.arch), target.warp_size)
    return compiler.Target("hip", target.arch, target.warp_size)


def pointer_type(dtype) -> str:
    return _POINTER[jnp.dtype(dtype)]


def launch(fn, target: Target, *, grid: Sequence[int], buffers: Sequence[str | None],
           avals: Sequence, scalars: Mapping[str, np.generic], constants: Mapping[str, Any],
           nulls: Mapping[str, Any] | None = None, num_warps: int = 4,
           num_stages: int = 2, max_registers: int | None = None) -> launcher.Launch:
    """The launch of ``fn`` (a ``@triton.jit`` function) compiled for ``target``.

    A kernel argument named ``PTX`` is a constant given here, not by the lowering: whether
    the kernel may use inline PTX (a CUDA target).

    ``buffers[i]`` is the name of the pointer argument that receives buffer ``i`` of the
    custom call, whose abstract value is ``avals[i]`` (``None``: the kernel does not take it,
    e.g. an operand aliased to a result the kernel writes); ``nulls`` maps pointer arguments passed
    as null to the dtype they point to; ``scalars`` maps every other runtime argument to a
    numpy scalar; ``constants`` every constexpr argument.
    """
    if len(buffers) != len(avals):
        raise ValueError(f"{fn.__name__}: {len(buffers)} buffer names for {len(avals)} avals")
    nulls = dict(nulls or {})
    constants = dict(constants)
    if "PTX" in fn.arg_names:
        constants["PTX"] = target.device == CUDA
    slot = {name: i for i, name in enumerate(buffers) if name is not None}
    types, params = {}, []
    for name in fn.arg_names:
        if name in constants:
            continue
        if name in slot:
            types[name] = pointer_type(avals[slot[name]].dtype)
            params.append(launcher.buffer(slot[name]))
        elif name in nulls:
            types[name] = pointer_type(nulls[name])
            params.append(launcher.null())
        elif name in scalars:
            kind, param = _SCALAR[np.asarray(scalars[name]).dtype]
            types[name] = kind
            params.append(param(scalars[name]))
        else:
            raise TypeError(f"{fn.__name__}: nothing given for argument {name!r}")
    spec = compiler.spec(fn, types, constants, num_warps=num_warps,
                         num_stages=num_stages, max_registers=max_registers)
    kernel = compiler.compile_kernel(spec, triton_target(target))
    return launcher.Launch(kernel, tuple(int(g) for g in grid),
                           launcher.with_scratch(params))


def gluon_runs(call) -> bool:
    """Whether ``call``'s target runs Gluon kernels: CUDA sm_80+ (``mma.sync`` operand
    layouts)."""
    arch = call.target.arch
    return call.target.device == CUDA and arch.isdigit() and int(arch) >= 80


def launcher_problem(target: Target) -> str | None:
    """Why the code-object launcher cannot run on ``target``'s platform, or ``None``."""
    return launcher.problem(target)


__all__ = ["gluon_runs", "launch", "launcher_problem", "pointer_type",
           "triton_target"]
