"""Launch plans that more than one backend follows (one function each, so they cannot drift).

Plans come from static shapes only (SPEC §9: grids never depend on device values), and a
row's arithmetic never depends on them (SPEC §15.15: the same bits whatever the batch).
"""

from __future__ import annotations

PAGES_PER_SPLIT = 2
"""Split-K partition size of sparse attention, in pages: partition ``k`` of every row is its
pages ``[2k, 2k + 2)``. A constant, so a row's partitions - and so its bits - depend only on
its own context, never on how many rows share the call, the grid or the device; the merge
adds empty partitions as exact zeros. Two pages also keep ``ceil(n / ceil(n / 2)) == 2`` for
every page-table width ``n``, which is how the gfx950 split kernel sizes its partitions."""


def attention_splits(pages_per_row: int) -> int:
    """Split-K partitions per sparse-attention row for a page table ``pages_per_row`` wide
    (1: the direct, unsplit kernel), for the Triton and the FlyDSL kernels alike."""
    return max(1, -(-pages_per_row // PAGES_PER_SPLIT))


__all__ = ["PAGES_PER_SPLIT", "attention_splits"]
