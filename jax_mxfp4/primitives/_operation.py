"""The machinery every operation shares, after JAX's ``cudnn/scaled_matmul_stablehlo.py``.

Each operation is two primitives:

* the **operation primitive** (``mxfp4_index_scores``...), what user code binds: its abstract
  eval validates operands and options; its batching rule folds a vmapped axis into the
  kernel's own rows / requests / pages; it lowers through ``custom_partitioning`` so that a
  sharded call runs per shard, following a Shardy sharding rule (``_sharding``: global ids,
  made local per shard, so that data-parallel shards need no communication);
* the **kernel primitive** (``mxfp4_index_scores_kernel``), bound per shard on local shapes:
  it lowers to the platform's kernel (the C++ FFI handler on the CPU) or to the reference
  ``jax.numpy`` implementation (other platforms until their kernels land, and everywhere under
  ``set_backend("reference")``).

Static options travel as one hashable, sorted tuple of ``(name, value)`` pairs, so that
``custom_partitioning`` can take them as a single static argument.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import jax
from jax._src import dispatch
from jax._src.sharding_impls import GSPMDSharding, SPMDAxisContext
from jax.experimental.custom_partitioning import custom_partitioning
from jax.extend.core import Primitive
from jax.interpreters import batching, mlir
from jax.sharding import NamedSharding

from jax_mxfp4.ffi_targets import register_cpu_targets
from jax_mxfp4.primitives._sharding import ShardingRule, plan, shift_ids

Params = tuple[tuple[str, Any], ...]


def freeze(**params: Any) -> Params:
    return tuple(sorted(params.items()))


@dataclasses.dataclass(frozen=True)
class Operation:
    """An operation's definition; :func:`define` turns it into its two primitives."""

    name: str
    abstract_eval: Callable  # (*avals, **params) -> aval | list of avals
    batching_rule: Callable  # (bind, args, dims, **params) -> (outs, out_dims)
    reference: Callable  # (*arrays, **params) -> array | tuple of arrays
    cpu_target: str | None  # FFI target name on the CPU
    cpu_attributes: Callable[..., dict]  # (**params) -> FFI attributes
    sharding: Callable[[Sequence[tuple[int, ...]]], ShardingRule]  # operand shapes -> rule
    multiple_results: bool = False
    aliases: dict[int, int] | None = None  # operand -> result buffer aliasing
    # GPU lowering (CUDA, ROCm): (ctx, *args, **params) -> results; Triton kernels launched
    # through the generic launcher (jax_mxfp4.gpu.lowering). None: the reference lowering.
    gpu_lowering: Callable | None = None
    gpu_kernel: str | None = None  # the Triton kernel's name, for `implementation`


OPERATIONS: list[Operation] = []
"""Every operation :func:`define` has made, in definition order."""


def implementation(op: Operation, platform: str, backend: str) -> str:
    """What ``op`` lowers to on ``platform``: ``"ffi:<target>"``, ``"triton:<kernel>"``,
    ``"flydsl:<kernel>"`` (ROCm gfx950, calls a FlyDSL kernel covers) or ``"reference"``."""
    if backend != "reference" and platform == "cpu" and op.cpu_target is not None:
        if op.cpu_target in register_cpu_targets():
            return f"ffi:{op.cpu_target}"
    gpu = platform in GPU_PLATFORMS or platform == "gpu"  # jax.Device.platform says "gpu"
    if backend != "reference" and gpu and op.gpu_lowering is not None:
        from jax_mxfp4.gpu.lowering import available

        if available():
            if platform in ("rocm", "gpu"):
                from jax_mxfp4.gpu import flydsl_lowering as F

                name = F.kernel_name(op.gpu_lowering.__name__)
                if name is not None and F.enabled():
                    return f"flydsl:{name}"
            return f"triton:{op.gpu_kernel}"
    return "reference"


GPU_PLATFORMS = ("cuda", "rocm")
"""Platforms whose kernel primitives lower to the Triton kernels (``_gpu_lowering``)."""


def _gpu_lowering(op: Operation, platform: str) -> Callable:
    """The GPU rule: our Triton kernels through the generic launcher (on ROCm gfx950 the
    FlyDSL kernels where they cover the call: ``gpu.flydsl_lowering``), or the reference
    lowering under ``backend="reference"`` or where Triton / the launcher is missing."""
    reference_rule = _reference_lowering(op)

    def rule(ctx, *args, backend, **params):
        if implementation(op, platform, backend) == "reference":
            return reference_rule(ctx, *args, backend=backend, **params)
        if platform == "rocm":
            from jax_mxfp4.gpu import flydsl_lowering

            out = flydsl_lowering.lower(op.gpu_lowering.__name__, ctx, *args, **params)
            if out is not None:
                return out
        return op.gpu_lowering(ctx, *args, **params)

    return rule


def _reference_lowering(op: Operation) -> Callable:
    def rule(ctx, *args, backend, **params):
        del backend
        return mlir.lower_fun(partial(op.reference, **params), op.multiple_results)(ctx, *args)

    return rule


def _cpu_lowering(op: Operation) -> Callable:
    reference_rule = _reference_lowering(op)
    ffi_rule = jax.ffi.ffi_lowering(op.cpu_target, operand_output_aliases=op.aliases)

    def rule(ctx, *args, backend, **params):
        if implementation(op, "cpu", backend) == "reference":
            return reference_rule(ctx, *args, backend=backend, **params)
        return ffi_rule(ctx, *args, **op.cpu_attributes(**params))

    return rule


def _replicated_partition(per_shard, params, mesh, arg_shapes, result_shape):
    """``custom_partitioning``'s answer where the operands' shardings name no mesh axes
    (mesh-less ``GSPMDSharding``s): run the kernel on whole operands, which is always
    correct (XLA gathers what it must)."""
    whole = GSPMDSharding.get_replicated(arg_shapes[0].sharding._device_assignment)
    many = isinstance(result_shape, (list, tuple))
    results = [whole] * len(result_shape) if many else whole
    return mesh, partial(per_shard, params), results, tuple(whole for _ in arg_shapes)


def _partly_manual(ctx) -> bool:
    """Whether ``ctx`` lowers the body of a ``shard_map`` manual over some, not all, axes."""
    axis_context = ctx.module_context.axis_context
    if not isinstance(axis_context, SPMDAxisContext):
        return False
    manual = set(axis_context.manual_axes)
    return bool(manual) and manual != set(axis_context.mesh.axis_names)


def define(op: Operation) -> Primitive:
    """Create the operation and kernel primitives of ``op``; returns the operation primitive."""
    OPERATIONS.append(op)
    kernel = _kernel_primitive(op)

    def per_shard(params: Params, *args):
        return kernel.bind(*args, **dict(params))

    return _operation_primitive(op, per_shard, _partitioned(op, per_shard))


def _kernel_primitive(op: Operation) -> Primitive:
    """The primitive that lowers to one backend's kernel (or the reference) on local shapes."""
    kernel = Primitive(f"{op.name}_kernel")
    kernel.multiple_results = op.multiple_results
    kernel.def_impl(partial(dispatch.apply_primitive, kernel))
    kernel.def_abstract_eval(op.abstract_eval)
    mlir.register_lowering(kernel, _reference_lowering(op))
    if op.cpu_target is not None:
        mlir.register_lowering(kernel, _cpu_lowering(op), platform="cpu")
    if op.gpu_lowering is not None:
        for platform in GPU_PLATFORMS:
            mlir.register_lowering(kernel, _gpu_lowering(op, platform), platform=platform)
    return kernel


def _partitioned(op: Operation, per_shard: Callable) -> Callable:
    """``per_shard`` under ``custom_partitioning``: each shard runs the kernel on its slice,
    ids shifted into it, as ``op.sharding`` plans (``_sharding.plan``)."""
    partitioned = custom_partitioning(per_shard, static_argnums=(0,))

    def rule_for(shapes) -> ShardingRule:
        return op.sharding([tuple(s) for s in shapes])

    def plan_for(arg_shapes):
        """The kernel's operand and result shardings (see ``_sharding.plan``)."""
        rule = rule_for(a.shape for a in arg_shapes)
        return plan(rule, [a.sharding.spec for a in arg_shapes])

    def partition(params, mesh, arg_shapes, result_shape):
        if not all(isinstance(a.sharding, NamedSharding) for a in arg_shapes):
            return _replicated_partition(per_shard, params, mesh, arg_shapes, result_shape)
        sharded = plan_for(arg_shapes)
        arg_shardings = tuple(NamedSharding(mesh, spec) for spec in sharded.operands)
        results = [NamedSharding(mesh, spec) for spec in sharded.results]
        result_shardings = results if op.multiple_results else results[0]

        def lower(*args):
            return per_shard(params, *shift_ids(sharded.shifts, args))

        return mesh, lower, result_shardings, arg_shardings

    def infer(params, mesh, arg_shapes, result_shape):
        del params, result_shape
        results = [NamedSharding(mesh, spec) for spec in plan_for(arg_shapes).results]
        return results if op.multiple_results else results[0]

    def sharding_rule(params, mesh, value_types, result_types):
        del params, mesh, result_types
        rule = rule_for(t.shape for t in value_types)
        extra: dict[str, Any] = rule.shardy_sizes()
        if rule.replicated:
            extra["need_replication_factors"] = rule.need_replication()
        return rule.einsum(), extra

    partitioned.def_partition(
        partition=partition, infer_sharding_from_operands=infer, sharding_rule=sharding_rule
    )
    return partitioned


def _operation_primitive(op: Operation, per_shard: Callable, partitioned: Callable) -> Primitive:
    """The public primitive: abstract eval, batching, and a lowering through the partitioned
    kernel call."""
    operation = Primitive(op.name)
    operation.multiple_results = op.multiple_results
    operation.def_impl(partial(dispatch.apply_primitive, operation))
    operation.def_abstract_eval(op.abstract_eval)

    def lowering(ctx, *args, **params):
        # Inside a shard_map manual over only some mesh axes, custom_partitioning cannot
        # name the others: bind the kernel as it is, and XLA gives it whole operands there.
        run = per_shard if _partly_manual(ctx) else partitioned
        call = lambda *a: run(freeze(**params), *a)  # noqa: E731
        return mlir.lower_fun(call, multiple_results=op.multiple_results)(ctx, *args)

    mlir.register_lowering(operation, lowering)
    # custom_partitioning needs the device assignment while lowering, even for one device.
    dispatch.prim_requires_devices_during_lowering.add(operation)

    def batcher(args, dims, **params):
        return op.batching_rule(operation.bind, args, dims, **params)

    batching.primitive_batchers[operation] = batcher
    return operation
