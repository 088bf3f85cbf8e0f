"""The machinery every operation shares, after JAX's ``cudnn/scaled_matmul_stablehlo.py``.

Each operation is two primitives:

* the **operation primitive** (``mxfp4_index_scores``...), what user code binds: its abstract
  eval validates operands and options; its batching rule folds a vmapped axis into the
  kernel's own rows / requests / pages; it lowers through ``custom_partitioning`` so that a
  sharded call runs per shard, following a Shardy sharding rule;
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
from jax.experimental.custom_partitioning import custom_partitioning
from jax.extend.core import Primitive
from jax.interpreters import batching, mlir
from jax.sharding import NamedSharding, PartitionSpec

from jax_mxfp4.ffi_targets import register_cpu_targets

Params = tuple[tuple[str, Any], ...]


def freeze(**params: Any) -> Params:
    return tuple(sorted(params.items()))


@dataclasses.dataclass(frozen=True)
class ShardingRule:
    """Which operand and result dims may be sharded, in Shardy's einsum-like notation.

    ``operands`` / ``results``: one string of space-separated factors per array (a factor is a
    name, or ``(a b)`` for a dim made of two factors, the first the major one).
    ``replicated``: factors that must not be sharded (the kernel needs their whole extent).
    ``sizes``: sizes of factors that appear only inside compound dims.
    """

    operands: tuple[str, ...]
    results: tuple[str, ...]
    replicated: tuple[str, ...] = ()
    sizes: dict[str, int] = dataclasses.field(default_factory=dict)

    def einsum(self) -> str:
        return ", ".join(self.operands) + " -> " + ", ".join(self.results)


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


OPERATIONS: list[Operation] = []
"""Every operation :func:`define` has made, in definition order."""


def implementation(op: Operation, platform: str, backend: str) -> str:
    """What ``op`` lowers to on ``platform``: ``"ffi:<target>"`` or ``"reference"``."""
    if backend != "reference" and platform == "cpu" and op.cpu_target is not None:
        if op.cpu_target in register_cpu_targets():
            return f"ffi:{op.cpu_target}"
    return "reference"


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


def _result_specs(rule: ShardingRule, arg_specs: Sequence[PartitionSpec]) -> list[PartitionSpec]:
    """Each result dim takes the sharding of the first operand dim made of the same factors,
    or of the same leading factors (a result ``(h g d)`` follows an operand ``(h g)``)."""
    dim_spec: dict[tuple[str, ...], Any] = {}
    for dims, spec in zip(rule.operands, arg_specs, strict=True):
        for dim, axis in zip(_dims(dims), tuple(spec) + (None,) * len(_dims(dims)), strict=False):
            dim_spec.setdefault(_factors(dim), axis)

    def spec_of(dim: str) -> Any:
        names = _factors(dim)
        for length in range(len(names), 0, -1):
            if names[:length] in dim_spec:
                return dim_spec[names[:length]]
        return None

    return [PartitionSpec(*(spec_of(d) for d in _dims(dims))) for dims in rule.results]


def _factors(dim: str) -> tuple[str, ...]:
    return tuple(dim.strip("()").split())


def _dims(dims: str) -> list[str]:
    """``"t (h g) d"`` -> ``["t", "(h g)", "d"]``."""
    out, depth, word = [], 0, ""
    for ch in dims + " ":
        if ch == " " and depth == 0:
            if word:
                out.append(word)
            word = ""
            continue
        depth += (ch == "(") - (ch == ")")
        word += ch
    return out


def define(op: Operation) -> Primitive:
    """Create the operation and kernel primitives of ``op``; returns the operation primitive."""
    OPERATIONS.append(op)
    kernel = Primitive(f"{op.name}_kernel")
    kernel.multiple_results = op.multiple_results
    kernel.def_impl(partial(dispatch.apply_primitive, kernel))
    kernel.def_abstract_eval(op.abstract_eval)
    mlir.register_lowering(kernel, _reference_lowering(op))
    if op.cpu_target is not None:
        mlir.register_lowering(kernel, _cpu_lowering(op), platform="cpu")

    def per_shard(params: Params, *args):
        return kernel.bind(*args, **dict(params))

    partitioned = custom_partitioning(per_shard, static_argnums=(0,))

    def rule_for(shapes) -> ShardingRule:
        return op.sharding([tuple(s) for s in shapes])

    def partition(params, mesh, arg_shapes, result_shape):
        arg_shardings = tuple(a.sharding for a in arg_shapes)
        rule = rule_for(a.shape for a in arg_shapes)
        specs = _result_specs(rule, [s.spec for s in arg_shardings])
        results = [NamedSharding(mesh, spec) for spec in specs]
        result_shardings = results if op.multiple_results else results[0]
        return mesh, lambda *args: per_shard(params, *args), result_shardings, arg_shardings

    def infer(params, mesh, arg_shapes, result_shape):
        del params, result_shape
        rule = rule_for(a.shape for a in arg_shapes)
        specs = _result_specs(rule, [a.sharding.spec for a in arg_shapes])
        results = [NamedSharding(mesh, spec) for spec in specs]
        return results if op.multiple_results else results[0]

    def sharding_rule(params, mesh, value_types, result_types):
        del params, mesh, result_types
        rule = rule_for(t.shape for t in value_types)
        extra: dict[str, Any] = dict(rule.sizes)
        if rule.replicated:
            extra["need_replication_factors"] = rule.replicated
        return rule.einsum(), extra

    partitioned.def_partition(
        partition=partition, infer_sharding_from_operands=infer, sharding_rule=sharding_rule
    )

    operation = Primitive(op.name)
    operation.multiple_results = op.multiple_results
    operation.def_impl(partial(dispatch.apply_primitive, operation))
    operation.def_abstract_eval(op.abstract_eval)

    def lowering(ctx, *args, **params):
        call = lambda *a: partitioned(freeze(**params), *a)  # noqa: E731
        return mlir.lower_fun(call, multiple_results=op.multiple_results)(ctx, *args)

    mlir.register_lowering(operation, lowering)
    # custom_partitioning needs the device assignment while lowering, even for one device.
    dispatch.prim_requires_devices_during_lowering.add(operation)

    def batcher(args, dims, **params):
        return op.batching_rule(operation.bind, args, dims, **params)

    batching.primitive_batchers[operation] = batcher
    return operation
