"""Which implementation each operation lowers to, and every switch that changes a lowering.

A *backend* says, for each JAX platform a computation is lowered for, which kernels to use:

* ``"auto"`` (default): each platform's own kernels (C++ handlers on the CPU, Triton on CUDA,
  FlyDSL then Triton on ROCm gfx950, Triton on other ROCm archs);
* ``"reference"``: the plain-XLA reference lowering everywhere (slow; for debugging and
  comparison; it never runs unless asked for);
* backends registered by other modules with :func:`register_backend` (the emulated gfx950 and
  gfx942 backends run the ROCm lowering on the CPU).

The choice and the lowering options below are JAX configuration states that are part of both
the trace context and jit's cache key: changing one (globally, or for a block of code with
:func:`backend_scope` / :func:`lowering_options`) retraces and recompiles a jitted function on
its next call instead of reusing an executable made under the other choice. Each has an
environment variable as its default:

=============================  =========================  ==========================================
state                          environment variable       meaning
=============================  =========================  ==========================================
``jax_mxfp4_backend``          ``JAX_MXFP4_BACKEND``      backend name (above)
``jax_mxfp4_gfx950_kernels``   ``JAX_MXFP4_GFX950_KERNELS``  ``"flydsl"`` or ``"triton"`` on gfx950
``jax_mxfp4_cuda_kernels``     ``JAX_MXFP4_CUDA_KERNELS``  ``"auto"`` (the measured fastest:
                                                          Triton, and the Gluon index rows
                                                          tile at S * H = 2..8 and prefill
                                                          tile on sm_90), or ``"triton"``
                                                          (Triton only)
``jax_mxfp4_gpu_arch``         ``JAX_MXFP4_GPU_ARCH``     lower for this GPU arch (``90``,
                                                          ``gfx942``, ``gfx950``) instead of the
                                                          device's: lowering without that GPU
``jax_mxfp4_gpu_units``        ``JAX_MXFP4_GPU_UNITS``    SM/CU count the launch plans assume
=============================  =========================  ==========================================

Each operation's primitive is bound with a :class:`LoweringConfig` snapshot of these states
(its ``config`` parameter), so a jaxpr records what it was traced under.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator

from jax._src import config as _jax_config

from jax_mxfp4._src.core.targets import native

AUTO, REFERENCE = "auto", "reference"
GFX950_KERNEL_CHOICES = ("flydsl", "triton")
CUDA_KERNEL_CHOICES = ("auto", "triton")


@dataclasses.dataclass(frozen=True)
class Backend:
    """A named choice of kernels per platform.

    ``target(platform, ctx, config)`` returns the :class:`jax_mxfp4._src.core.targets.Target` the
    operations lower to on JAX platform ``platform`` (``"cpu"``, ``"cuda"``, ``"rocm"``), or
    raises ``NotImplementedError`` saying why this backend cannot lower there. ``None`` (the
    reference backend): every operation takes the reference lowering. ``static_shapes``: every
    kernel it lowers to launches a grid sized from the shapes, so an operand with a symbolic
    dimension (``jax.export.symbolic_shape``) is refused at trace time, naming the operand.
    """

    name: str
    help: str
    target: Callable | None
    static_shapes: bool = False


_BACKENDS: dict[str, Backend] = {}


def register_backend(backend: Backend) -> None:
    """Make ``backend`` choosable by name (``set_backend``, ``JAX_MXFP4_BACKEND``...)."""
    _BACKENDS[backend.name] = backend


def backends() -> tuple[str, ...]:
    """Names of every registered backend."""
    return tuple(_BACKENDS)


def backend(name: str) -> Backend:
    """The registered backend ``name``; ``ValueError`` naming the choices otherwise."""
    try:
        return _BACKENDS[name]
    except KeyError:
        raise ValueError(f"backend must be one of {backends()}, got {name!r}") from None


register_backend(Backend(AUTO, "each platform's own kernels", native))
register_backend(Backend(REFERENCE, "the plain jax.numpy lowering everywhere", None))


def _string_state(name: str, default: str | None, help: str,
                  check: Callable[[object], bool], expected: str):
    """A string-valued state (its environment variable is ``name.upper()``) in the trace
    context and jit's cache key; values failing ``check`` raise ``ValueError``."""
    def validator(value) -> None:
        if not check(value):
            raise ValueError(f"{name} must be {expected}, got {value!r}")

    return _jax_config.string_or_object_state(
        name, default, help, validator=validator, include_in_jit_key=True,
        include_in_trace_context=True)


def _is_optional_str(value) -> bool:
    return value is None or isinstance(value, str)


# The backend name is checked against the registry where it is used (set_backend, lowering,
# and once at import of jax_mxfp4): backends register after this state exists.
_backend_state = _string_state(
    "jax_mxfp4_backend", AUTO, "jax_mxfp4: which kernels each operation lowers to.",
    lambda v: isinstance(v, str), "a backend name")
_gfx950_kernels_state = _string_state(
    "jax_mxfp4_gfx950_kernels", "flydsl",
    "jax_mxfp4: on gfx950, the FlyDSL kernels where they cover a call, or the Triton ones.",
    lambda v: v in GFX950_KERNEL_CHOICES, f"one of {GFX950_KERNEL_CHOICES}")
_cuda_kernels_state = _string_state(
    "jax_mxfp4_cuda_kernels", "auto",
    "jax_mxfp4: on CUDA, the fastest measured kernels (auto: Triton, and the Gluon index rows "
    "and prefill tiles where they cover a call) or the Triton kernels only (triton).",
    lambda v: v in CUDA_KERNEL_CHOICES, f"one of {CUDA_KERNEL_CHOICES}")
_gpu_arch_state = _string_state(
    "jax_mxfp4_gpu_arch", None,
    "jax_mxfp4: GPU arch to lower for (e.g. 90, gfx942, gfx950) instead of the device's.",
    _is_optional_str, "an arch name such as '90' or 'gfx950'")
_gpu_units_state = _string_state(
    "jax_mxfp4_gpu_units", None, "jax_mxfp4: SM/CU count that launch plans assume.",
    lambda v: v is None or (isinstance(v, str) and v.isdigit() and int(v) > 0),
    "a positive integer")


@dataclasses.dataclass(frozen=True)
class LoweringConfig:
    """A snapshot of every lowering switch, taken when an operation is bound."""

    backend: str = AUTO
    gfx950_kernels: str = "flydsl"
    cuda_kernels: str = "auto"
    gpu_arch: str | None = None
    gpu_units: int | None = None


def current_config() -> LoweringConfig:
    """The lowering switches in effect in this thread now."""
    units = _gpu_units_state.value
    return LoweringConfig(
        backend=_backend_state.value,
        gfx950_kernels=_gfx950_kernels_state.value, cuda_kernels=_cuda_kernels_state.value,
        gpu_arch=None if _gpu_arch_state.value in (None, "") else str(_gpu_arch_state.value),
        gpu_units=None if units in (None, "") else int(units),
    )


def set_backend(name: str) -> None:
    """Choose backend ``name`` for every operation traced from now on (all threads)."""
    backend(name)
    _jax_config.config.update("jax_mxfp4_backend", name)


def get_backend() -> str:
    return _backend_state.value


@contextlib.contextmanager
def backend_scope(name: str) -> Iterator[None]:
    """Use backend ``name`` inside the ``with`` block (this thread only)."""
    backend(name)
    with _backend_state(name):
        yield


@contextlib.contextmanager
def lowering_options(*, gfx950_kernels: str | None = None, cuda_kernels: str | None = None,
                     gpu_arch: str | int | None = None,
                     gpu_units: int | None = None) -> Iterator[None]:
    """Set lowering switches inside the ``with`` block (this thread only); ``None`` leaves a
    switch as it is. See the module docstring for what each one does."""
    with contextlib.ExitStack() as stack:
        if gfx950_kernels is not None:
            stack.enter_context(_gfx950_kernels_state(gfx950_kernels))
        if cuda_kernels is not None:
            stack.enter_context(_cuda_kernels_state(cuda_kernels))
        if gpu_arch is not None:
            stack.enter_context(_gpu_arch_state(str(gpu_arch)))
        if gpu_units is not None:
            stack.enter_context(_gpu_units_state(str(int(gpu_units))))
        yield


def check_environment() -> None:
    """Refuse an unknown ``JAX_MXFP4_BACKEND`` at import (after every backend registered)."""
    name = _backend_state.value
    if name not in _BACKENDS:
        raise ValueError(f"JAX_MXFP4_BACKEND must be one of {backends()}, got {name!r}")


__all__ = [
    "AUTO",
    "REFERENCE",
    "Backend",
    "LoweringConfig",
    "backend",
    "backend_scope",
    "backends",
    "check_environment",
    "current_config",
    "get_backend",
    "lowering_options",
    "register_backend",
    "set_backend",
]
