"""``jm.check_metadata``: find the metadata that the operations silently mask, clip or skip.

The operations never let bad metadata touch memory (SPEC §2.3): a page id outside the pool
reads as a page with no live tokens, a context longer than ``num_blocks`` or the page table
covers is clipped, a slot past the pool is not written, and duplicate slots keep the last row
(SPEC §3.1). That is the right rule for kernels, and a trap when a model feeds them wrong
metadata: nothing fails, the answer is just quietly different. ``check_metadata`` reports each
such case with its row and value::

    jm.check_metadata(num_pages=index_pool.shape[0], block_table=block_table,
                      positions=positions, requests=requests, num_blocks=num_blocks)
    jm.check_metadata(num_pages=k_pool.shape[0], slots=slots)
    jm.check_metadata(num_pages=k_pool.shape[0], page_table=sel.page_table,
                      context_lens=sel.context_lens)

Called on concrete arrays it raises :class:`MetadataError` at once. Called inside ``jax.jit``
(or ``vmap``, ``scan``) it adds a host callback that runs the same checks on the values when
the function runs and fails the call with the same message (a ``JaxRuntimeError`` holding it).
It is a debugging aid: nothing calls it for you, so it costs nothing unless called; under
``jit`` it copies the metadata to the host on every call.
"""

from __future__ import annotations

import functools

import jax
import numpy as np

from jax_mxfp4._src.core.formats import PAGE_TOKENS

SHOWN_PER_KIND = 5
"""Occurrences listed per kind of problem (the message gives the total count)."""


class MetadataError(ValueError):
    """Metadata that an operation would silently mask, clip or skip."""


def _report(kind: str, lines: list[str], total: int) -> str:
    more = f" (and {total - len(lines)} more)" if total > len(lines) else ""
    return f"{kind}: {total} case(s){more}\n" + "\n".join(f"    {line}" for line in lines)


def _first(mask: np.ndarray) -> tuple[list[tuple[int, ...]], int]:
    where = np.argwhere(mask)
    return [tuple(int(i) for i in w) for w in where[:SHOWN_PER_KIND]], len(where)


def row_problems(num_pages: int | None, block_table, positions, requests,
                 num_blocks: int | None) -> list[str]:
    """Problems of query rows ``(positions, requests)`` reading ``block_table`` (SPEC §2.2)."""
    table, pos, req = (np.asarray(a).astype(np.int64) for a in (block_table, positions, requests))
    num_requests, width = table.shape
    live = pos >= 0  # position -1: a padding row (SPEC §2.5)
    out = []
    bad_req = live & ((req < 0) | (req >= num_requests))
    if bad_req.any():
        rows, total = _first(bad_req)
        out.append(_report(f"requests outside [0, {num_requests}) (the row reads nothing)",
                           [f"row {r}: requests[{r}] = {req[r]}" for (r,) in rows], total))
    live &= ~bad_req
    for bound, why in ((width, f"block_table has {width} columns"),
                       (num_blocks, f"num_blocks = {num_blocks}")):
        if bound is None:
            continue
        beyond = live & (pos >= bound * PAGE_TOKENS)
        if beyond.any():
            rows, total = _first(beyond)
            out.append(_report(
                f"positions beyond the request's blocks ({why}: the context is cut at "
                f"{bound * PAGE_TOKENS} tokens)",
                [f"row {r}: request {req[r]}, position {pos[r]} (block {pos[r] // PAGE_TOKENS})"
                 for (r,) in rows], total))
    if num_pages is not None:
        scored = width if num_blocks is None else min(width, num_blocks)
        blocks = np.arange(scored)
        reached = live[:, None] & (blocks[None, :] <= pos[:, None] // PAGE_TOKENS)
        ids = table[np.clip(req, 0, num_requests - 1)][:, :scored]
        bad_id = reached & ((ids < 0) | (ids >= num_pages))
        if bad_id.any():
            cells, total = _first(bad_id)
            out.append(_report(
                f"page ids outside the pool [0, {num_pages}) (read as pages with no live token)",
                [f"row {r} (request {req[r]}, position {pos[r]}): block_table[{req[r]}, {j}] = "
                 f"{ids[r, j]}" for r, j in cells], total))
    return out


def slot_problems(num_pages: int, slots) -> list[str]:
    """Problems of the slots of one ``write_cache`` (SPEC §2.3, §3.1)."""
    slots = np.asarray(slots).astype(np.int64)
    out = []
    past = slots >= num_pages * PAGE_TOKENS
    if past.any():
        rows, total = _first(past)
        out.append(_report(f"slots past the pool ({num_pages} pages = "
                           f"{num_pages * PAGE_TOKENS} slots; the row is not written)",
                           [f"row {r}: slots[{r}] = {slots[r]}" for (r,) in rows], total))
    written = np.flatnonzero((slots >= 0) & ~past)
    values, counts = np.unique(slots[written], return_counts=True)
    dup = counts > 1
    if dup.any():
        lines = []
        for value in values[dup][:SHOWN_PER_KIND]:
            rows = written[slots[written] == value]
            lines.append(f"slot {value} (page {value // PAGE_TOKENS}, offset "
                         f"{value % PAGE_TOKENS}): rows {rows.tolist()}")
        out.append(_report("duplicate slots (the last row wins)", lines, int(dup.sum())))
    return out


def attention_problems(num_pages: int | None, page_table, context_lens) -> list[str]:
    """Problems of a sparse-attention page table (SPEC §7, §2.3)."""
    table, ctx = np.asarray(page_table).astype(np.int64), np.asarray(context_lens).astype(np.int64)
    covered = table.shape[-1] * PAGE_TOKENS
    out = []
    negative = ctx < 0
    if negative.any():
        cells, total = _first(negative)
        out.append(_report("negative context_lens (read as 0)",
                           [f"context_lens[{t}, {h}] = {ctx[t, h]}" for t, h in cells], total))
    longer = ctx > covered
    if longer.any():
        cells, total = _first(longer)
        out.append(_report(
            f"contexts longer than the page table covers ({table.shape[-1]} pages = "
            f"{covered} tokens: clipped)",
            [f"row {t}, kv head {h}: context_lens = {ctx[t, h]}" for t, h in cells], total))
    if num_pages is not None:
        used = -(-np.clip(ctx, 0, covered) // PAGE_TOKENS)
        reached = np.arange(table.shape[-1])[None, None, :] < used[..., None]
        bad = reached & ((table < 0) | (table >= num_pages))
        if bad.any():
            cells, total = _first(bad)
            out.append(_report(
                f"page ids outside the pool [0, {num_pages}) (their tokens are masked)",
                [f"row {t}, kv head {h}: page_table[{t}, {h}, {i}] = {table[t, h, i]}"
                 for t, h, i in cells], total))
    return out


def _raise_if_any(problems: list[str]) -> None:
    if problems:
        raise MetadataError("jax_mxfp4 metadata check failed:\n" + "\n".join(problems))


def _host_check(statics: tuple, names: tuple[str, ...], *arrays) -> None:
    num_pages, num_blocks = statics
    given = dict(zip(names, arrays, strict=True))
    problems = []
    if "positions" in given:
        problems += row_problems(num_pages, given["block_table"], given["positions"],
                                 given["requests"], num_blocks)
    if "slots" in given:
        problems += slot_problems(num_pages, given["slots"])
    if "page_table" in given:
        problems += attention_problems(num_pages, given["page_table"], given["context_lens"])
    _raise_if_any(problems)


def _check_arguments(num_pages, given: dict) -> None:
    pairs = (("positions", "requests"), ("requests", "block_table"), ("page_table",
                                                                        "context_lens"))
    for a, b in pairs:
        if (a in given) != (b in given):
            raise ValueError(f"check_metadata: {a} and {b} must be given together")
    if "block_table" in given and "positions" not in given:
        raise ValueError("check_metadata: block_table is checked through the rows that read "
                         "it: give positions and requests too")
    if "slots" in given and num_pages is None:
        raise ValueError("check_metadata: slots need num_pages (the pool's first axis)")
    for name, ndim in (("block_table", 2), ("positions", 1), ("requests", 1), ("slots", 1),
                       ("page_table", 3), ("context_lens", 2)):
        if name not in given:
            continue
        value = given[name]
        dtype = value.dtype if hasattr(value, "dtype") else np.asarray(value).dtype
        if np.ndim(value) != ndim or not np.issubdtype(dtype, np.integer):
            raise TypeError(f"check_metadata: {name} must be a {ndim}-D integer array, got "
                            f"{dtype}{list(np.shape(value))}")


def check_metadata(*, num_pages: int | None = None, block_table=None, positions=None,
                   requests=None, num_blocks: int | None = None, slots=None, page_table=None,
                   context_lens=None) -> None:
    """Report metadata that the operations would silently mask, clip or skip.

    Every argument is optional; give the groups you want checked:

    * ``block_table int[B, W]``, ``positions int[T]``, ``requests int[T]`` (and optionally the
      static ``num_blocks`` of ``index_scores``): requests outside ``[0, B)``; positions whose
      block lies past ``W`` columns or past ``num_blocks`` (the row's context is cut); page ids
      a row reaches that lie outside ``[0, num_pages)``.
    * ``slots int[T]`` (needs ``num_pages``): slots past the pool (not written) and slots
      written by more than one row (the last row wins). Negative slots mean "skip" and are fine.
    * ``page_table int[T, Hkv, n]``, ``context_lens int[T, Hkv]``: negative contexts, contexts
      longer than ``n * 128`` (clipped) and page ids within a row's context outside
      ``[0, num_pages)``.

    ``num_pages`` is the first axis of the pool the ids index (static). Raises
    :class:`MetadataError` listing each problem with its row and value; under ``jit`` the
    check runs when the function runs and the call fails with that message.
    """
    given = {name: value for name, value in (
        ("block_table", block_table), ("positions", positions), ("requests", requests),
        ("slots", slots), ("page_table", page_table), ("context_lens", context_lens))
        if value is not None}
    _check_arguments(num_pages, given)
    statics = (None if num_pages is None else int(num_pages),
               None if num_blocks is None else int(num_blocks))
    names, arrays = tuple(given), tuple(given.values())
    if any(isinstance(a, jax.core.Tracer) for a in arrays):
        jax.debug.callback(functools.partial(_host_check, statics, names), *arrays)
        return
    _host_check(statics, names, *(np.asarray(a) for a in arrays))


__all__ = ["MetadataError", "check_metadata"]
