"""The command line and the API say what is wrong in one plain line: no GPU for ``bench
--device gpu``, ``--repeats 0``, ``build`` without FlyDSL (and an honest summary when every
kernel came from a cache), help texts without reST markup, no carriage returns in logs, and
"must be static" for a traced static option."""

from __future__ import annotations

import contextlib
import io
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_mxfp4 as jm
from jax_mxfp4._src.core.progress import progress
from jax_mxfp4.cli import build_parser, main
from jax_mxfp4_tools import bench


def _run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(list(argv))
    return status, out.getvalue(), err.getvalue()


@pytest.mark.skipif(bench.gpu_unavailable_reason() is None, reason="a GPU is present")
def test_bench_on_a_gpu_without_one_is_one_line():
    status, out, err = _run("bench", "--device", "gpu")
    assert status == 2 and out == ""
    assert err.count("\n") == 1 and "JAX sees no GPU here" in err, err


@pytest.mark.parametrize("repeats", ["0", "-3", "two"])
def test_bench_repeats_below_one_is_refused(repeats):
    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as exit_info:
        main(["bench", "--repeats", repeats])
    assert exit_info.value.code == 2
    assert "--repeats" in err.getvalue() and ">= 1" in err.getvalue()


def test_help_texts_are_plain_words():
    parser = build_parser()
    texts = [parser.format_help()]
    for action in parser._subparsers._group_actions:
        texts += [sub.format_help() for sub in action.choices.values()]
    assert len(texts) == 6  # the top level, demo, info, bench, emulate, build
    for text in texts:
        for markup in ("``", ":func:", ":class:", ":mod:", ":meth:"):
            assert markup not in text, (markup, text)


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_redraws_only_on_a_terminal():
    log, terminal, quiet = io.StringIO(), _Terminal(), io.StringIO()
    for stream in (log, terminal):
        for done in range(3):
            progress(done, 2, f"cell {done}", what="bench", log_lines=True, stream=stream)
            progress(done, 2, f"cell {done}", stream=quiet)
    assert "\r" in terminal.getvalue()
    assert "\r" not in log.getvalue()
    assert log.getvalue().splitlines() == ["bench 1/2: cell 0", "bench 2/2: cell 1"]
    assert quiet.getvalue() == ""  # without log_lines, a log gets nothing


def test_build_without_flydsl_is_one_line(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "flydsl", None)  # as if the rocm extra were missing
    monkeypatch.setenv("JAX_MXFP4_CACHE_DIR", str(tmp_path / "empty-cache"))
    monkeypatch.delenv("JAX_MXFP4_KERNEL_DIR", raising=False)
    status, out, err = _run("build", "--arch", "gfx950", "--out", str(tmp_path / "out"))
    assert status == 1 and out == ""
    assert err.count("\n") == 1, err
    assert "FlyDSL is not installed" in err and "pip install 'jax_mxfp4[rocm]'" in err


def test_build_without_flydsl_from_a_warm_cache_says_so(built, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "flydsl", None)
    monkeypatch.setenv("JAX_MXFP4_KERNEL_DIR", str(built[0]))
    status, out, err = _run("build", "--arch", "gfx950", "--out", str(tmp_path))
    assert status == 0 and "\r" not in err
    assert f"{len(built[1])} kernels for gfx950" in out
    assert "FlyDSL is not installed, so nothing was compiled" in out


def test_traced_static_options_say_static():
    q = jnp.zeros((2, 1, 128), jnp.bfloat16)
    table, rows = jnp.zeros((1, 2), jnp.int32), jnp.zeros(2, jnp.int32)
    scores = jnp.zeros((1, 2, 2), jnp.float32)
    pool = jm.new_pool(2, num_heads=1)
    cases = {
        "num_blocks": lambda v: jm.index_scores(q, jm.new_pool(2), table, rows, rows,
                                                num_blocks=v, sm_scale=0.1),
        "sm_scale": lambda v: jm.sparse_attention(q, pool, pool, jnp.zeros((2, 1, 1), jnp.int32),
                                                  jnp.zeros((2, 1), jnp.int32), sm_scale=v),
        "topk": lambda v: jm.select_blocks(scores, table, rows, rows, topk=v),
    }
    for name, fn in cases.items():
        value = 0.1 if name == "sm_scale" else 2
        with pytest.raises(TypeError, match=f"{name} must be static"):
            jax.jit(fn)(np.asarray(value))
