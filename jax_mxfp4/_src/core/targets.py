"""What a kernel lowering compiles for and where its custom call runs.

A :class:`Target` is resolved once per lowered call from the backend choice, the JAX platform
being lowered for and the devices of the lowering context. Kernel lowerings read it; nothing
else in the package asks devices for their architecture.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import jax

if TYPE_CHECKING:  # backend imports this module: the "auto" backend's target is native()
    from jax_mxfp4._src.dispatch.backend import LoweringConfig

CPU, CUDA, ROCM = "cpu", "cuda", "rocm"
GPU_PLATFORMS = (CUDA, ROCM)
PLATFORMS = (CPU, *GPU_PLATFORMS)

DEFAULT_ARCH = {CUDA: "90", ROCM: "gfx942"}
"""Arch assumed when a device does not report one."""
DEFAULT_UNITS = {CUDA: 132, ROCM: 256}
"""SMs (H200) / CUs (MI355X) assumed when a device does not report its count. Launch plans
use the count only to size grids; results never depend on it (docs/spec.md §9.1)."""
WARP_SIZE = {CUDA: 32, ROCM: 64}


@dataclasses.dataclass(frozen=True)
class Target:
    """The kernels a call lowers to.

    ``platform``: the JAX platform whose custom call is emitted (``"cpu"``, ``"cuda"``,
    ``"rocm"``); ``device``: whose kernels run (``"cpu"`` C++ handlers, ``"cuda"`` or
    ``"rocm"`` code objects); ``arch``: the GPU arch (``"90"``, ``"gfx942"``, ``"gfx950"``),
    empty on the CPU; ``units``: SMs or CUs; ``emulated``: the code objects execute in the
    project's CDNA emulator on the CPU (``platform`` is then ``"cpu"``).
    """

    platform: str
    device: str
    arch: str = ""
    units: int = 0
    emulated: bool = False

    @property
    def warp_size(self) -> int:
        return WARP_SIZE.get(self.device, 1)

    def describe(self) -> str:
        if self.device == CPU:
            return "cpu"
        where = " (emulated on the CPU)" if self.emulated else ""
        return f"{self.device} {self.arch}{where}"


def _clean_arch(arch) -> str:
    """``"gfx950:sramecc+:xnack-"`` -> ``"gfx950"``; ``"9.0"`` -> ``"90"``."""
    return str(arch).split(":")[0].replace(".", "")


def _context_devices(ctx) -> list:
    """The devices a lowering context compiles for (empty when it names none)."""
    if ctx is None:
        return []
    axis = getattr(ctx.module_context, "axis_context", None)
    devices = getattr(axis, "device_assignment", None)
    if devices is None and getattr(axis, "mesh", None) is not None:
        devices = list(axis.mesh.devices.flat)
    return list(devices or [])


def _device_of(platform: str, ctx):
    for device in _context_devices(ctx):
        if device.platform in (platform, "gpu"):
            return device
    try:
        devices = jax.devices(platform)
    except RuntimeError:
        return None
    return devices[0] if devices else None


def native(platform: str, ctx, config: LoweringConfig) -> Target:
    """The ``"auto"`` backend's target on ``platform``: that platform's own kernels, for the
    arch of the context's (or this process's) devices unless ``config.gpu_arch`` says
    otherwise."""
    if platform == CPU:
        return Target(CPU, CPU)
    if platform not in GPU_PLATFORMS:
        raise NotImplementedError(f"jax_mxfp4 has no kernels for platform {platform!r}")
    device = None if config.gpu_arch else _device_of(platform, ctx)
    arch = config.gpu_arch or getattr(device, "compute_capability", None)
    units = config.gpu_units or getattr(device, "core_count", 0) or DEFAULT_UNITS[platform]
    return Target(platform, platform, _clean_arch(arch or DEFAULT_ARCH[platform]), int(units))


def emulated(arch: str, units: int = DEFAULT_UNITS[ROCM]) -> Target:
    """A ROCm ``arch`` whose code objects run in the CDNA emulator, lowered on the CPU."""
    return Target(CPU, ROCM, arch, units, emulated=True)


__all__ = ["CPU", "CUDA", "DEFAULT_UNITS", "GPU_PLATFORMS", "PLATFORMS", "ROCM", "Target",
           "emulated", "native"]
