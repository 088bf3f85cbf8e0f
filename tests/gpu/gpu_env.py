"""Where the GPU tests may run: JAX sees a CUDA or ROCm device, Triton imports and the launcher
extension is built. Test modules here start with ``pytestmark = gpu_env.required()``."""

from __future__ import annotations

import functools

import jax
import pytest


@functools.cache
def unavailable_reason() -> str | None:
    try:
        if not jax.devices("gpu"):
            return "no GPU device"
    except RuntimeError:
        return "no GPU device"
    try:
        import triton  # noqa: F401
    except ImportError:
        return "triton is not installed"
    from jax_mxfp4._src.gpu import launch

    if not launch.register_gpu_targets():
        return "the GPU launcher extension is not built"
    return None


def required():
    reason = unavailable_reason()
    return pytest.mark.skipif(reason is not None, reason=reason or "")


def gpu():
    return jax.devices("gpu")[0]


def units() -> int:
    """The GPU's SM count, as the lowering reads it (``targets.native``); 132 without a GPU
    (the tests using it are skipped then)."""
    from jax_mxfp4._src.core.targets import CUDA, DEFAULT_UNITS

    try:
        return int(getattr(gpu(), "core_count", 0) or DEFAULT_UNITS[CUDA])
    except RuntimeError:
        return DEFAULT_UNITS[CUDA]
