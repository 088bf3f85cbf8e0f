"""Launch plans that more than one backend follows (one function each, so they cannot drift).

Plans come from static shapes only (SPEC §9: grids never depend on device values), and a
row's arithmetic never depends on them (SPEC §9.1: the same bits whatever the batch).
"""

from __future__ import annotations

from typing import NamedTuple

PAGES_PER_SPLIT = 2
"""Split-K partition size of sparse attention on gfx950, in pages: partition ``k`` of every
row is its pages ``[2k, 2k + 2)``. A constant, so a row's partitions - and so its bits -
depend only on its own context, never on how many rows share the call, the grid or the
device; the merge adds empty partitions as exact zeros. Two pages also keep ``ceil(n /
ceil(n / 2)) == 2`` for every page-table width ``n``, which is how the gfx950 split kernel
sizes its partitions."""

TRITON_PAGES_PER_SPLIT = 1
"""The same for the Triton kernels (CUDA, and Triton on other GPUs): one page a split, so a
short call's critical path is one page's arithmetic, not two (bench/history/2026-12-03.md,
seventeenth session, "What landed"). A backend's bits need be the same whatever the batch, not
the same as another backend's, so the two constants may differ; each is one number, never a
function of the grid."""


def attention_splits(pages_per_row: int, pages_per_split: int) -> int:
    """Split-K partitions per sparse-attention row for a page table ``pages_per_row`` wide
    (1: the direct, unsplit kernel) at ``pages_per_split`` pages a partition, which each
    backend passes: :data:`PAGES_PER_SPLIT` (FlyDSL), :data:`TRITON_PAGES_PER_SPLIT`
    (Triton). No default, so no caller takes another backend's plan by leaving it out."""
    return max(1, -(-pages_per_row // pages_per_split))


class AttentionRows(NamedTuple):
    """How every sparse-attention kernel sees a call: one row per (query row, kv head)."""

    rows: int  # R = T * Hkv
    group: int  # G: q heads per kv head
    pages_per_row: int  # n: the page table's width
    kv_heads: int  # Hkv


def attention_rows(avals_in) -> AttentionRows:
    """:class:`AttentionRows` of a ``sparse_attention`` call from its operands' avals
    (``q [T, Hq, 128]``, ``k_pool [P, Hkv, 8704]``, ``v_pool``, ``page_table [T, Hkv, n]``,
    ``context_lens``)."""
    q_aval, k_aval, _, pages_aval, _ = avals_in
    kv_heads = k_aval.shape[1]
    return AttentionRows(q_aval.shape[0] * kv_heads, q_aval.shape[1] // kv_heads,
                         pages_aval.shape[-1], kv_heads)


__all__ = ["PAGES_PER_SPLIT", "TRITON_PAGES_PER_SPLIT", "AttentionRows", "attention_rows",
           "attention_splits"]
