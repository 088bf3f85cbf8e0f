"""Launch plans that more than one backend follows (one function each, so they cannot drift).

Plans come from static shapes only (SPEC §9: grids never depend on device values).
"""

from __future__ import annotations

PROGRAMS_PER_UNIT = 8
"""Split-K aims at about this many (row, split) programs per SM / CU: a program walks its
pages one after another, each waiting on its K and V loads, so a unit needs several."""
MIN_PAGES_PER_SPLIT = 2
"""A split takes at least this many pages (one page per split was slower from 16 rows on:
bench/RESULTS.md)."""


def attention_splits(num_rows: int, pages_per_row: int, units: int) -> int:
    """Split-K partitions per sparse-attention row (1: the direct, unsplit kernel), for the
    Triton and the FlyDSL kernels alike: doubled until there are about
    ``PROGRAMS_PER_UNIT * units`` (row, split) programs, keeping at least
    ``MIN_PAGES_PER_SPLIT`` pages per split; a power of two."""
    want = max(1, (PROGRAMS_PER_UNIT * units) // max(1, num_rows))
    splits = 1
    while splits * 2 <= min(want, pages_per_row // MIN_PAGES_PER_SPLIT):
        splits *= 2
    return splits


__all__ = ["MIN_PAGES_PER_SPLIT", "PROGRAMS_PER_UNIT", "attention_splits"]
