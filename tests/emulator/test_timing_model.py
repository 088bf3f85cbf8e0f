"""The MI355X timing model (``cdna_emulator.cu_model`` and ``timing``) on traces whose time
follows from its rules by hand: issue opportunities every 4 clocks, one instruction per wave
and per type, pipes busy for their cycles, dependent VALU results after 8 clocks, wait
states, waitcnts and barriers; then the L2 sharing estimate, the sample's clusters and the
grid's busiest slot."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cdna_emulator import cu_model, mi355x, timing
from cdna_emulator.cu_model import (
    BARRIER,
    END,
    LOAD,
    MFMA,
    NOP,
    VALU,
    WAIT,
    InstructionTable,
    LineShares,
    Rates,
    WaveTrace,
    simulate_cu,
)

FAST = Rates(l2=1e9)  # an L2 rate that never queues
FIT = mi355x.Fitted(launch_us=0.0, clock_ghz=2.4, l1_cycles=100, l2_cycles=300,
                    hbm_cycles=1000)


def table(*rows) -> InstructionTable:
    """An instruction table from (kind, cycles, reads, writes, vmcnt) rows."""
    t = InstructionTable([], [], [], [], [], [], [])
    for kind, cycles, reads, writes, vmcnt in rows:
        t.kind.append(kind)
        t.cycles.append(cycles)
        t.reads.append(tuple(reads))
        t.writes.append(tuple(writes))
        t.vmcnt.append(vmcnt)
        t.lgkmcnt.append(-1)
        t.lds_bytes.append(0)
    return t


NO_SHARES = LineShares()


def run(t, paths, simds, accesses=None, shares=NO_SHARES, groups=None) -> float:
    waves = [WaveTrace(list(p), (accesses or {}).get(i, []), (groups or [0] * len(paths))[i],
                       s) for i, (p, s) in enumerate(zip(paths, simds, strict=True))]
    return simulate_cu(waves, t, shares=shares, rates=FAST, fitted=FIT).cycles


def valu(reads=(), writes=(), cycles=mi355x.VALU_CYCLES):
    return (VALU, cycles, reads, writes, -1)


END_ROW = (END, 0, (), (), -1)


def test_independent_valu_issue_every_four_clocks():
    t = table(valu(writes=(1,)), END_ROW)
    assert run(t, [[0] * 10 + [1]], [0]) == 10 * mi355x.ISSUE_PERIOD


def test_dependent_valu_waits_for_its_result():
    """Each VALU reads the previous one's result: 8 clocks apart, not 4."""
    t = table(valu(reads=(1,), writes=(1,)), END_ROW)
    n = 6
    assert run(t, [[0] * n + [1]], [0]) == (n - 1) * mi355x.VALU_DEPENDENT_CYCLES + 4


def test_two_waves_share_one_simds_valu_and_overlap_on_two():
    t = table(valu(writes=(1,)), END_ROW)
    path = [0] * 10 + [1]
    # one SIMD: one VALU per opportunity between the two waves -> 20 opportunities
    assert run(t, [path, path], [0, 0]) == 20 * 4 - 4 + 4
    # two SIMDs: side by side, SIMD 1's opportunities one clock later
    assert run(t, [path, path], [0, 1]) == 10 * 4 + 1


def test_one_instruction_of_a_type_per_opportunity():
    """Two waves of scalar ALU work on one SIMD take turns (one SALU an opportunity); a
    scalar and a VALU wave issue together."""
    t = table((cu_model.SALU, 0, (), (), -1), valu(writes=(1,)), END_ROW)
    scalar, vector = [0] * 10 + [2], [1] * 10 + [2]
    assert run(t, [scalar, scalar], [0, 0]) == 20 * 4
    assert run(t, [scalar, vector], [0, 0]) == 10 * 4


def test_mfma_holds_the_matrix_core_and_nop_its_wave():
    t = table((MFMA, 64.0, (), (), -1), (NOP, 8 * mi355x.WAIT_STATE_CYCLES, (), (), -1),
              END_ROW)
    assert run(t, [[0, 0, 2]], [0]) == 64 + 4  # the second MFMA waits for the first
    assert run(t, [[1, 2]], [0]) == 8 * mi355x.WAIT_STATE_CYCLES


def test_waitcnt_waits_for_the_load_and_its_lines():
    """A load of 4 lines served from L2, then vmcnt(0): done after the L2 latency."""
    t = table((LOAD, 0, (), (), -1), (WAIT, 0, (), (), 0), END_ROW)
    lines = {0: [np.arange(4)]}
    cycles = run(t, [[0, 1, 2]], [0], accesses=lines)
    assert cycles == pytest.approx(FIT.l2_cycles + 4, abs=4)
    # all of it from HBM: the HBM latency
    cycles = run(t, [[0, 1, 2]], [0], accesses=lines, shares=LineShares(hbm=1.0))
    assert cycles == pytest.approx(FIT.hbm_cycles + 4, abs=4)


def test_barrier_holds_waves_until_their_workgroup_arrives():
    t = table(valu(writes=(1,)), (BARRIER, 0, (), (), -1), END_ROW)
    slow, fast = [0] * 20 + [1, 0, 2], [1, 0, 2]
    cycles = run(t, [slow, fast], [0, 1])
    assert cycles >= 20 * 4 + 4  # the fast wave's VALU comes after the slow one's 20
    # in another workgroup, the fast wave does not wait
    assert run(t, [fast], [1]) < 20


def test_misses_count_first_touches_and_evictions():
    lines = np.array([1, 2, 1, 3, 1])
    owner = np.array([0, 0, 1, 1, 1])
    assert list(timing._misses(lines, owner, 2, 1 << 20, 1.0)) == [2, 1]
    # a cache of one line loses line 1 once two new lines came in since its first touch
    assert list(timing._misses(lines, owner, 2, 128, 1.0)) == [2, 2]


def test_sample_is_clusters_of_dispatch_neighbours_on_one_xcd():
    grid = (64, 4, 1)
    ids = timing.sample_workgroups(grid, 16)
    order = {tuple(g): i for i, g in enumerate(timing.dispatch_order(grid).tolist())}
    index = sorted(order[tuple(g)] for g in ids.tolist())
    assert len(index) == 16
    assert {i % mi355x.XCDS for i in index[:8]} == {index[0] % mi355x.XCDS}
    assert np.diff(index[:8]).tolist() == [mi355x.XCDS] * 7


def test_makespan_is_the_busiest_slot():
    """16 workgroups on 8 XCDs x 32 CUs: one each, the longest decides; with 1 slot per CU
    and 8 * 32 * 2 workgroups, every slot runs two."""
    assert timing.makespan(16, {0: 1.0, 15: 3.0}, 1) == 3.0
    total = mi355x.XCDS * timing.CUS_PER_XCD * 2
    assert timing.makespan(total, {0: 1.0}, 1) == 2.0


def test_resident_workgroups_from_vgprs_and_lds():
    assert cu_model.resident_workgroups(128, 0, 8) == 2  # 4 waves a SIMD, 2 per workgroup
    assert cu_model.resident_workgroups(64, 64 << 10, 4) == 2  # LDS: 160 KiB / 64 KiB
    assert cu_model.resident_workgroups(512, 0, 4) == 1


CALIBRATION = Path(__file__).resolve().parents[3] / "shared" / "calibration" / "bundles"


@pytest.mark.skipif(not CALIBRATION.is_dir(), reason="the calibration bundles (../shared) "
                    "are on the development machine only")
def test_calibration_cell_within_the_claimed_error():
    """The smallest calibration launch (aiter's scorer, b4 q512 ctx 8K, measured 8.8 us) is
    within the 1.23x that every printed estimate claims (bench/RESULTS.md, "Calibration")."""
    from cdna_emulator.bundle import read_bundle, run_bundle

    bundle = read_bundle(CALIBRATION / "b4_q512_ctx8K")
    report = run_bundle(bundle, workgroups=32, trace=True).report
    ratio = timing.estimate(report).seconds * 1e6 / bundle.measured_us
    assert 1 / 1.23 <= ratio <= 1.23, ratio
