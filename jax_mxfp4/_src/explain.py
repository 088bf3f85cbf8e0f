"""Which kernel each operation of a function lowers to, and why the others were skipped.

``jm.explain(fn, *args, **kwargs)`` traces ``fn`` (as ``jax.jit`` would, with the current
backend and lowering options), finds every jax_mxfp4 operation in it (inside ``jit``,
``scan``, ``cond``, ``vmap``... too) and asks each operation's lowerings the same
``covers(call)`` question the lowering rule asks, so what it prints is what runs. The avals
are the whole operands': a sharded call lowers per shard on its slices, where a lowering whose
cover depends on a size could answer differently (none does today).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import jax
from jax.extend import core as jex_core

from jax_mxfp4._src.core._table import format_table
from jax_mxfp4._src.dispatch.operation import OPERATION_OF_PRIMITIVE, call_of, choice_for


@dataclasses.dataclass(frozen=True)
class LoweredOperation:
    """One operation of a traced function and what it lowers to on ``platform``."""

    operation: str
    platform: str
    target: str  # e.g. "cpu", "rocm gfx950 (emulated on the CPU)", "reference"
    lowering: str  # "ffi:<target>", "triton:<kernel>", "flydsl:<kernel>", "reference", "none"
    skipped: tuple[tuple[str, str], ...]  # (lowering, why it does not cover the call)
    shapes: str  # operand shapes and dtypes

    def line(self) -> str:
        why = "; ".join(f"{name}: {reason}" for name, reason in self.skipped)
        return f"{self.operation}: {self.lowering}" + (f" (skipped {why})" if why else "")


class Explanation(list):
    """A list of :class:`LoweredOperation`, printed as a table."""

    def __str__(self) -> str:
        header = ("operation", "operands", "platform", "lowers to", "skipped (why)")
        rows = [(e.operation, e.shapes, e.target, e.lowering,
                 "; ".join(f"{n}: {r}" for n, r in e.skipped) or "-") for e in self]
        return format_table(header, rows) if rows else "(no jax_mxfp4 operation)"


def default_platform() -> str:
    """The JAX platform of the default device: ``"cpu"``, ``"cuda"`` or ``"rocm"``."""
    return platform_of(jax.devices()[0])


def platform_of(device) -> str:
    if device.platform != "gpu":
        return device.platform
    version = str(getattr(device.client, "platform_version", "")).lower()
    return "rocm" if "rocm" in version or "hip" in version else "cuda"


def _subjaxprs(params) -> Iterator:
    for value in params.values():
        for item in value if isinstance(value, (list, tuple)) else (value,):
            if isinstance(item, jex_core.ClosedJaxpr):
                yield item.jaxpr
            elif isinstance(item, jex_core.Jaxpr):
                yield item


def _equations(jaxpr) -> Iterator:
    for eqn in jaxpr.eqns:
        yield eqn
        for sub in _subjaxprs(eqn.params):
            yield from _equations(sub)


def _shapes(avals) -> str:
    return ", ".join(f"{a.dtype}{list(a.shape)}" for a in avals)


def explain(fn, *args, platform: str | None = None, **kwargs) -> Explanation:
    """What every jax_mxfp4 operation in ``fn(*args, **kwargs)`` lowers to on ``platform``
    (default: the default device's), in program order."""
    platform = platform or default_platform()
    closed = jax.make_jaxpr(fn)(*args, **kwargs)
    found = Explanation()
    for eqn in _equations(closed.jaxpr):
        op = OPERATION_OF_PRIMITIVE.get(eqn.primitive)
        if op is None:
            continue
        avals_in = [v.aval for v in eqn.invars]
        avals_out = [v.aval for v in eqn.outvars]
        try:
            call = call_of(op, platform, avals_in, avals_out, eqn.params)
        except NotImplementedError as error:  # the backend cannot lower on this platform
            found.append(LoweredOperation(op.name, platform, platform, "none",
                                          (("backend", str(error)),), _shapes(avals_in)))
            continue
        if call is None:
            found.append(LoweredOperation(op.name, platform, "reference", "reference", (),
                                          _shapes(avals_in)))
            continue
        choice = choice_for(op, call)
        found.append(LoweredOperation(op.name, platform, call.target.describe(),
                                      choice.describe(call), choice.skipped,
                                      _shapes(avals_in)))
    return found


__all__ = ["Explanation", "LoweredOperation", "default_platform", "explain", "platform_of"]
