"""``python -m jax_mxfp4 demo``: the demo's main function, in process, at small sizes.

One run (module fixture) serves every check: a request longer than 2048 tokens (so some rows are
genuinely sparse), a short one, chunked prefill over three steps, two decode steps.
"""

from __future__ import annotations

import contextlib
import io
import re

import pytest

from jax_mxfp4 import cli
from jax_mxfp4_tools import demo

ARGV = [
    "--prefill-lens", "2200,300", "--decode-steps", "2", "--prefill-chunk", "1024",
    "--hidden", "128", "--eval-rows", "24", "--seed", "1",
]


@pytest.fixture(scope="module")
def report() -> str:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = demo.main(ARGV)
    assert status == 0, err.getvalue()
    assert "prefill step 3/3" in err.getvalue()  # progress goes to stderr
    return out.getvalue()


def _rows(report: str) -> dict[str, list[str]]:
    """Table rows of ``report`` (columns are 2+ spaces apart) by their first cell."""
    return {cells[0]: cells for cells in (re.split(r"\s{2,}", ln.strip()) for ln in
                                          report.splitlines())}


def _accuracy(report: str) -> dict[tuple[str, str], dict[str, tuple[float, float]]]:
    """Section 2 as {(phase, context): {column: (relative L2, cosine)}}."""
    section = report.split("2. Accuracy")[1].split("\n3. ")[0]
    lines = section.splitlines()
    header = re.split(r"\s{2,}", lines[1].strip())
    table = {}
    for line in lines[3:]:
        cells = re.split(r"\s{2,}", line.strip())
        if cells[0] not in ("prefill", "decode"):
            break
        values = {}
        for title, cell in zip(header[3:-1], cells[3:-1], strict=True):
            rel, cos = (float(v) for v in cell.split(" / "))
            values[title] = (rel, cos)
        values["worst cos"] = (float("nan"), float(cells[-1]))
        values["rows"] = (int(cells[2]), float("nan"))
        table[(cells[0], cells[1])] = values
    return table


def test_sections_and_cache_table(report):
    for title in ("1. Cache per token", "2. Accuracy", "3. Step time"):
        assert title in report
    rows = _rows(report)
    assert rows["MXFP4 (this)"][1:] == ["136", "68", "204", "5,263,440", "3.76x"]
    assert rows["fp8 e4m3"][1:] == ["256", "128", "384", "2,796,202", "2.00x"]
    assert rows["bf16"][1:] == ["512", "256", "768", "1,398,101", "1.00x"]
    assert "prefill 3/3, decode 3/3" in report  # pools updated in place


def test_accuracy_rows(report):
    acc = _accuracy(report)
    assert set(acc) == {(p, c) for p in ("prefill", "decode") for c in ("<= 2048", "> 2048")}
    # --eval-rows 24 per request and context class: request 0 has rows in both classes
    assert acc[("prefill", "<= 2048")]["rows"][0] == 24 + 24
    assert acc[("prefill", "> 2048")]["rows"][0] == 24
    assert acc[("decode", "<= 2048")]["rows"][0] == 2
    assert acc[("decode", "> 2048")]["rows"][0] == 2


def test_accuracy_dense_contexts(report):
    """Contexts <= 2048 tokens select every block: only MXFP4 quantization error remains."""
    for phase in ("prefill", "decode"):
        a = _accuracy(report)[(phase, "<= 2048")]
        assert a["selection only"] == (0.0, 1.0), a
        assert a["MXFP4 sparse"] == a["MXFP4 only"], a
        rel, cos = a["MXFP4 sparse"]
        assert cos > 0.95 and 0.01 < rel < 0.3, a
        assert a["worst cos"][1] > 0.8, a
        fp8_rel, fp8_cos = a["fp8 KV dense"]
        assert fp8_cos > 0.99 and fp8_rel < rel, a  # MXFP4 is coarser than fp8


def test_accuracy_sparse_contexts(report):
    """Contexts > 2048 tokens are genuinely sparse: selection error is there, and the MXFP4
    error against attention over the same blocks stays as small as in dense contexts."""
    for phase in ("prefill", "decode"):
        a = _accuracy(report)[(phase, "> 2048")]
        assert a["selection only"][0] > 0.0, a
        assert a["MXFP4 only"][1] > 0.95, a
        assert a["MXFP4 sparse"][1] > 0.8, a


def test_timing_rows(report):
    section = report.split("3. Step time")[1]
    for step in ("compile prefill step", "compile decode step", "prefill step", "decode step"):
        line = next(ln for ln in section.splitlines() if ln.startswith(step + " "))
        value = float(re.split(r"\s{2,}", line.strip())[1].split()[0])
        assert value > 0, line


def test_cli_help():
    with contextlib.redirect_stdout(io.StringIO()) as out, pytest.raises(SystemExit) as exc:
        cli.main(["demo", "--help"])
    assert exc.value.code == 0
    assert "--prefill-lens" in out.getvalue() and "--decode-steps" in out.getvalue()


def test_config_from_args():
    parser = cli.build_parser()

    def config(*argv):
        return demo.config_from_args(parser.parse_args(["demo", *argv]))

    assert config().prefill_lens == demo.DEFAULT_PREFILL_LENS
    assert config("--requests", "4").prefill_lens == (1500, 2500, 700, 1500)
    assert config("--context", "999", "--requests", "2").prefill_lens == (999, 999)
    assert config("--prefill-lens", "5,6").prefill_lens == (5, 6)
    with pytest.raises(ValueError):
        config("--prefill-lens", "5,6", "--requests", "3")


def test_schedule_prefill():
    assert demo.schedule_prefill([1500, 2500, 700], 2048) == [
        ([0, 0, 0], [1500, 548, 0]),
        ([1500, 548, 0], [0, 1952, 96]),
        ([1500, 2500, 96], [0, 0, 604]),
    ]
