"""The dynamic profile and the MI355X estimate of ``cdna_emulator.profile``, on a
snippet whose instruction mix, bytes and FLOPs are known exactly."""

from __future__ import annotations

import numpy as np
import pytest
from snippets import run_snippet

from cdna_emulator import format_profiles, mi355x, profile

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
    _, report = run_snippet(BODY, [lanes], ["v10"], report=True, trace=True)
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
    # one wave per CU (8 workgroups of one wave): at least its instructions' issue slots and
    # nops, a scalar load's and a global load's latency; the launch cost on top
    issue_floor = (22 + 8 + 4) * 4 / (mi355x.FITTED.clock_ghz * 1e9)
    assert est.busiest_cu > issue_floor
    assert est.seconds == pytest.approx(max(est.busiest_cu, est.hbm) + est.launch)
    assert est.bound == "cu" and est.resident_workgroups == 1
    assert "MI355X est. us" in format_profiles([prof])


def test_profile_needs_a_traced_run():
    lanes = np.arange(64, dtype=np.uint32)
    _, report = run_snippet(BODY, [lanes], ["v10"], report=True)
    with pytest.raises(ValueError, match="trace=True"):
        profile(report)


def test_sampled_launch_scales_to_the_grid():
    """Running 2 of 8 workgroups gives the same per-wave counts, the same bytes scaled to the
    grid and, the workgroups doing the same work, the same estimate."""
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
                     memory=memory, workgroups=workgroups, trace=True)
        if workgroups is None:
            full = profile(report)
        else:
            sampled = profile(report)
            assert report.workgroups_run == 2 and out[64:448].sum() == 0
    assert sampled.sampled and sampled.waves == full.waves
    assert sampled.per_wave == full.per_wave
    assert sampled.global_bytes_read == full.global_bytes_read
    assert sampled.estimate.seconds == pytest.approx(full.estimate.seconds, rel=0.02)


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
