"""The command line's info and bench commands run and print their tables."""

from __future__ import annotations

import contextlib
import io

from jax_mxfp4.cli import main


def _run(*argv: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        assert main(list(argv)) == 0
    return out.getvalue()


def test_info_prints_one_row_per_operation():
    text = _run("info")
    for op in ("mxfp4_write_cache", "mxfp4_index_scores", "mxfp4_select_blocks",
               "mxfp4_sparse_attention"):
        assert op in text


def test_bench_quick_prints_kernel_and_reference_columns():
    text = _run("bench", "--quick", "--repeats", "2")
    lines = text.splitlines()
    assert lines[1].split()[:4] == ["operation", "shape", "size", "kernel"]
    rows = [line for line in lines[3:] if line.strip()]
    assert {row.split()[0] for row in rows} == {"write_cache", "index_scores", "select_blocks",
                                                 "sparse_attention"}
    assert all(row.rstrip().endswith("x") for row in rows)  # a speedup in every row
