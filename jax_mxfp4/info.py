"""``python -m jax_mxfp4 info``: which implementation each operation lowers to, per platform."""

from __future__ import annotations

import jax

from jax_mxfp4 import primitives  # noqa: F401  (defines the operations)
from jax_mxfp4._table import format_table as _format_table
from jax_mxfp4.backend import get_backend
from jax_mxfp4.primitives._operation import OPERATIONS, implementation


def lowering_table() -> list[tuple[str, str, str]]:
    """``(platform, operation, implementation)`` for every platform with a device here."""
    platforms = sorted({d.platform for d in jax.devices()})
    backend = get_backend()
    return [
        (platform, op.name, implementation(op, platform, backend))
        for platform in platforms
        for op in OPERATIONS
    ]


def describe(impl: str) -> str:
    if impl.startswith("ffi:"):
        return f"C++ XLA FFI handler ({impl[4:]})"
    if impl.startswith("triton:"):
        return f"Triton kernel ({impl[7:]}) via the GPU launcher"
    if impl.startswith("flydsl:"):
        return f"FlyDSL kernel ({impl[7:]}) via the GPU launcher"
    return "reference lowering (plain jax.numpy)"


def format_table(rows: list[tuple[str, str, str]]) -> str:
    header = ("platform", "operation", "lowers to")
    body = [(p, o, describe(i)) for p, o, i in rows]
    return _format_table(header, body)


def run(args) -> int:
    del args
    devices = ", ".join(f"{d.platform}:{d.id} ({d.device_kind})" for d in jax.devices())
    print(f"jax {jax.__version__}; devices: {devices}; backend choice: {get_backend()}")
    print(format_table(lowering_table()))
    return 0
