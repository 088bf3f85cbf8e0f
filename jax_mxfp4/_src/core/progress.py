"""Progress of long work (a build, a benchmark): a bar redrawn in place on a terminal; elsewhere
(a file, a pipe) nothing, or one plain line per step where a log should show the steps, so that
logs hold no carriage returns."""

from __future__ import annotations

import sys

BAR_WIDTH = 24
TEXT_WIDTH = 48


def progress(done: int, total: int, text: str, *, what: str = "step", log_lines: bool = False,
             stream=None) -> None:
    """Report that ``done`` of ``total`` steps are finished and ``text`` is the one under way
    (``done == total``: finished). ``log_lines``: a stream that is not a terminal gets one line
    per step, ``what`` naming the step; otherwise it gets nothing."""
    stream = stream or sys.stderr
    if not stream.isatty():
        if log_lines and done < total:
            stream.write(f"{what} {done + 1}/{total}: {text}\n")
        return
    filled = BAR_WIDTH * done // max(total, 1)
    bar = "#" * filled + "-" * (BAR_WIDTH - filled)
    stream.write(f"\r[{bar}] {done}/{total} {text:<{TEXT_WIDTH}.{TEXT_WIDTH}}")
    if done == total:
        stream.write("\n")
    stream.flush()


__all__ = ["progress"]
