"""The GPU write_cache (slot table + write pass) checked on the CPU by Triton's interpreter in
a process of its own (``interpreted_write_cache.py``): repeated slots keep their last row.
Mutation: an atomic min instead of max in ``claim_kernel`` fails it (no row wins), and so does
``_is_last`` returning every in-range row (the winner-rule check; the full-kernel check alone
passes that mutation, the interpreter running rows in order)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")


def test_interpreted_write_cache_keeps_the_last_writer():
    here = Path(__file__).parent
    env = {**os.environ, "TRITON_INTERPRET": "1",
           "PYTHONPATH": os.pathsep.join([str(here), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, str(here / "interpreted_write_cache.py")], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert done.stdout.split() == ["ok", "write_cache_repeated_slots",
                                   "ok", "write_cache_winner_rule"]
