"""Aligned plain-text tables, as the command line prints them (``info``, ``bench``, ``demo``)."""

from __future__ import annotations

from collections.abc import Collection, Sequence


def format_table(
    header: Sequence[str], rows: Sequence[Sequence[str]], right_aligned: Collection[int] = ()
) -> str:
    """The header, a dashed rule under it, then one line per row.

    Every row has one cell per header cell. Columns are as wide as their widest cell and two
    spaces apart; the columns whose indices are in ``right_aligned`` are right-aligned, the others
    left-aligned. Lines carry no trailing spaces.
    """
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            cell.rjust(width) if i in right_aligned else cell.ljust(width)
            for i, (cell, width) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    rule = ["-" * width for width in widths]
    return "\n".join([line(header), line(rule), *(line(row) for row in rows)])
