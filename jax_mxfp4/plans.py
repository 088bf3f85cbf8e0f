"""Launch plans that more than one backend follows (one function each, so they cannot drift).

Plans come from static shapes only (SPEC §9: grids never depend on device values), and a
row's arithmetic never depends on them (SPEC §15.15: the same bits whatever the batch).
"""

from __future__ import annotations

PAGES_PER_SPLIT = 2
"""Split-K partition size of sparse attention on gfx950, in pages: partition ``k`` of every
row is its pages ``[2k, 2k + 2)``. A constant, so a row's partitions - and so its bits -
depend only on its own context, never on how many rows share the call, the grid or the
device; the merge adds empty partitions as exact zeros. Two pages also keep ``ceil(n /
ceil(n / 2)) == 2`` for every page-table width ``n``, which is how the gfx950 split kernel
sizes its partitions."""

TRITON_PAGES_PER_SPLIT = 1
"""The same for the Triton kernels (CUDA, and Triton on other GPUs): one page a split, so a
short call's critical path is one page's arithmetic, not two (bench/RESULTS.md, seventeenth
session). A backend's bits need be the same whatever the batch, not the same as another
backend's, so the two constants may differ; each is one number, never a function of the
grid."""


def attention_splits(pages_per_row: int, pages_per_split: int) -> int:
    """Split-K partitions per sparse-attention row for a page table ``pages_per_row`` wide
    (1: the direct, unsplit kernel) at ``pages_per_split`` pages a partition, which each
    backend passes: :data:`PAGES_PER_SPLIT` (FlyDSL), :data:`TRITON_PAGES_PER_SPLIT`
    (Triton). No default, so no caller takes another backend's plan by leaving it out."""
    return max(1, -(-pages_per_row // pages_per_split))


__all__ = ["PAGES_PER_SPLIT", "TRITON_PAGES_PER_SPLIT", "attention_splits"]
