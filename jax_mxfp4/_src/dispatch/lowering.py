"""Lowerings: the unit of dispatch from an operation to one backend's kernel.

Each operation (``jax_mxfp4._src.ops.<op>.api``) holds an ordered tuple of :class:`Lowering`
objects. For a call being lowered, the backend resolves a ``core.targets.Target``; the first
lowering whose :meth:`Lowering.covers` answers ``None`` for that
:class:`Call` lowers it. ``info`` and :func:`jax_mxfp4.explain` ask the same question with the
same call, so what they print is what runs. A lowering that does not cover a call says why (a
reason string); when none covers it the call fails at lowering time with every reason and the fix:
nothing falls back silently, and the reference lowering runs only under ``backend="reference"``. A
lowering that would serve the call but cannot load (its module fails to import, its code objects
cannot be had) answers a :class:`LoadFailure`: the choice stops there and the call fails with that
cause and its fix, instead of taking the next lowering (the user opts into another kernel set on
purpose, e.g. ``gfx950_kernels="triton"``).

Lowerings live next to their kernels:

* :class:`CpuHandler`: a C++ XLA FFI handler of ``ffi/cpu`` (``jax_mxfp4._src.ffi_targets``);
* :class:`KernelModule`: a module holding ``covers(call)`` and ``lower(ctx, call, *args)``,
  imported only when a call is lowered for one of its devices (``ops/<op>/triton.py`` beside
  its Triton kernels, ``ops/<op>/flydsl.py`` beside its FlyDSL builder), so that Triton and
  FlyDSL stay optional.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Sequence
from typing import Any

import jax

from jax_mxfp4._src import ffi_targets
from jax_mxfp4._src.core.reasons import FLYDSL_REQUIREMENT, TRITON_REQUIREMENT, LoadFailure
from jax_mxfp4._src.core.targets import CPU, CUDA, ROCM, Target
from jax_mxfp4._src.dispatch.backend import LoweringConfig


@dataclasses.dataclass(frozen=True)
class Call:
    """One call of an operation's kernel primitive, as a lowering sees it.

    ``avals_in`` / ``avals_out``: the operands' and results' abstract values on this shard;
    ``params``: the operation's static options (``num_blocks``, ``q_round``...);
    ``config``: the lowering switches it was bound under; ``target``: where it lowers.
    """

    op: str
    target: Target
    avals_in: tuple
    avals_out: tuple
    params: dict[str, Any]
    config: LoweringConfig


class Lowering:
    """An implementation of an operation: what it covers and how it lowers.

    ``name`` says what runs (``"ffi:<target>"``, ``"triton:<kernel>"``,
    ``"flydsl:<kernel>"``); ``devices`` the :attr:`Target.device` values it serves.
    """

    name: str
    devices: tuple[str, ...]

    def available(self, target: Target, config: LoweringConfig) -> str | None:
        """``None`` if this lowering can run on ``target`` at all (installed, built, right
        arch), else why not: the part of :meth:`covers` that does not depend on a call."""
        raise NotImplementedError

    def covers(self, call: Call) -> str | None:
        """``None`` if this lowering implements ``call``, else why not (one sentence)."""
        raise NotImplementedError

    def lower(self, ctx, call: Call, *args) -> Sequence:
        """Emit the call's MLIR (inside a JAX lowering rule); returns the result values."""
        raise NotImplementedError

    def for_operation(self, operation: str) -> Lowering:
        """This lowering as the operation named ``operation`` holds it (``Operation``)."""
        return self


@dataclasses.dataclass(frozen=True)
class CpuHandler(Lowering):
    """A C++ FFI handler of ``ffi/cpu``: its XLA attributes from the call's static options,
    and operand -> result buffer aliases. Its target is named after the operation
    (``ffi_targets.cpu_target``), filled in by :meth:`for_operation` when the operation is
    defined."""

    attributes: Callable[..., dict]
    aliases: dict[int, int] | None = None
    target: str = ""
    devices: tuple[str, ...] = (CPU,)

    @property
    def name(self) -> str:
        return f"ffi:{self.target}"

    def for_operation(self, operation: str) -> CpuHandler:
        return self if self.target else dataclasses.replace(
            self, target=ffi_targets.cpu_target(operation))

    def available(self, target: Target, config: LoweringConfig) -> str | None:
        if target.device != CPU or target.emulated:
            return "C++ handlers serve the CPU"
        return ffi_targets.cpu_handlers_problem(self.target)

    def covers(self, call: Call) -> str | None:
        return self.available(call.target, call.config)

    def lower(self, ctx, call: Call, *args) -> Sequence:
        rule = jax.ffi.ffi_lowering(self.target, operand_output_aliases=self.aliases)
        return rule(ctx, *args, **self.attributes(**call.params))


@dataclasses.dataclass(frozen=True)
class KernelModule(Lowering):
    """A lowering whose ``available(target, config)``, ``covers(call)``, ``lower(ctx, call,
    *args)`` and ``kernel_name(call)`` are functions of the module ``module``, imported on
    first use; ``requires`` says what installing it takes, for the reason given when the
    import fails. The module's ``covers`` is only asked once ``available`` said yes."""

    family: str  # "triton" | "flydsl"
    op: str  # the folder of the operation: jax_mxfp4._src.ops.<op>
    devices: tuple[str, ...]
    requires: str

    @property
    def module(self) -> str:
        return f"jax_mxfp4._src.ops.{self.op}.{self.family}"

    @property
    def name(self) -> str:
        return f"{self.family}:{self.op}"

    def _load(self):
        return importlib.import_module(self.module)

    def available(self, target: Target, config: LoweringConfig) -> str | None:
        if target.device not in self.devices:
            return f"{self.family} kernels serve {'/'.join(self.devices)}"
        try:
            module = self._load()
        except ImportError as error:
            return LoadFailure(f"{self.module} does not import ({error}); {self.requires}")
        return module.available(target, config)

    def covers(self, call: Call) -> str | None:
        return self.available(call.target, call.config) or self._load().covers(call)

    def lower(self, ctx, call: Call, *args) -> Sequence:
        return self._load().lower(ctx, call, *args)

    def kernel_name(self, call: Call) -> str:
        """The kernel(s) this lowering launches for ``call`` (for ``explain``)."""
        describe = getattr(self._load(), "kernel_name", None)
        return f"{self.family}:{describe(call)}" if describe else self.name


def triton(op: str) -> KernelModule:
    """The Triton lowering of ``op``: ``jax_mxfp4._src.ops.<op>.triton`` (CUDA and ROCm)."""
    return KernelModule("triton", op, (CUDA, ROCM), TRITON_REQUIREMENT)


def flydsl(op: str) -> KernelModule:
    """The FlyDSL lowering of ``op``: ``jax_mxfp4._src.ops.<op>.flydsl`` (ROCm gfx950)."""
    return KernelModule("flydsl", op, (ROCM,), FLYDSL_REQUIREMENT)


@dataclasses.dataclass(frozen=True)
class Choice:
    """The outcome of choosing a lowering for a call: the one that covers it (``None`` when
    none does) and, for every lowering tried before it, why it was skipped."""

    lowering: Lowering | None
    skipped: tuple[tuple[str, str], ...]  # (lowering name, reason)

    @property
    def failure(self) -> tuple[str, str] | None:
        """``(lowering name, cause)`` when the choice stopped at a lowering that cannot load."""
        last = self.skipped[-1] if self.skipped else None
        return last if last and isinstance(last[1], LoadFailure) else None

    def describe(self, call: Call) -> str:
        if self.lowering is None:
            return "none"
        if isinstance(self.lowering, KernelModule):
            return self.lowering.kernel_name(call)
        return self.lowering.name


def choose(lowerings: Sequence[Lowering], call: Call) -> Choice:
    """The first of ``lowerings`` serving the call's device that covers ``call``; none (with
    the :class:`LoadFailure` last in ``skipped``) as soon as one that should cannot load."""
    skipped = []
    for lowering in lowerings:
        if call.target.device not in lowering.devices:
            continue
        reason = lowering.covers(call)
        if reason is None:
            return Choice(lowering, tuple(skipped))
        skipped.append((lowering.name, reason))
        if isinstance(reason, LoadFailure):
            break
    return Choice(None, tuple(skipped))


class NoLoweringError(NotImplementedError):
    """No lowering of the chosen backend covers a call (raised while lowering)."""


def no_lowering_message(call: Call, choice: Choice) -> str:
    if choice.failure is not None:
        name, cause = choice.failure
        return (
            f"{call.op}: {name} is the kernel for this call on {call.target.describe()} but "
            f"cannot load: {cause}. Fix that, or choose other kernels on purpose (on gfx950: "
            f"jax_mxfp4_gfx950_kernels='triton' / JAX_MXFP4_GFX950_KERNELS=triton); nothing "
            f"falls back silently."
        )
    reasons = "; ".join(f"{name}: {why}" for name, why in choice.skipped) or \
        "no kernel is registered for this device"
    return (
        f"{call.op}: backend {call.config.backend!r} has no kernel for this call on "
        f"{call.target.describe()} ({reasons}). Fix what the reason says, or run the slow "
        f"plain-XLA path on purpose with jax_mxfp4.set_backend('reference') or "
        f"JAX_MXFP4_BACKEND=reference."
    )


__all__ = ["Call", "Choice", "CpuHandler", "KernelModule", "LoadFailure", "Lowering",
           "NoLoweringError", "choose", "flydsl", "no_lowering_message", "triton"]
