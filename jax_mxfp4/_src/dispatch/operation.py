"""The machinery every operation shares, after JAX's ``cudnn/scaled_matmul_stablehlo.py``.

Each operation is two primitives:

* the **operation primitive** (``mxfp4_index_scores``...), what user code binds: its abstract
  eval validates operands and options; its batching rule folds a vmapped axis into the
  kernel's own rows / requests / pages; it lowers through ``custom_partitioning`` so that a
  sharded call runs per shard, following a Shardy sharding rule (``sharding``: global ids,
  made local per shard, so that data-parallel shards need no communication);
* the **kernel primitive** (``mxfp4_index_scores_kernel``), bound per shard on local shapes.
  Its lowering rule resolves the backend's :class:`~jax_mxfp4._src.core.targets.Target` for the
  platform being lowered and takes the first of the operation's
  :class:`~jax_mxfp4._src.dispatch.lowering.Lowering` objects that covers the call
  (``jax_mxfp4._src.dispatch.lowering.choose``); under ``backend="reference"`` it lowers the
  reference ``jax.numpy`` implementation instead.

Both primitives carry the operation's static options and ``config``, the
:class:`~jax_mxfp4._src.dispatch.backend.LoweringConfig` the call was bound under (optional when
binding by hand: the current one is taken). Static options travel as one hashable, sorted tuple of
``(name, value)`` pairs, so that ``custom_partitioning`` can take them as a single static argument.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from jax._src import dispatch
from jax._src.sharding_impls import GSPMDSharding, SPMDAxisContext
from jax.experimental.custom_partitioning import custom_partitioning
from jax.extend.core import Primitive
from jax.interpreters import batching, mlir
from jax.sharding import NamedSharding

from jax_mxfp4._src.core import validate
from jax_mxfp4._src.core.targets import CPU, PLATFORMS, Target
from jax_mxfp4._src.dispatch import backend as backends
from jax_mxfp4._src.dispatch.backend import LoweringConfig, current_config
from jax_mxfp4._src.dispatch.lowering import (
    Call,
    Choice,
    Lowering,
    NoLoweringError,
    choose,
    no_lowering_message,
)
from jax_mxfp4._src.dispatch.sharding import ShardingRule, plan, shift_ids

Params = tuple[tuple[str, Any], ...]


def freeze(**params: Any) -> Params:
    return tuple(sorted(params.items()))


@dataclasses.dataclass(frozen=True)
class Operation:
    """An operation's definition; :func:`define` turns it into its two primitives."""

    name: str
    abstract_eval: Callable  # (*avals, **options) -> aval | list of avals
    batching_rule: Callable  # (bind, args, dims, **params) -> (outs, out_dims)
    reference: Callable  # (*arrays, **options) -> array | tuple of arrays
    sharding: Callable[[Sequence[tuple[int, ...]]], ShardingRule]  # operand shapes -> rule
    lowerings: tuple[Lowering, ...]  # tried in order; the first covering a call lowers it
    multiple_results: bool = False
    operands: tuple[str, ...] = ()  # the operands' names, for errors that name one

    def __post_init__(self) -> None:
        named = tuple(lowering.for_operation(self.name) for lowering in self.lowerings)
        object.__setattr__(self, "lowerings", named)

    def operand_names(self, count: int) -> tuple[str, ...]:
        return self.operands if len(self.operands) == count else tuple(
            f"operand {i}" for i in range(count))


OPERATIONS: list[Operation] = []
"""Every operation :func:`define` has made, in definition order."""
OPERATION_OF_PRIMITIVE: dict[Primitive, Operation] = {}
"""The operation behind each operation primitive (what ``explain`` finds in a jaxpr)."""


def split_config(params: dict) -> tuple[LoweringConfig, dict]:
    """The call's lowering config (the current one if it was bound without) and its options."""
    options = dict(params)
    config = options.pop("config", None) or current_config()
    return config, options


def call_of(op: Operation, platform: str, avals_in, avals_out, params: dict,
            ctx=None) -> Call | None:
    """The :class:`Call` a kernel primitive with these avals and params makes when lowered for
    ``platform``; ``None`` under the reference backend. Raises ``NotImplementedError`` where
    the backend cannot lower on ``platform``."""
    config, options = split_config(params)
    chosen = backends.backend(config.backend)
    if chosen.target is None:
        return None
    target: Target = chosen.target(platform, ctx, config)
    return Call(op.name, target, tuple(avals_in), tuple(avals_out), options, config)


def choice_for(op: Operation, call: Call) -> Choice:
    """Which of ``op``'s lowerings lowers ``call`` (what ``explain`` and ``info`` print)."""
    return choose(op.lowerings, call)


def _reference_rule(op: Operation) -> Callable:
    def rule(ctx, *args, **params):
        _, options = split_config(params)
        return mlir.lower_fun(partial(op.reference, **options), op.multiple_results)(ctx, *args)

    return rule


def _platform_rule(op: Operation, platform: str | None) -> Callable:
    """The kernel primitive's lowering on ``platform`` (``None``: whichever the context
    lowers for): the backend's first covering lowering, or the reference lowering under
    ``backend="reference"``; an error naming every reason when no lowering covers the call
    (nothing falls back silently). Code objects need every size when lowered: an operand with
    a symbolic dimension (``jax.export``) is a ``ValueError`` naming it, before any kernel
    module plans a launch from the shapes."""
    reference_rule = _reference_rule(op)

    def rule(ctx, *args, **params):
        where = platform or ctx.module_context.platforms[0]
        call = call_of(op, where, ctx.avals_in, ctx.avals_out, params, ctx)
        if call is None:
            return reference_rule(ctx, *args, **params)
        if call.target.device != CPU:  # code objects, launched on grids sized from the shapes
            names = op.operand_names(len(ctx.avals_in))
            where = f"backend {call.config.backend!r} on {call.target.describe()}"
            validate.static_shapes(zip(names, ctx.avals_in, strict=True), where)
        choice = choice_for(op, call)
        if choice.lowering is None:
            raise NoLoweringError(no_lowering_message(call, choice))
        return choice.lowering.lower(ctx, call, *args)

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


def check_static_shapes(names: tuple[str, ...], operands) -> None:
    """Trace time: ``validate.static_shapes`` of ``operands`` (called ``names``) where the
    current backend needs static shapes (``Backend.static_shapes``: the emulated ROCm
    backends); for the others, the platform a call is lowered for decides
    (:func:`_platform_rule`)."""
    name = backends.get_backend()
    if backends.backend(name).static_shapes:
        validate.static_shapes(zip(names, operands, strict=True), f"backend {name!r}")


def define(op: Operation) -> Primitive:
    """Create the operation and kernel primitives of ``op``; returns the operation primitive."""
    OPERATIONS.append(op)
    kernel = _kernel_primitive(op)

    def per_shard(params: Params, *args):
        return kernel.bind(*args, **dict(params))

    primitive = _operation_primitive(op, per_shard, _partitioned(op, per_shard))
    OPERATION_OF_PRIMITIVE[primitive] = op
    return primitive


def _abstract_eval(op: Operation) -> Callable:
    def abstract_eval(*avals, **params):
        return op.abstract_eval(*avals, **split_config(params)[1])

    return abstract_eval


def _kernel_primitive(op: Operation) -> Primitive:
    """The primitive that lowers to one backend's kernel (or the reference) on local shapes."""
    kernel = Primitive(f"{op.name}_kernel")
    kernel.multiple_results = op.multiple_results
    kernel.def_impl(partial(dispatch.apply_primitive, kernel))
    kernel.def_abstract_eval(_abstract_eval(op))
    mlir.register_lowering(kernel, _platform_rule(op, None))
    for platform in PLATFORMS:
        mlir.register_lowering(kernel, _platform_rule(op, platform), platform=platform)
    return kernel


def _partitioned(op: Operation, per_shard: Callable) -> Callable:
    """``per_shard`` under ``custom_partitioning``: each shard runs the kernel on its slice,
    ids shifted into it, as ``op.sharding`` plans (``sharding.plan``)."""
    partitioned = custom_partitioning(per_shard, static_argnums=(0,))

    def rule_for(shapes) -> ShardingRule:
        return op.sharding([tuple(s) for s in shapes])

    def plan_for(arg_shapes):
        """The kernel's operand and result shardings (see ``sharding.plan``)."""
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
    operation.def_abstract_eval(_abstract_eval(op))

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
