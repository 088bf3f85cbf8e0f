"""``python -m jax_mxfp4 info``: the backends, and what each operation lowers to per platform.

Per platform with a device here, each operation's lowerings are listed in the order they are
tried, with those that cannot run here and why (not installed, not built, another arch). Which
one a given call takes can depend on the call (a FlyDSL kernel covers some shapes and options):
``jm.explain(fn, *args)`` answers that for the calls of a function.
"""

from __future__ import annotations

import jax

from jax_mxfp4._src.core._table import format_table
from jax_mxfp4._src.dispatch import backend as backends
from jax_mxfp4._src.dispatch.backend import current_config
from jax_mxfp4._src.dispatch.operation import OPERATIONS, Operation
from jax_mxfp4._src.explain import platform_of

_WORDS = {"ffi": "C++ handler", "triton": "Triton kernel", "flydsl": "FlyDSL kernel"}


def describe(name: str) -> str:
    """``"triton:index_scores"`` -> ``"Triton kernel index_scores"``."""
    family, _, what = name.partition(":")
    return f"{_WORDS.get(family, family)} {what}".strip()


def _chain(op: Operation, platform: str) -> str:
    """The lowerings ``op`` tries on ``platform``, available ones first in order."""
    config = current_config()
    chosen = backends.backend(config.backend)
    if chosen.target is None:
        return "reference lowering (plain jax.numpy)"
    try:
        target = chosen.target(platform, None, config)
    except NotImplementedError as error:
        return f"nothing: {error}"
    usable, unusable = [], []
    for lowering in op.lowerings:
        if target.device not in lowering.devices:
            continue
        reason = lowering.available(target, config)
        if reason is None:
            usable.append(describe(lowering.name))
        else:
            unusable.append(f"{describe(lowering.name)}: {reason}")
    text = " where it covers the call, else ".join(usable) if usable else "nothing (fails)"
    return text + (f" [not here: {'; '.join(unusable)}]" if unusable else "")


def lowering_table() -> list[tuple[str, str, str]]:
    """``(platform, operation, what it lowers to)`` for every platform with a device here."""
    platforms = sorted({platform_of(d) for d in jax.devices()})
    return [(platform, op.name, _chain(op, platform)) for platform in platforms
            for op in OPERATIONS]


def run(args) -> int:
    del args
    devices = ", ".join(f"{d.platform}:{d.id} ({d.device_kind})" for d in jax.devices())
    config = current_config()
    print(f"jax {jax.__version__}; devices: {devices}")
    print(f"backend: {config.backend} (choices: {', '.join(backends.backends())}); {config}")
    print(format_table(("platform", "operation", "lowers to"), lowering_table()))
    print("Per call: jax_mxfp4.explain(fn, *args) lists what each operation of fn lowers to.")
    return 0
