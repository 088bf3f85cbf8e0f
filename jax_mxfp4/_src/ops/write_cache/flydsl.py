"""The gfx950 lowering of ``write_cache``: which calls the FlyDSL kernels of
``jax_mxfp4._src.ops.write_cache.flydsl_kernel`` cover, their specialization, and the launch
(``dispatch.lowering.KernelModule``: ``available``, ``covers``, ``kernel_name``, ``lower``).
"""

from __future__ import annotations

from jax.interpreters import mlir

from jax_mxfp4._src.core.formats import ROUND_MODE_CODES
from jax_mxfp4._src.core.pages import last_writer_slots
from jax_mxfp4._src.flydsl import launch as _launch
from jax_mxfp4._src.flydsl.abi import Specialization
from jax_mxfp4._src.flydsl.code_object import code_object
from jax_mxfp4._src.gpu import launch as launcher

SPEC = Specialization("write_cache")


def available(target, config) -> str | None:
    return _launch.available(target, config) or _launch.code_object_problem(SPEC, target.arch)


def covers(call) -> str | None:
    return None  # every call: the round mode is a runtime argument


def kernel_name(call) -> str:
    return SPEC.symbol


def lower(ctx, call, pool, x, slots):
    """Slots a later row overwrites are dropped first (``pages.last_writer_slots``): the
    kernel writes its rows in parallel, and the last writer must win (SPEC §3.1)."""
    pool_aval, x_aval, slots_aval = call.avals_in
    tokens = x_aval.shape[0]
    heads = pool_aval.shape[1] if len(pool_aval.shape) == 3 else 1
    sub = ctx.replace(avals_in=[slots_aval], avals_out=[slots_aval])
    slots = mlir.lower_fun(lambda s: [last_writer_slots(s)])(sub, slots)[0]
    co = code_object(SPEC, arch=call.target.arch)
    launch = _launch.launch(
        co, _launch.empty_or(co.grid(num_tokens=tokens, num_heads=heads), tokens, heads),
        buffers=(None, "x", "slots", "pool"),  # the pool result, aliased to operand 0
        scalars={"num_tokens": tokens, "num_pages": pool_aval.shape[0], "num_heads": heads,
                 "round_mode": ROUND_MODE_CODES[call.params["round_mode"]]})
    return launcher.emit(ctx, launch, [pool, x, slots], call.avals_in, call.avals_out, {0: 0})
