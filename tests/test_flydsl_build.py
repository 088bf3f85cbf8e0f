"""The gfx950 FlyDSL kernels build on this machine (no GPU) and pass ISA and resource checks.

One session-scoped build compiles every MiniMax-M3.1 specialization into a temporary folder
(with a fresh cache, so it really compiles); the checks then read the code objects' own
metadata notes and the ISA. Nothing here runs a kernel (that needs an MI355X: tests/gpu/).
"""

from __future__ import annotations

import contextlib
import io
import json
import re

import pytest

from jax_mxfp4._src.flydsl import abi, toolchain
from jax_mxfp4._src.flydsl.code_object import LDS_LIMIT, code_object
from jax_mxfp4._src.flydsl.metadata import kernel_info, waves_per_simd

SCALED_MFMA = "v_mfma_scale_f32_16x16x128_f8f6f4"


def _ops(built, *ops):
    return [co for co in built[1].values() if co.spec.op in ops]


def test_every_specialization_compiles(built):
    out, objects = built
    expected = {s.symbol for s in abi.minimax_specializations()}
    assert set(objects) == expected
    manifest = json.loads((out / "manifest.json").read_text())
    assert {k["symbol"] for k in manifest["kernels"]} == expected
    for symbol, co in objects.items():
        assert co.hsaco[:4] == b"\x7fELF"
        assert (out / f"{symbol}.hsaco").read_bytes() == co.hsaco
        assert "amdgcn-amd-amdhsa--gfx950" in co.isa or "gfx950" in co.isa.splitlines()[0]


def test_scorer_and_attention_use_scaled_mfma_fp4_a_fp8_b(built):
    for co in _ops(built, "index_scores", "sparse_attention"):
        lines = [line for line in co.isa.splitlines() if SCALED_MFMA in line]
        assert lines, f"{co.symbol}: no {SCALED_MFMA}"
        for line in lines:
            assert re.search(r"\bcbsz:4\b", line), f"{co.symbol}: A not fp4 e2m1: {line}"
            blgp = re.search(r"\bblgp:(\d)\b", line)
            assert blgp is None or blgp.group(1) == "0", f"{co.symbol}: B not fp8 e4m3: {line}"


def test_attention_pv_is_a_bf16_mfma(built):
    for co in _ops(built, "sparse_attention"):
        assert "v_mfma_f32_16x16x32_bf16" in co.isa, co.symbol


def test_no_scratch(built):
    # SGPR spills go to VGPR lanes (v_writelane), not memory; VGPR spills would need scratch.
    for co in built[1].values():
        assert co.info.scratch_bytes == 0, co.symbol
        assert co.info.vgpr_spills == 0, co.symbol
        assert ".amdhsa_private_segment_fixed_size 0" in co.isa, co.symbol
        assert "scratch_" not in co.isa, co.symbol


def test_registers_allow_the_occupancy_compiled_for(built):
    """Two waves a SIMD everywhere, four for the prefill index scorer (abi.waves_per_eu)."""
    for co in built[1].values():
        assert waves_per_simd(co.info) >= abi.waves_per_eu(co.spec), (
            co.symbol, co.info.vgpr_count, co.info.agpr_count)
    assert any(abi.waves_per_eu(co.spec) == 4 for co in built[1].values())


def test_lds_within_the_gfx950_limit(built):
    # LLVM's AMDGPU backend rejects more than 163840 bytes of LDS per workgroup on gfx950.
    for co in built[1].values():
        assert co.info.lds_bytes <= LDS_LIMIT["gfx950"], co.symbol
        assert co.info.lds_bytes == co.lds_bytes


def test_kernarg_layout_matches_what_the_launcher_packs(built):
    for co in built[1].values():
        slots, size = abi.kernarg_layout(abi.args(co.spec.op))
        assert co.info.args == tuple((s.offset, s.size, s.value_kind) for s in slots), co.symbol
        assert co.info.kernarg_size == size, co.symbol
        assert co.info.max_workgroup_size == co.block[0], co.symbol


def test_prebuilt_directory_is_used_without_compiling(built, monkeypatch, tmp_path):
    out, objects = built
    monkeypatch.setenv("JAX_MXFP4_KERNEL_DIR", str(out))
    monkeypatch.setenv("JAX_MXFP4_CACHE_DIR", str(tmp_path))  # empty: a compile would show
    co = code_object("index_scores", q="bf16", heads=1, tiling="decode", compile=False)
    assert co.hsaco == objects[co.symbol].hsaco
    assert kernel_info(co.hsaco, co.symbol) == objects[co.symbol].info


def test_cli_build_prints_the_manifest_table(built, monkeypatch, tmp_path):
    from jax_mxfp4.cli import main

    out, _ = built
    monkeypatch.setenv("JAX_MXFP4_KERNEL_DIR", str(out))  # reuse the session's build
    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        assert main(["build", "--arch", "gfx950", "--out", str(tmp_path), "--no-progress"]) == 0
    lines = text.getvalue().splitlines()
    assert lines[0].split()[:4] == ["kernel", "block", "LDS", "B"]
    assert any(line.startswith("jax_mxfp4_sparse_attention_qbf16_g16_mxfp8_direct")
               for line in lines)
    assert (tmp_path / "manifest.json").exists()


@pytest.mark.parametrize("heads, rows, requests, expected", [
    (1, 32, 32, 1),     # S = 1: a workgroup per request and 16 blocks, spread over the blocks
    (1, 32, 8, 4),      # S = 4: one request's four rows share each page read
    (1, 48, 8, 4),      # six rows a request: rounded down to a power of two
    (1, 512, 8, 16),    # long requests: the tile's 16 / H rows at most
    (4, 64, 8, 4),      # H = 4: the tile holds 16 / 4 rows
    (8, 64, 64, 1),
    (1, 3, 8, 1),       # fewer rows than requests (padded batch): one row a workgroup
])
def test_decode_tile_rows_follow_rows_per_request(heads, rows, requests, expected):
    decode = abi.Specialization("index_scores", q="bf16", heads=heads, tiling="decode")
    assert abi.index_scores_tile_rows(decode, rows, requests) == expected


def test_compiler_error_lines_fail_the_build():
    log = "warning: x\nerror: <unknown>:0:0: no libcall available for ftanh\n"
    assert toolchain.error_lines(log) == ["error: <unknown>:0:0: no libcall available for ftanh"]
    assert toolchain.error_lines("all good\n") == []


def test_grids_come_from_static_shapes():
    spec = abi.Specialization("index_scores", q="bf16", heads=1, tiling="prefill")
    assert abi.index_scores_tile(spec) == (64, 4)
    assert abi.index_scores_tile_rows(spec, num_rows=4096, num_requests=1) == 64
    assert abi.grid(spec, num_rows=4096, num_blocks=1024, tile_rows=64) == (64, 256, 1)
    decode = abi.Specialization("index_scores", q="e4m3", heads=4, tiling="decode")
    assert abi.grid(decode, num_rows=32, num_blocks=1024, tile_rows=4) == (8, 64, 1)
    assert abi.grid(decode, num_rows=32, num_blocks=1024, tile_rows=1) == (32, 64, 1)
    split = abi.Specialization("sparse_attention", q="bf16", group=16, output="bf16", path="split")
    assert abi.grid(split, num_rows=256, num_partitions=4) == (256, 4, 1)
    with pytest.raises(ValueError):
        abi.Specialization("sparse_attention", q="bf16", group=16, output="mxfp8", path="split")
