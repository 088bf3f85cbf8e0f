"""The GPU kernels compile on a machine without a GPU (CI): every public operation is exported
for CUDA (sm_90) and ROCm (gfx942) through its Triton lowering, and every launch's parameter
layout is checked against the compiled kernel (count from its PTX / AMDGPU metadata, and the
kind of each parameter against the kernel's signature: ``launch.Launch.attributes``)."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import SM_SCALE

pytest.importorskip("triton")

import jax_mxfp4 as jm
from jax_mxfp4._src.gpu import launch
from jax_mxfp4._src.triton.compiler import compile_kernel
from jax_mxfp4._src.triton.triton_compile import GFX942, SM90, Target

TARGETS = {"cuda": ("90", SM90), "rocm": ("gfx942", GFX942)}


def _cases():
    pool = jax.ShapeDtypeStruct((64, 8704), jnp.uint8)
    kv = jax.ShapeDtypeStruct((64, 1, 8704), jnp.uint8)
    i32 = lambda *s: jax.ShapeDtypeStruct(s, jnp.int32)  # noqa: E731
    bf16 = lambda *s: jax.ShapeDtypeStruct(s, jnp.bfloat16)  # noqa: E731
    e4m3 = lambda *s: jax.ShapeDtypeStruct(s, jnp.float8_e4m3fn)  # noqa: E731
    return {
        "write_cache": (lambda p, x, s: jm.write_cache(p, x, s), (kv, bf16(8, 1, 128), i32(8))),
        "write_cache_sorted_slots": (lambda p, x, s: jm.write_cache(p, x, s),
                                     (kv, bf16(5000, 1, 128), i32(5000))),
        "index_decode": (
            lambda *a: jm.index_scores(*a, num_blocks=16, sm_scale=SM_SCALE),
            (bf16(8, 1, 128), pool, i32(8, 16), i32(8), i32(8)),
        ),
        "index_prefill": (
            lambda *a: jm.index_scores(*a, num_blocks=16, sm_scale=SM_SCALE),
            (bf16(512, 1, 128), pool, i32(1, 16), i32(512), i32(512)),
        ),
        "index_e4m3_q": (
            lambda *a: jm.index_scores(*a, num_blocks=16, sm_scale=SM_SCALE),
            (e4m3(8, 2, 128), pool, i32(2, 16), i32(8), i32(8)),
        ),
        "index_q_round_none": (
            lambda *a: jm.index_scores(*a, num_blocks=16, sm_scale=SM_SCALE, q_round="none"),
            (bf16(8, 1, 128), pool, i32(8, 16), i32(8), i32(8)),
        ),
        "select_blocks": (
            lambda *a: tuple(jm.select_blocks(*a, topk=16)),
            (jax.ShapeDtypeStruct((1, 8, 16), jnp.float32), i32(8, 16), i32(8), i32(8)),
        ),
        "select_blocks_512K": (  # one row per program over 8 warps
            lambda *a: tuple(jm.select_blocks(*a, topk=64)),
            (jax.ShapeDtypeStruct((1, 3, 4096), jnp.float32), i32(2, 4096), i32(3), i32(3)),
        ),
        "attention_split": (
            lambda *a: jm.sparse_attention(*a, sm_scale=SM_SCALE),
            (bf16(2, 16, 128), kv, kv, i32(2, 1, 16), i32(2, 1)),
        ),
        "attention_mxfp8_direct": (
            lambda *a: jm.sparse_attention(*a, sm_scale=SM_SCALE, output="mxfp8"),
            (bf16(512, 16, 128), kv, kv, i32(512, 1, 16), i32(512, 1)),
        ),
        "attention_e4m3_q": (
            lambda *a: jm.sparse_attention(*a, sm_scale=SM_SCALE),
            (e4m3(4, 16, 128), kv, kv, i32(4, 1, 16), i32(4, 1)),
        ),
    }


@pytest.mark.parametrize("platform", ["cuda", "rocm"])
@pytest.mark.parametrize("name", list(_cases()))
def test_exports_for_gpu_through_the_launcher(platform, name):
    arch, _ = TARGETS[platform]
    fn, args = _cases()[name]
    checks = [jax.export.DisabledSafetyCheck.custom_call(launch.TARGET)]
    with jm.lowering_options(gpu_arch=arch):
        exp = jax.export.export(jax.jit(fn), platforms=[platform], disabled_checks=checks)(*args)
    text = exp.mlir_module()
    calls = re.findall(r'stablehlo.custom_call @' + launch.TARGET, text)
    assert calls, text[:2000]
    assert "symbol" in text and "param_kinds" in text


def test_param_count_is_read_from_the_code_object():
    """A Triton kernel takes two scratch pointers after the user's parameters, for both
    backends; the compiler reads the count back from the compiled code."""
    import triton
    import triton.language as tl

    from jax_mxfp4._src.triton.compiler import spec

    @triton.jit
    def probe(x_ptr, n, y_ptr, B: tl.constexpr):
        i = tl.arange(0, B)
        tl.store(y_ptr + i, tl.load(x_ptr + i, mask=i < n, other=0.0), mask=i < n)

    for target in (SM90, GFX942):
        k = compile_kernel(spec(probe, {"x_ptr": "*fp32", "n": "i32", "y_ptr": "*fp32"},
                                {"B": 128}), target)
        assert k.param_types == ("*fp32", "i32", "*fp32", "*i8", "*i8")
        assert isinstance(target, Target) and k.code and k.symbol == "probe"
        bad = launch.Launch(k, (1, 1, 1), launch.with_scratch(
            [launch.buffer(0), launch.buffer(1), launch.buffer(2)]))
        with pytest.raises(ValueError):
            bad.attributes()
        good = launch.Launch(k, (1, 1, 1), launch.with_scratch(
            [launch.buffer(0), launch.i32(5), launch.buffer(1)]))
        attrs = good.attributes()
        assert attrs["param_kinds"].tolist() == [0, 1, 0, 4, 4]
        assert np.asarray(attrs["block"]).tolist()[0] == 4 * target.warp_size


def test_last_writer_slots_keep_only_each_slots_last_row():
    """The sort-based last-writer rule of large writes against a plain loop. (Mutation:
    keeping the first of each run instead of the last fails here.)"""
    from jax_mxfp4._src.core.pages import last_writer_slots

    rng = np.random.default_rng(0)
    for rows, span in ((1, 4), (50, 10), (3000, 500), (3000, 5000)):
        slots = rng.integers(-3, span, rows).astype(np.int32)
        expected = slots.copy()
        seen = set()
        for r in range(rows - 1, -1, -1):
            if slots[r] in seen:
                expected[r] = -1
            seen.add(int(slots[r]))
        got = np.asarray(jax.jit(last_writer_slots)(slots))
        np.testing.assert_array_equal(got, expected)


def _sass_stats():
    """bench/sass_stats.py (its lowering targets sm_90)."""
    import bench_scripts

    return bench_scripts.load("sass_stats")


def test_one_row_index_tiles_take_integer_dots():
    """bench/sass_stats.py disassembles what the lowering compiles: a one-row decode tile
    (S = 1, H = 1) of an e4m3-rounded query is scored with exact integer dots, by default as
    byte dots on the CUDA cores (``IDP.4A``, ``row_dot``, no MMA); a 4-row tile takes the Gluon
    rows tile by default (tensor-core MMAs, no spills) and the Triton 16-row tile under
    ``cuda_kernels="triton"`` (MMAs, within the plan's register cap: five programs per SM).
    (Mutations: a plan that never picks one-row tiles fails here, and so does one without the
    cap: 118 registers.)"""
    import jax_mxfp4 as jm
    from jax_mxfp4._src.ops.index_scores import triton as index_scores

    sass_stats = _sass_stats()
    found = {}
    for per_request, kernels in ((1, "auto"), (4, "auto"), (4, "triton")):
        with jm.lowering_options(cuda_kernels=kernels):
            (kernel,) = sass_stats.kernels_of(*sass_stats._index(8, per_request, 16))
        resources, ops = sass_stats.profile(kernel)
        assert int(resources["REG"]) > 0 and sum(ops.values()) > 100
        if kernels != "triton":  # (the capped Triton tile spills 16 bytes: measured faster)
            assert int(resources.get("STACK", 0)) == 0, (per_request, resources)
        found[per_request, kernels] = kernel.symbol, ops, int(resources["REG"])
    symbol, ops, _ = found[1, "auto"]
    assert symbol == "index_scores_kernel"
    assert ops["IDP"] >= 100 and not any("MMA" in op for op in ops)
    symbol, ops, _ = found[4, "auto"]
    assert symbol == "index_rows_kernel" and ops["HMMA"] >= 16
    symbol, ops, registers = found[4, "triton"]
    assert symbol == "index_scores_kernel" and any("MMA" in op for op in ops)
    assert registers <= index_scores.DECODE_TILE_REGISTERS


def test_load_schedule_flags_a_load_behind_a_shared_store_of_loaded_data():
    """bench/sass_stats.py's ``load_schedule`` on hand-written SASS: a load after a shared
    store of an earlier load's registers is flagged; one after a store of a register written
    since with other data is not."""
    schedule = _sass_stats().load_schedule
    late = schedule(["@P3 LDG.E.128 R16, desc[UR6][R20.64]", "STS.128 [R37+UR4], R16",
                     "@P3 LDG.E.128 R28, desc[UR6][R4.64]"])
    assert [load["after_shared_store"] for load in late] == [False, True]
    assert late[1]["index"] == 2 and late[1]["text"].startswith("LDG.E.128 R28")
    fine = schedule(["LDG.E.64 R2, desc[UR8][R6.64]", "IMAD.MOV.U32 R3, RZ, RZ, R5",
                     "STS [R13], R3", "LDG.E R9, desc[UR8][R20.64]"])
    assert [load["after_shared_store"] for load in fine] == [False, False]


def test_attention_page_loads_go_out_before_the_keys_layout_change():
    """The sparse-attention split kernel issues every load of its page (the keys' and the
    values' codes and scales) before any shared-memory store of loaded data: ptxas issues no
    load past such a store, so a value load behind the keys' layout change would wait a round
    trip for the keys' bytes (bench/history/2026-12-04.md, twenty-fourth session, "What
    landed": 0.2 us of a 1-row call, 6.8 -> 6.6 us). Mutation: the keys split into groups
    before the values' loads (the order before ``2fc4e1e``) flags the five value loads here."""
    sass_stats = _sass_stats()
    kernels = sass_stats.kernels_of(*sass_stats.CASES["attention 1 row"])
    (split,) = [kernel for kernel in kernels if kernel.symbol == "attention_kernel"]
    loads = sass_stats.load_schedule(sass_stats.sass(split))
    assert sum("LDG.E.128" in load["text"] for load in loads) == 8  # the page's code bytes
    assert not [load["text"] for load in loads if load["after_shared_store"]]


def test_prefill_index_tiles_fold_the_keys_within_their_spill_budget():
    """Prefill tiles (64 and 128 dot rows) take folded keys, one K = 128 dot per block: the
    sm_90 code has warpgroup MMAs (four rescaled group dots spilled at 128 rows in the Triton
    tile). Decode tiles keep the group dots. The Gluon
    tile's walk of eight blocks, at its register cap, keeps its rows' output addresses (16
    bytes) in local memory, reloaded once a block (``PREFILL_TILE_REGISTERS``); its walk
    across requests (a tile holding rows of several) also keeps its 64-bit block counter and
    page address there (56 bytes in all, 20 reloads in the code; a cap of 120 registers
    spills 112 bytes and fails here)."""
    from jax_mxfp4._src.ops.index_scores import triton as index_scores

    tiles = {
        "prefill": index_scores.plan(4096, 1, 1, 64, 132),
        "prefill64": index_scores.plan(256, 1, 4, 64, 132),
        "decode": index_scores.plan(32, 1, 8, 64, 132),
    }
    assert {name: (tile.fold, tile.m) for name, tile in tiles.items()} == {
        "prefill": (True, 128), "prefill64": (True, 64), "decode": (False, 16)}
    sass_stats = _sass_stats()
    # (ctx 128K: eight blocks a program, the walk the large prefill cells take)
    for rows, per_request, blocks in ((4096, 4096, 16), (4096, 4096, 1024), (256, 64, 16)):
        (kernel,) = sass_stats.kernels_of(*sass_stats._index(rows, per_request, blocks))
        resources, ops = sass_stats.profile(kernel)
        assert int(resources.get("STACK", 0)) <= 56 and int(resources.get("LOCAL", 0)) == 0
        assert ops["HGMMA"] > 0 and ops["LDL"] <= 20, ops
        # on sm_90 the Gluon tile: two programs per SM in registers and shared memory
        assert kernel.symbol == "index_prefill_kernel", kernel.symbol
        registers = int(resources["REG"])
        assert registers <= index_scores.PREFILL_TILE_REGISTERS
        assert 2 * kernel.num_warps * 32 * registers <= 65536, registers
        assert 2 * kernel.shared_mem <= 227 * 1024, kernel.shared_mem


CROSS_ARCH_SCRIPT = """
import json, pathlib, re, sys
import jax, jax.numpy as jnp
import jax_mxfp4 as jm
kv = jax.ShapeDtypeStruct((8, 1, 8704), jnp.uint8)
args = (jax.ShapeDtypeStruct((2, 16, 128), jnp.bfloat16), kv, kv,
        jax.ShapeDtypeStruct((2, 1, 4), jnp.int32), jax.ShapeDtypeStruct((2, 1), jnp.int32))
attend = jax.jit(lambda *a: jm.sparse_attention(*a, sm_scale=0.1, output="mxfp8"))
for backend in ("emulated-gfx950", "emulated-gfx942"):  # Triton on both (not FlyDSL)
    with jm.backend_scope(backend), jm.lowering_options(gfx950_kernels="triton"):
        attend.lower(*args).compile()
found = {}
for meta in pathlib.Path(sys.argv[1]).glob("*.json"):
    isa = json.loads(meta.read_text())["isa"]
    arch = re.search(r"amdgcn-amd-amdhsa--(gfx\\d+)", isa).group(1)
    found.setdefault(arch, []).append("v_cvt_scalef32" in isa)
print(json.dumps(found))
"""


def test_gfx942_code_compiled_after_gfx950_has_no_gfx950_instructions(tmp_path):
    """Triton 3.6 keeps state from the first AMD architecture a process compiles for: in one
    process, gfx942 code compiled after gfx950 code carried gfx950's ``v_cvt_scalef32_*``
    conversions (an illegal instruction on an MI300X; the reverse order changes gfx950's code
    too). The compiler compiles every AMD
    architecture but the first in a worker process of its own. Lowers the MXFP8 attention (its
    fp8 conversions are where the architectures differ) for both emulated backends in a fresh
    process with an empty kernel cache, then reads each cached kernel's assembly.

    Mutation check (performed by hand): ``_compile_here_or_isolated`` compiling every
    architecture in-process makes the gfx942 kernels carry ``v_cvt_scalef32`` and this fail."""
    import json
    import os
    import subprocess
    import sys

    env = dict(os.environ, JAX_MXFP4_CACHE_DIR=str(tmp_path), JAX_PLATFORMS="cpu",
               TRITON_CACHE_DIR=str(tmp_path / "triton"))  # Triton's own cache hides the bug
    run = subprocess.run([sys.executable, "-c", CROSS_ARCH_SCRIPT, str(tmp_path)], env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    found = json.loads(run.stdout.strip().splitlines()[-1])
    assert found["gfx950"] and any(found["gfx950"]), found  # the probe sees gfx950's conversions
    assert found["gfx942"] and not any(found["gfx942"]), found
