"""The dynamic profile and the MI355X estimate of ``cdna_emulator.profile``, on a
snippet whose instruction mix, bytes and FLOPs are known exactly."""

from __future__ import annotations

import numpy as np
import pytest
from snippets import run_snippet

from cdna_emulator import format_profiles, profile, profiling

BODY = """
    v_add_u32_e32 v10, v2, v2
    v_add_u32_e32 v10, v10, v2
    v_exp_f32_e32 v11, v2
    s_add_u32 s20, s20, 1
    v_mov_b32_e32 v30, 0
    v_mov_b32_e32 v31, 0
    v_mov_b32_e32 v32, 0
    v_mov_b32_e32 v33, 0
    v_mfma_f32_16x16x16_f16 v[40:43], v[30:31], v[32:33], 0
    s_nop 7
    s_nop 3
"""


def test_counts_bytes_flops_and_estimate():
    """8 waves of one workgroup each. Per wave: the harness's 5 + 2 SALU, 3 global loads...
    counted from the snippet kernel's text."""
    lanes = np.arange(8 * 64, dtype=np.uint32)
    _, report = run_snippet(BODY, [lanes], ["v10"], report=True)
    prof = profile(report)
    assert prof.waves == 8 and not prof.sampled
    # body: 2 + 1 + 4 VALU, 1 SALU, 1 MFMA, 2 nops; harness: v_lshl_add, v_lshlrev (VALU),
    # s_add/s_addc per plane (1 in, 1 out), 2 s_load, 2 waits, 1 load, 1 store, s_endpgm.
    assert prof.per_wave["valu"] == 9 and prof.per_wave["mfma"] == 1
    assert prof.per_wave["salu"] == 5 and prof.per_wave["smem"] == 2
    assert prof.per_wave["global_load"] == 1 and prof.per_wave["global_store"] == 1
    assert prof.per_wave["nop"] == 2 and prof.per_wave["end"] == 1
    assert prof.global_bytes_read == 8 * 64 * 4 and prof.global_bytes_written == 8 * 64 * 4
    assert prof.mfma_flops == {"f16": 8 * 2 * 16 * 16 * 16}
    est = prof.estimate
    cycles = (8 * 2 * 16 * 16 * 16 / 1024
              + 8 * (8 * profiling.VALU_CYCLES + profiling.TRANSCENDENTAL_CYCLES)
              + 8 * (5 + 2 + 2 + 2 + 1 + 1 + 1)) / 8
    assert est.compute == pytest.approx(cycles / profiling.CLOCK_HZ)
    bytes_ = 2 * 8 * 64 * 4
    assert est.memory == pytest.approx(max(bytes_ / profiling.HBM_BYTES_PER_S, bytes_ / (
        8 * profiling.CU_MEMORY_BYTES_PER_CYCLE * profiling.CLOCK_HZ)))
    assert est.latency == pytest.approx(profiling.WAIT_LATENCY)  # one vmcnt(0) per wave
    assert est.seconds == max(est.memory, est.compute, est.lds, est.latency)
    assert "MI355X est. us" in format_profiles([prof])


def test_sampled_launch_scales_to_the_grid():
    """Running 2 of 8 workgroups gives the same per-wave counts and 4x the bytes."""
    from snippets import IN_BASE, OUT_BASE, kernel_text

    from cdna_emulator import Memory, Program, run

    text = kernel_text(BODY, 1, ["v10"], arch="gfx950", vgprs=64)
    kernel = Program.from_asm(text).kernel("snippet")
    full = sampled = None
    for workgroups in (None, 2):
        data = np.zeros(8 * 64, np.uint32)
        out = np.zeros(8 * 64, np.uint32)
        memory = Memory()
        memory.map(IN_BASE, data.view(np.uint8), writable=False, name="in")
        memory.map(OUT_BASE, out.view(np.uint8), writable=True, name="out")
        kernarg = (IN_BASE.to_bytes(8, "little") + OUT_BASE.to_bytes(8, "little")
                   + (8 * 64 * 4).to_bytes(4, "little") + bytes(4))
        report = run(kernel, grid=(8, 1, 1), block=(64, 1, 1), kernarg=kernarg,
                     memory=memory, workgroups=workgroups)
        if workgroups is None:
            full = profile(report)
        else:
            sampled = profile(report)
            assert report.workgroups_run == 2 and out[64:448].sum() == 0
    assert sampled.sampled and sampled.waves == full.waves
    assert sampled.per_wave == full.per_wave
    assert sampled.global_bytes_read == full.global_bytes_read
    assert sampled.estimate.seconds == pytest.approx(full.estimate.seconds)


def test_emulate_command_profiles_the_lowerings_launches(built, monkeypatch):
    """``python -m jax_mxfp4 emulate --profile`` on one decode cell: the FlyDSL split-K
    attention and its merge, exactly as the gfx950 lowering launches them (grid from the split
    plan), one sampled workgroup each, with positive counts scaled to the grid."""
    from jax_mxfp4_tools.emulate_profile import profile_cells

    monkeypatch.setenv("JAX_MXFP4_KERNEL_DIR", str(built[0]))
    table = profile_cells("gfx950", ["decode 8 rows x 16 pages"], 1, True)
    rows = [line.split() for line in table.splitlines() if line.startswith("sparse_attention")]
    kernels = [next(w for w in row if w.startswith("jax_mxfp4_")) for row in rows]
    assert kernels == ["jax_mxfp4_sparse_attention_qbf16_g16_bf16_split",
                       "jax_mxfp4_attention_merge_g16_bf16"], table
    split = rows[0][rows[0].index(kernels[0]) + 1:]
    assert split[0] == "8x8x1" and split[1] == "256", table  # 8 rows x 8 splits, 4 waves each
    assert all(float(x) >= 0 for x in split[2:-2]) and float(split[2]) > 0, table


def test_latency_floor_overlaps_the_resident_waves():
    """The waves a SIMD holds at once overlap their waits: 4 waves per SIMD of a kernel that
    fits 2 take two rounds, of one that fits 8 one round. Occupancy comes from the VGPRs
    (512 per lane per SIMD, granules of 8) and the LDS per workgroup (160 KiB per CU)."""
    import dataclasses

    lanes = np.arange(8 * 64, dtype=np.uint32)
    _, report = run_snippet(BODY, [lanes], ["v10"], report=True)
    assert profiling.resident_waves(256, 0, 1) == 2 and profiling.resident_waves(64, 0, 1) == 8
    assert profiling.resident_waves(100, 0, 1) == 4  # 104 after rounding: 512 // 104
    assert profiling.resident_waves(64, 80 * 1024, 4) == 2  # 2 workgroups of 4 waves on 4 SIMDs
    many = dataclasses.replace(report,
                               workgroups=4 * profiling.CUS * profiling.SIMDS_PER_CU * 8 // 8,
                               workgroups_run=8)
    for vgprs, rounds in ((256, 2), (64, 1)):
        est = profile(dataclasses.replace(many, vgprs=vgprs)).estimate
        assert est.latency == pytest.approx(rounds * profiling.WAIT_LATENCY), vgprs
