"""``jax.export`` for functions that call jax_mxfp4 operations: ``jm.export``, ``jm.EXPORT_CHECKS``.

JAX refuses to export a custom call whose target is not on its own list of targets with a
compatibility guarantee ("Cannot serialize code with custom calls whose targets have no
compatibility guarantees"). Every jax_mxfp4 operation lowers to such a custom call: the C++
handlers on the CPU (``ffi_targets.cpu_target_names()``) and the generic code-object launcher on
GPUs (``gpu.launch.TARGET``, which carries the compiled kernel inside its attributes, so an
exported function holds everything it needs). :data:`EXPORT_CHECKS` lists the checks to disable for
them; :func:`export` passes it for you::

    exported = jm.export(step)(*args)        # a jax.export.Exported
    blob = exported.serialize()              # bytes (needs the flatbuffers package)
    again = jm.deserialize(blob)             # in this process or another one
    out = again.call(*args)                  # the same bits as jax.jit(step)(*args)

:func:`deserialize` registers the package's custom-call targets with XLA before it returns:
a fresh process registers them only at its first jax_mxfp4 lowering, and a deserialized
function lowers nothing of ours, so ``jax.export.deserialize`` alone fails there with "No FFI
handler registered". Compatibility is ours to keep, not JAX's: an exported function calls the
targets by name, so it runs where a jax_mxfp4 with the same targets (names, operands,
attributes) is installed. Importing this module also registers ``SparseSelection`` for
serialization, so an exported function may return one.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

import jax
from jax import export as jax_export

from jax_mxfp4._src import ffi_targets
from jax_mxfp4._src.core.selection import SparseSelection
from jax_mxfp4._src.gpu import launch

CUSTOM_CALL_TARGETS: tuple[str, ...] = (*sorted(ffi_targets.cpu_target_names()), launch.TARGET)
"""Every custom-call target the package registers: the CPU handlers and the GPU launcher."""

EXPORT_CHECKS: tuple[jax_export.DisabledSafetyCheck, ...] = tuple(
    jax_export.DisabledSafetyCheck.custom_call(name) for name in CUSTOM_CALL_TARGETS
)
"""``disabled_checks`` for ``jax.export.export`` covering every jax_mxfp4 custom call::

    jax.export.export(jax.jit(step), disabled_checks=jm.EXPORT_CHECKS)(*args)
"""

jax_export.register_namedtuple_serialization(
    SparseSelection, serialized_name="jax_mxfp4.SparseSelection"
)


def export(
    fn: Callable, *, platforms: Sequence[str] | None = None,
    disabled_checks: Sequence[jax_export.DisabledSafetyCheck] = (), **jit_kwargs: Any,
) -> Callable[..., jax_export.Exported]:
    """``jax.export.export`` with :data:`EXPORT_CHECKS` disabled.

    Args:
      fn: a function (wrapped in ``jax.jit(fn, **jit_kwargs)`` here) or an already jitted one
        (then ``jit_kwargs`` must be empty).
      platforms: lowering platforms (``"cpu"``, ``"cuda"``, ``"rocm"``); default: the default
        backend's.
      disabled_checks: more checks to disable, added to :data:`EXPORT_CHECKS`.
    Returns:
      A function of example arguments (arrays or ``jax.ShapeDtypeStruct``) that returns the
      ``jax.export.Exported``.
    """
    if hasattr(fn, "trace") and hasattr(fn, "lower"):  # already a jax.jit function
        if jit_kwargs:
            raise ValueError(f"fn is already jitted: pass {sorted(jit_kwargs)} to its jax.jit")
        jitted = fn
    else:
        jitted = jax.jit(fn, **jit_kwargs)
    checks = (*EXPORT_CHECKS, *disabled_checks)
    return jax_export.export(jitted, platforms=platforms, disabled_checks=checks)


def deserialize(blob: bytes | bytearray) -> jax_export.Exported:
    """``jax.export.deserialize(blob)`` after registering the custom-call targets it calls.

    Raises ``RuntimeError`` naming the missing extension module when a target the function
    needs on this machine cannot be registered (the package's compiled handlers are not built).
    """
    exported = jax_export.deserialize(bytearray(blob))
    called = set(re.findall(r"custom_call @(\w+)", exported.mlir_module()))
    ours = {name for name in called if name.startswith("jax_mxfp4_")} - {launch.TARGET}
    missing_cpu = ours - ffi_targets.register_cpu_targets()
    if missing_cpu and "cpu" in exported.platforms:
        raise RuntimeError(
            f"the exported function calls {sorted(missing_cpu)}, which this jax_mxfp4 does not "
            "register on the CPU: its C++ handlers (jax_mxfp4._ffi_cpu) are not built; "
            "reinstall the package (pip install .)")
    gpu_platforms = {"cuda", "rocm"} & set(exported.platforms)
    if launch.TARGET in called and gpu_platforms and not launch.register_gpu_targets():
        if any(d.platform in gpu_platforms or d.platform == "gpu" for d in jax.devices()):
            raise RuntimeError(
                f"the exported function calls {launch.TARGET}, but the GPU launcher "
                "(jax_mxfp4._ffi_gpu) is not built; reinstall the package (pip install .)")
    return exported


__all__ = ["CUSTOM_CALL_TARGETS", "EXPORT_CHECKS", "deserialize", "export"]
