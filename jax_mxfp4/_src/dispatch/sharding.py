"""How an operation runs on a sharded mesh with no communication.

An operation's :class:`ShardingRule` names the factors of each operand and result dim (Shardy's
einsum-like notation, which also drives Shardy's propagation). :func:`plan` turns the operand
shardings that XLA hands to ``custom_partitioning`` into the shardings the kernel runs with and
the result shardings that follow; :func:`shift_ids` makes global ids local inside each shard.

The one idea behind data parallelism here: **ids are global**. A block table, a page table, a
request id and a cache slot mean the same thing sharded or not, so a sharded program computes
exactly what the single-device program does. When the dim an id points into (pages, requests)
is sharded, each shard holds a contiguous range of it and sees the ids shifted into its range;
an id that another shard holds lands outside the range and is read as nothing / not written
(SPEC §2.3). A row must therefore live on the shard that holds the requests and pages it
reads: the caller's contract (a data-parallel page allocator gives each shard its own pages;
a ``vmap``-ped problem axis gives it by construction, see ``batching.offset_ids``).

Any operand sharding the kernel cannot honour without another shard's data is dropped from
the plan (that dim replicated), so XLA gathers the operand rather than the kernel computing a
wrong answer: the plan is always correct, and communication-free where the layout allows.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

Axes = tuple[str, ...]  # mesh axes one dim is sharded over, major first; () = replicated


@dataclasses.dataclass(frozen=True)
class Ids:
    """Operand ``operand`` holds global ids into the dim of factor ``target``, ``unit`` ids
    per entry of that dim (a cache slot: 128 per page).

    ``write``: the ids address writes, which a shard may skip, so a row may also sit on every
    shard (rows replicated); a read needs its row on the one shard that holds its data.
    """

    operand: int
    target: str
    unit: int = 1
    write: bool = False


@dataclasses.dataclass(frozen=True)
class ShardingRule:
    """Which operand and result dims may be sharded, in Shardy's einsum-like notation.

    ``operands`` / ``results``: one string of space-separated factors per array (a factor is a
    name, or ``(a b)`` for a dim made of two factors, the first the major one; such a dim is
    sharded as its first factor).
    ``replicated``: factors that must not be sharded (the kernel needs their whole extent).
    ``sizes``: sizes of factors that appear only inside compound dims.
    ``ids``: operands holding global ids into other operands' dims (see :class:`Ids`); they
    belong to the rows of factor ``rows``.
    """

    operands: tuple[str, ...]
    results: tuple[str, ...]
    replicated: tuple[str, ...] = ()
    sizes: dict[str, int] = dataclasses.field(default_factory=dict)
    ids: tuple[Ids, ...] = ()
    rows: str = "t"

    def einsum(self) -> str:
        return ", ".join(self.operands) + " -> " + ", ".join(self.results)

    def need_replication(self) -> tuple[str, ...]:
        """The ``replicated`` factors the rule uses, in order of first appearance (Shardy's)."""
        order = re.findall(r"[A-Za-z_]\w*", self.einsum())
        return tuple(sorted(set(self.replicated) & set(order), key=order.index))

    def shardy_sizes(self) -> dict[str, int]:
        """``sizes`` of the factors the rule uses that no dim is made of alone (Shardy wants
        exactly those)."""
        dims = [d for arrays in (self.operands, self.results) for a in arrays for d in _dims(a)]
        whole = {_factors(d)[0] for d in dims if len(_factors(d)) == 1}
        inner = {f for d in dims for f in _factors(d)} - whole
        return {f: n for f, n in self.sizes.items() if f in inner}


def compound(*factors: tuple[str, int]) -> str:
    """A dim made of ``(name, size)`` factors, major first, as rule notation: ``"(h g)"``.
    Factors of size 1 are left out (Shardy refuses them inside a compound dim); if all are,
    the dim is the first factor alone."""
    names = [name for name, size in factors if size != 1] or [factors[0][0]]
    return names[0] if len(names) == 1 else "(" + " ".join(names) + ")"


@dataclasses.dataclass(frozen=True)
class Shift:
    """Inside a shard: subtract ``axis_index(axes) * local size of dim`` ``extent`` (operand,
    dim) ``* unit`` from the non-negative ids of operand ``operand``."""

    operand: int
    axes: Axes
    extent: tuple[int, int]
    unit: int


@dataclasses.dataclass(frozen=True)
class Plan:
    """The operand shardings a kernel runs with, its result shardings, and its id shifts."""

    operands: list[PartitionSpec]
    results: list[PartitionSpec]
    shifts: list[Shift]


def plan(rule: ShardingRule, arg_specs: Sequence[PartitionSpec]) -> Plan:
    """The communication-free plan closest to the operands' shardings ``arg_specs``."""
    axes = _factor_axes(rule, arg_specs)
    _keep_rows_with_their_data(rule, axes)
    shifts = []
    for link in rule.ids:
        if axes.get(link.target, ()):
            extent = _plain_dim(rule, link.target)
            shifts.append(Shift(link.operand, axes[link.target], extent, link.unit))
    return Plan(
        operands=[_spec(dims, axes) for dims in rule.operands],
        results=[_spec(dims, axes) for dims in rule.results],
        shifts=shifts,
    )


def shift_ids(shifts: Sequence[Shift], args: Sequence[jax.Array]) -> list[jax.Array]:
    """``args`` of one shard with global ids made local (call inside the per-shard function,
    where the mesh axes are bound)."""
    args = list(args)
    for shift in shifts:
        ids = args[shift.operand]
        local = args[shift.extent[0]].shape[shift.extent[1]] * shift.unit
        offset = (jax.lax.axis_index(shift.axes) * local).astype(ids.dtype)
        args[shift.operand] = jnp.where(ids < 0, ids, ids - offset)
    return args


def _factor_axes(rule: ShardingRule, arg_specs: Sequence[PartitionSpec]) -> dict[str, Axes]:
    """Each factor's mesh axes: those of the first operand dim made of it alone (else the
    first compound dim it leads); factors the kernel needs whole are replicated."""
    plain: dict[str, Axes] = {}
    leading: dict[str, Axes] = {}
    for dims, spec in zip(rule.operands, arg_specs, strict=True):
        parts = _dims(dims)
        entries = tuple(spec) + (None,) * (len(parts) - len(spec))
        for dim, entry in zip(parts, entries, strict=False):
            names = _factors(dim)
            (plain if len(names) == 1 else leading).setdefault(names[0], _axes(entry))
    axes = {**leading, **plain}
    for factor in rule.replicated:
        axes[factor] = ()
    return axes


def _keep_rows_with_their_data(rule: ShardingRule, axes: dict[str, Axes]) -> None:
    """In place: a dim that ids point into is sharded like the rows or not at all, except
    that written-to dims may be sharded however they are when the rows are everywhere."""
    for link in rule.ids:
        rows, target = axes.get(rule.rows, ()), axes.get(link.target, ())
        if target in ((), rows):
            continue
        if link.write:
            axes[rule.rows] = ()  # every shard sees every row and skips the others' slots
        else:
            axes[link.target] = ()  # every shard holds all of what any row reads


def _plain_dim(rule: ShardingRule, factor: str) -> tuple[int, int]:
    """(operand, dim) of the first operand dim made of ``factor`` alone."""
    for i, dims in enumerate(rule.operands):
        for d, dim in enumerate(_dims(dims)):
            if _factors(dim) == (factor,):
                return i, d
    raise ValueError(f"ids point into factor {factor!r}, which no operand dim is made of")


def _axes(entry: Any) -> Axes:
    if entry is None:
        return ()
    return (entry,) if isinstance(entry, str) else tuple(entry)


def _entry(axes: Axes) -> Any:
    if not axes:
        return None
    return axes[0] if len(axes) == 1 else axes


def _spec(dims: str, axes: dict[str, Axes]) -> PartitionSpec:
    """The spec of an array of ``dims``: each dim sharded as its (first) factor."""
    return PartitionSpec(*(_entry(axes.get(_factors(d)[0], ())) for d in _dims(dims)))


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
