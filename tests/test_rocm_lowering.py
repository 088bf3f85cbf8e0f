"""The ROCm lowering picks the gfx950 FlyDSL kernels, on a machine without a GPU (CI).

Every case is lowered for ROCm (``lower(lowering_platforms=("rocm",))``) under
``jm.lowering_options(gpu_arch="gfx950")`` with the code objects of the session's FlyDSL
build (``built``, shared with test_flydsl_build.py, used as ``JAX_MXFP4_KERNEL_DIR``): each
launcher custom call
must carry the FlyDSL code object (symbol, bytes, content hash), a block and grid from
``jax_mxfp4._src.flydsl.abi`` and parameters in the kernarg layout's order. With
``gfx950_kernels="triton"``, on gfx942, and for calls no FlyDSL kernel covers, the Triton
kernels are lowered instead, and ``jm.explain`` says so.
"""

from __future__ import annotations

import base64
import re
import struct
import sys
import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import SM_SCALE

pytest.importorskip("triton")

import jax_mxfp4 as jm
from jax_mxfp4._src.core.scaling import folded_score_scale
from jax_mxfp4._src.dispatch.lowering import NoLoweringError
from jax_mxfp4._src.flydsl import abi
from jax_mxfp4._src.gpu import launch

KIND = {"pointer": (launch.BUFFER, launch.NULL), "i32": (launch.I32,), "f32": (launch.F32,),
        "i64": (launch.I64,)}

i32 = lambda *s: jax.ShapeDtypeStruct(s, jnp.int32)  # noqa: E731
bf16 = lambda *s: jax.ShapeDtypeStruct(s, jnp.bfloat16)  # noqa: E731
e4m3 = lambda *s: jax.ShapeDtypeStruct(s, jnp.float8_e4m3fn)  # noqa: E731
POOL = jax.ShapeDtypeStruct((64, 8704), jnp.uint8)
KV = jax.ShapeDtypeStruct((64, 1, 8704), jnp.uint8)


def _cases():
    """name -> (fn, args, [(symbol, grid dims, expected scalars by kernarg name)...])."""
    def index(**kw):
        return lambda *a: jm.index_scores(*a, num_blocks=16, sm_scale=SM_SCALE, **kw)

    def attention(**kw):
        return lambda *a: jm.sparse_attention(*a, sm_scale=SM_SCALE, **kw)

    score = folded_score_scale(SM_SCALE)
    return {
        "write_cache": (
            lambda p, x, s: jm.write_cache(p, x, s, round_mode="even"),
            (KV, bf16(8, 1, 128), i32(8)),
            [("jax_mxfp4_write_cache", {"num_tokens": 8, "num_heads": 1},
              {"num_tokens": 8, "num_pages": 64, "num_heads": 1, "round_mode": 1})],
        ),
        "index_decode": (
            index(), (bf16(8, 1, 128), POOL, i32(8, 16), i32(8), i32(8)),
            [("jax_mxfp4_index_scores_qbf16_h1_decode",
              {"num_rows": 8, "num_blocks": 16, "tile_rows": 1},
              {"num_rows": 8, "num_pages": 64, "num_requests": 8, "table_width": 16,
               "num_blocks": 16, "tile_rows": 1, "score_scale": score})],
        ),
        "index_prefill_e4m3": (
            index(), (e4m3(512, 4, 128), POOL, i32(1, 16), i32(512), i32(512)),
            [("jax_mxfp4_index_scores_qe4m3_h4_prefill",
              {"num_rows": 512, "num_blocks": 16, "tile_rows": 16},
              {"num_rows": 512, "num_requests": 1, "num_blocks": 16, "tile_rows": 16})],
        ),
        "attention_split": (
            attention(), (bf16(2, 16, 128), KV, KV, i32(2, 1, 16), i32(2, 1)),
            [("jax_mxfp4_sparse_attention_qbf16_g16_bf16_split",
              {"num_rows": 2, "num_partitions": 8},
              {"num_rows": 2, "num_kv_heads": 1, "num_pages": 64, "pages_per_row": 16,
               "num_partitions": 8, "sm_scale": SM_SCALE}),
             ("jax_mxfp4_attention_merge_g16_bf16", {"num_rows": 2},
              {"num_rows": 2, "num_partitions": 8})],
        ),
        "attention_direct_mxfp8": (
            attention(output="mxfp8"), (e4m3(512, 16, 128), KV, KV, i32(512, 1, 2),
                                         i32(512, 1)),
            [("jax_mxfp4_sparse_attention_qe4m3_g16_mxfp8_direct",
              {"num_rows": 512, "num_partitions": 1},
              {"num_rows": 512, "num_partitions": 1, "pages_per_row": 2})],
        ),
    }


def _dense(attrs: str, name: str) -> list[int]:
    m = re.search(name + r" = dense<(\[[^\]]*\]|[-\d]+)> : tensor<(\d+)x", attrs)
    assert m, (name, attrs[:500])
    if m.group(1).startswith("["):
        return [int(v) for v in m.group(1)[1:-1].split(",")]
    return [int(m.group(1))] * int(m.group(2))


def _string(attrs: str, name: str) -> str:
    return re.search(name + r' = "([^"]*)"', attrs).group(1)


def launches(text: str) -> list[str]:
    """The attribute dictionaries of the launcher custom calls, in program order."""
    return re.findall(r"stablehlo\.custom_call @" + launch.TARGET + r"\(.*?mhlo\.backend_config = "
                      r"\{(.*?)\}, operand_layouts", text)


def lower_for_rocm(fn, args) -> str:
    # A fresh function per call, so that JAX's lowering caches see the new environment.
    return jax.jit(lambda *a: fn(*a)).trace(*args).lower(lowering_platforms=("rocm",)).as_text()


@pytest.fixture
def rocm(monkeypatch, built):
    """Lowering for ROCm gfx950 (256 CUs) with the session's prebuilt FlyDSL code objects."""
    monkeypatch.setenv("JAX_MXFP4_KERNEL_DIR", str(built[0]))
    with jm.lowering_options(gpu_arch="gfx950", gpu_units=256):
        yield


@pytest.mark.parametrize("name", list(_cases()))
def test_gfx950_lowers_to_the_flydsl_code_objects(rocm, built, name):
    fn, args, expected = _cases()[name]
    calls = launches(lower_for_rocm(fn, args))
    assert [_string(c, "symbol") for c in calls] == [e[0] for e in expected]
    for attrs, (symbol, dims, scalars) in zip(calls, expected, strict=True):
        co = built[1][symbol]
        code = zlib.decompress(base64.b64decode(_string(attrs, "code")))
        assert code == co.hsaco
        assert _string(attrs, "code_hash").startswith(co.content_hash + "-")
        assert _dense(attrs, "block") == list(co.block)
        assert _dense(attrs, "grid") == list(co.grid(**dims))
        assert re.search(r"shared_mem = 0 : i64", attrs)
        kinds, values = _dense(attrs, "param_kinds"), _dense(attrs, "param_values")
        layout = co.kernarg_layout
        assert len(kinds) == len(values) == len(layout) == len(abi.args(co.spec.op))
        assert [s.name for s in layout] == [a.name for a in abi.args(co.spec.op)]
        got = {}
        for slot, kind, value in zip(layout, kinds, values, strict=True):
            assert kind in KIND[slot.kind], (symbol, slot)
            if kind == launch.F32:
                got[slot.name] = struct.unpack("<f", struct.pack("<I", value))[0]
            elif kind != launch.BUFFER and kind != launch.NULL:
                got[slot.name] = value
        for k, v in scalars.items():
            want = float(np.float32(v)) if isinstance(v, float | np.floating) else v
            assert got[k] == want, (symbol, k, got[k], want)
        if co.spec.op in ("index_scores", "sparse_attention"):  # operands in pointer order
            assert kinds[:5] == [launch.BUFFER] * 5 and values[:5] == [0, 1, 2, 3, 4]
        if co.spec.op == "write_cache":  # the pool result (aliased to operand 0), x, slots
            assert values[:3] == [3, 1, 2]


def test_mxfp8_direct_passes_the_scale_result_and_bf16_direct_none(rocm, built):
    fn, args, _ = _cases()["attention_direct_mxfp8"]
    (attrs,) = launches(lower_for_rocm(fn, args))
    assert _dense(attrs, "param_kinds")[5:7] == [launch.BUFFER, launch.BUFFER]
    assert _dense(attrs, "param_values")[5:7] == [5, 6]
    bf16_fn = lambda *a: jm.sparse_attention(*a, sm_scale=SM_SCALE)  # noqa: E731
    (attrs,) = launches(lower_for_rocm(bf16_fn, args))
    assert _string(attrs, "symbol") == "jax_mxfp4_sparse_attention_qe4m3_g16_bf16_direct"
    assert _dense(attrs, "param_kinds")[5:7] == [launch.BUFFER, launch.NULL]


def _symbols(text: str) -> list[str]:
    return [_string(c, "symbol") for c in launches(text)]


def test_triton_on_request_on_other_archs_and_where_flydsl_does_not_cover(rocm):
    fn, args, _ = _cases()["index_decode"]
    with jm.lowering_options(gfx950_kernels="triton", gpu_arch="gfx942"):
        assert _symbols(lower_for_rocm(fn, args)) == ["index_scores_kernel"]
    with jm.lowering_options(gpu_arch="gfx942"):  # Triton's target: test_gpu_compile's kernels
        assert _symbols(lower_for_rocm(fn, args)) == ["index_scores_kernel"]
    no_round = lambda *a: jm.index_scores(*a, num_blocks=16, sm_scale=SM_SCALE,  # noqa: E731
                                          q_round="none")
    assert _symbols(lower_for_rocm(no_round, args)) == ["index_scores_kernel"]
    assert _symbols(lower_for_rocm(fn, args)) == ["jax_mxfp4_index_scores_qbf16_h1_decode"]


def test_explain_reports_what_lowers_on_gfx950(rocm):
    """``jm.explain`` asks the lowering rule's question: FlyDSL where a kernel covers the
    call, Triton where none does, each skipped lowering with its reason; it agrees with the
    symbols the lowering emits."""
    fn, args, _ = _cases()["index_decode"]
    (entry,) = jm.explain(fn, *args, platform="rocm")
    assert entry.lowering == "flydsl:jax_mxfp4_index_scores_qbf16_h1_decode"
    assert entry.skipped == () and entry.target == "rocm gfx950"
    no_round = lambda *a: jm.index_scores(*a, num_blocks=16, sm_scale=SM_SCALE,  # noqa: E731
                                          q_round="none")
    (entry,) = jm.explain(no_round, *args, platform="rocm")
    assert entry.lowering.startswith("triton:index_scores_kernel")
    assert entry.skipped[0][0] == "flydsl:index_scores" and "q_round" in entry.skipped[0][1]
    split_fn, split_args, expected = _cases()["attention_split"]
    (entry,) = jm.explain(split_fn, *split_args, platform="rocm")
    assert entry.lowering == (f"flydsl:{expected[0][0]}[8 partitions]+{expected[1][0]}")
    assert _symbols(lower_for_rocm(split_fn, split_args)) == [e[0] for e in expected]
    with jm.lowering_options(gfx950_kernels="triton"):
        (entry,) = jm.explain(fn, *args, platform="rocm")
        assert entry.lowering.startswith("triton:") and "Triton" in entry.skipped[0][1]


def test_flydsl_kernels_are_built_on_demand_without_torch(monkeypatch, tmp_path):
    """No prebuilt kernels, an empty cache, no torch in this process (as in CI): with FlyDSL
    installed, the gfx950 lowering still takes the FlyDSL kernel (compiled in a process of its
    own with the torch stand-in, then cached) instead of passing the call to Triton. (It took
    Triton here until the check asked for an in-process FlyDSL import, which needs torch.)"""
    pytest.importorskip("flydsl")
    monkeypatch.delenv("JAX_MXFP4_KERNEL_DIR", raising=False)
    monkeypatch.setenv("JAX_MXFP4_CACHE_DIR", str(tmp_path))
    fn, args, expected = _cases()["index_decode"]
    with jm.lowering_options(gpu_arch="gfx950", gpu_units=256):
        assert _symbols(lower_for_rocm(fn, args)) == [e[0] for e in expected]
    assert list(tmp_path.glob(f"gfx950/{expected[0][0]}-*/*/{expected[0][0]}.hsaco"))


def test_gfx950_without_its_kernels_fails_loudly_instead_of_taking_triton(monkeypatch, tmp_path):
    """No prebuilt code object, an empty cache and no FlyDSL: the FlyDSL kernel covers the
    call but cannot be had, so lowering fails with that cause and both fixes (install the
    rocm extra, or ask for Triton), and ``explain`` shows the same stop; Triton lowers only
    when asked for. Mutation: ``choose`` going on past a ``LoadFailure`` lowers Triton here
    and fails the first assertion."""
    from jax_mxfp4._src.flydsl import launch as _launch

    monkeypatch.delenv("JAX_MXFP4_KERNEL_DIR", raising=False)
    monkeypatch.setenv("JAX_MXFP4_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(_launch, "flydsl_installed", lambda: False)
    fn, args, _ = _cases()["index_decode"]
    with jm.lowering_options(gpu_arch="gfx950", gpu_units=256):
        with pytest.raises(NoLoweringError, match=r"(?s)cannot load: no prebuilt or cached "
                           r".*FlyDSL is not installed.*jax_mxfp4\[rocm\].*gfx950_kernels"):
            lower_for_rocm(fn, args)
        (entry,) = jm.explain(fn, *args, platform="rocm")
        assert entry.lowering == "none" and entry.skipped[0][0] == "flydsl:index_scores"
        with jm.lowering_options(gfx950_kernels="triton"):
            assert _symbols(lower_for_rocm(fn, args)) == ["index_scores_kernel"]


def test_a_kernel_module_that_does_not_import_is_the_error(monkeypatch, rocm):
    """A FlyDSL module failing to import (a broken install, as the wheel once was: it
    imported a top-level ``hip_kernels``) is reported with the import error, not skipped."""
    monkeypatch.setitem(sys.modules, "jax_mxfp4._src.ops.index_scores.flydsl", None)
    fn, args, _ = _cases()["index_decode"]
    with pytest.raises(NoLoweringError, match=r"jax_mxfp4\._src\.ops\.index_scores\.flydsl "
                       r"does not import"):
        lower_for_rocm(fn, args)
