"""Global-to-LDS DMA loads (``cdna_emulator/lds_dma.py``): ``buffer_load_<size> ... lds`` and
``global_load_lds_<size>``, as hand-written snippets whose expected LDS contents follow from
the ISA rule (docs/notes.md, "Global-to-LDS DMA"):

    LDS address of lane i = M0 offset + inst_offset + i * stride,
    stride 4 up to a dword (sub-dword data extended to the dword), 16 for dwordx3/dwordx4,

with the memory side the ordinary buffer / global address (a buffer lane past num_records
reads 0), EXEC-inactive lanes writing nothing, and the LDS bytes in flight on vmcnt.

Each test reads the LDS back with ``ds_read`` after ``s_waitcnt vmcnt(0)`` and compares it
with the source words the rule names.

Mutation checks (by hand, each undone after): the LDS address without ``inst_offset``
(``lds_addresses``) made test_global_dword_lands_at_m0_plus_offset_plus_lane,
test_global_dwordx4_lane_stride_16, test_buffer_dwordx4_lane_stride_16 and
test_partial_exec_writes_only_active_lane_slots fail; the lane stride equal to the load size
(1, 2, 4, 12, 16, as AMD rocJITsu's interpreter has it) made
test_buffer_dwordx3_writes_three_dwords_of_sixteen_bytes and
test_signed_and_unsigned_bytes_are_extended_to_the_lane_dword fail; the LDS bytes not put in
flight made test_ds_read_before_the_vmcnt_wait_is_a_waitcnt_fault and
test_another_wave_needs_the_issuing_wave_to_wait_before_the_barrier fail.
"""

from __future__ import annotations

import numpy as np
import pytest
from snippets import run_snippet as _run_snippet

from cdna_emulator import EmulatorFault, mi355x
from cdna_emulator.cu_model import (
    END,
    LOAD,
    WAIT,
    InstructionTable,
    LineShares,
    Rates,
    WaveTrace,
    instruction_table,
    simulate_cu,
)

LANES = np.arange(64, dtype=np.uint32)
SENTINEL = 0xDEADBEEF
RSRC = """
    s_mov_b32 s12, s4
    s_and_b32 s13, s5, 0xffff
    s_mov_b32 s14, {records}
    s_mov_b32 s15, 0x27000
"""  # a raw buffer resource over the input planes: base s[4:5], stride 0


def run_snippet(body: str, *args, **kwargs):
    """``snippets.run_snippet`` with s[4:5] reloaded to the input planes' base first (the
    snippet's prologue advanced it past them)."""
    return _run_snippet("s_load_dwordx2 s[4:5], s[0:1], 0x0\ns_waitcnt lgkmcnt(0)\n" + body,
                        *args, **kwargs)


def source(planes: int, seed: int = 0) -> np.ndarray:
    """uint32 ``[planes, 64]``: the snippet's input planes, the DMA's memory (row-major)."""
    return np.random.default_rng(seed).integers(0, 2**32, (planes, 64), dtype=np.uint32)


def words(src: np.ndarray) -> np.ndarray:
    """The input planes as the flat dword array the kernel's memory holds."""
    return src.reshape(-1)


def prefill(base: int) -> str:
    """Body lines writing SENTINEL to LDS dwords ``base + 4 * (0..255)`` (4 per lane), so
    that a slot the DMA leaves alone is visible."""
    return f"""
    v_mov_b32 v30, {SENTINEL:#x}
    v_lshlrev_b32 v31, 4, v0
    ds_write_b32 v31, v30 offset:{base}
    ds_write_b32 v31, v30 offset:{base + 4}
    ds_write_b32 v31, v30 offset:{base + 8}
    ds_write_b32 v31, v30 offset:{base + 12}
    s_waitcnt lgkmcnt(0)
    """


@pytest.mark.parametrize("arch", ["gfx950", "gfx942"])
def test_global_dword_lands_at_m0_plus_offset_plus_lane(arch):
    """``global_load_lds_dword v1, s[4:5] offset:16`` with M0 = 0x100: lane i reads the dword
    at byte 4i + 16 of the input and writes LDS[0x100 + 16 + 4i]."""
    src = source(2)
    out = run_snippet("""
        s_movk_i32 m0, 0x100
        global_load_lds_dword v1, s[4:5] offset:16
        s_waitcnt vmcnt(0)
        ds_read_b32 v10, v1 offset:0x110
        s_waitcnt lgkmcnt(0)
    """, list(src), ["v10"], lds=1024, arch=arch)
    np.testing.assert_array_equal(out[0], words(src)[LANES + 4])


@pytest.mark.parametrize("arch", ["gfx950", "gfx942"])
def test_m0_bits_outside_the_lds_offset_are_ignored(arch):
    """Only M0's LDS-offset bits count: the global form takes M0[17:2] * 4 (0xfffc0102 ->
    0x100, the low two bits dropped), MUBUF M0[17:0] (gfx950) / M0[15:0] (gfx942) as bytes
    (0xfffc0100 -> 0x100 on both)."""
    src = source(2)
    out = run_snippet(RSRC.format(records=512) + """
        s_mov_b32 m0, 0xfffc0102
        global_load_lds_dword v1, s[4:5]
        s_mov_b32 m0, 0xfffc0100
        buffer_load_dword v1, s[12:15], 0 offen offset:256 lds
        s_waitcnt vmcnt(0)
        ds_read_b32 v10, v1 offset:0x100
        ds_read_b32 v11, v1 offset:0x200
        s_waitcnt lgkmcnt(0)
    """, list(src), ["v10", "v11"], lds=1024, arch=arch)
    np.testing.assert_array_equal(out[0], src[0])
    np.testing.assert_array_equal(out[1], src[1])


def test_legacy_spelling_with_an_ignored_vdata_operand():
    """Older LLVM (14, gfx90a) printed ``buffer_load_dword v5, v1, s[..], 0 offen lds`` with a
    vdata the hardware ignores ("If lds is specified, this operand is ignored by H/W"): the
    same load as LLVM's current ``buffer_load_dword v1, s[..], 0 offen lds``."""
    src = source(1)
    out = run_snippet(RSRC.format(records=256) + """
        s_mov_b32 m0, 0
        buffer_load_dword v5, v1, s[12:15], 0 offen lds
        s_waitcnt vmcnt(0)
        ds_read_b32 v10, v1
        s_waitcnt lgkmcnt(0)
    """, list(src), ["v10"], lds=1024)
    np.testing.assert_array_equal(out[0], src[0])


def test_global_dwordx4_lane_stride_16():
    """``global_load_lds_dwordx4 v11, s[4:5] offset:32`` with M0 = 0x200 (gfx950): lane i's
    16 bytes from input byte 16i + 32 land at LDS[0x200 + 32 + 16i]."""
    src = source(5)
    out = run_snippet("""
        v_lshlrev_b32 v11, 4, v0
        s_movk_i32 m0, 0x200
        global_load_lds_dwordx4 v11, s[4:5] offset:32
        s_waitcnt vmcnt(0)
        ds_read_b128 v[12:15], v11 offset:0x220
        s_waitcnt lgkmcnt(0)
    """, list(src), ["v12", "v13", "v14", "v15"], lds=2048)
    want = words(src)[(4 * LANES + 8)[None, :] + np.arange(4)[:, None]]
    np.testing.assert_array_equal(out, want)


def test_buffer_dwordx4_lane_stride_16():
    """``buffer_load_dwordx4 v11, s[12:15], 0 offen offset:48 lds`` with M0 = 0x40: lane i's
    16 bytes from buffer byte 16i + 48 land at LDS[0x40 + 48 + 16i]; the VGPR offset and
    soffset are memory-side only."""
    src = source(5)
    out = run_snippet(RSRC.format(records=5 * 256) + """
        v_lshlrev_b32 v11, 4, v0
        s_mov_b32 m0, 0x40
        buffer_load_dwordx4 v11, s[12:15], 0 offen offset:48 lds
        s_waitcnt vmcnt(0)
        ds_read_b128 v[12:15], v11 offset:0x70
        s_waitcnt lgkmcnt(0)
    """, list(src), ["v12", "v13", "v14", "v15"], lds=2048)
    want = words(src)[(4 * LANES + 12)[None, :] + np.arange(4)[:, None]]
    np.testing.assert_array_equal(out, want)


def test_buffer_dwordx3_writes_three_dwords_of_sixteen_bytes():
    """``buffer_load_dwordx3 ... lds``: lane stride 16, three dwords written, the fourth left
    as it was (the CDNA4 ISA: "LOAD_DWORDX3 writes 3 dwords and skips the 4th")."""
    src = source(4)
    out = run_snippet(prefill(0) + RSRC.format(records=4 * 256) + """
        v_mul_u32_u24 v11, 12, v0
        v_lshlrev_b32 v16, 4, v0
        s_mov_b32 m0, 0
        buffer_load_dwordx3 v11, s[12:15], 0 offen lds
        s_waitcnt vmcnt(0)
        ds_read_b128 v[12:15], v16
        s_waitcnt lgkmcnt(0)
    """, list(src), ["v12", "v13", "v14", "v15"], lds=1024)
    want = words(src)[(3 * LANES)[None, :] + np.arange(3)[:, None]]
    np.testing.assert_array_equal(out[:3], want)
    np.testing.assert_array_equal(out[3], np.full(64, SENTINEL, np.uint32))


def test_partial_exec_writes_only_active_lane_slots():
    """EXEC = lanes 0-15 and 32-47: those lanes write their slot M0 + offset + 4i (their
    place is the lane index, not the rank among active lanes); the others' slots keep the
    prefilled sentinel."""
    src = source(2)
    out = run_snippet(prefill(0) + """
        s_mov_b32 m0, 0x80
        s_mov_b32 exec_lo, 0xffff
        s_mov_b32 exec_hi, 0xffff
        global_load_lds_dword v1, s[4:5] offset:8
        s_mov_b64 exec, -1
        s_waitcnt vmcnt(0)
        ds_read_b32 v10, v1 offset:0x88
        s_waitcnt lgkmcnt(0)
    """, list(src), ["v10"], lds=2048)
    active = (LANES % 32) < 16
    np.testing.assert_array_equal(out[0][active], words(src)[LANES + 2][active])
    np.testing.assert_array_equal(out[0][~active], np.full(32, SENTINEL, np.uint32))


@pytest.mark.parametrize("arch", ["gfx950", "gfx942"])
def test_signed_and_unsigned_bytes_are_extended_to_the_lane_dword(arch):
    """``buffer_load_sbyte ... lds`` / ``buffer_load_ubyte ... lds`` of byte i to lane i: the
    lane's LDS dword (stride 4) holds the byte sign- / zero-extended to 32 bits; likewise
    ``global_load_lds_sshort`` for 16 bits."""
    src = source(2, seed=1)  # random bytes: both signs of bytes and halves
    out = run_snippet(RSRC.format(records=512) + """
        s_mov_b32 m0, 0
        buffer_load_sbyte v0, s[12:15], 0 offen lds
        s_movk_i32 m0, 0x100
        buffer_load_ubyte v0, s[12:15], 0 offen lds
        v_lshlrev_b32 v11, 1, v0
        s_movk_i32 m0, 0x200
        global_load_lds_sshort v11, s[4:5]
        s_waitcnt vmcnt(0)
        ds_read_b32 v10, v1
        ds_read_b32 v12, v1 offset:0x100
        ds_read_b32 v13, v1 offset:0x200
        s_waitcnt lgkmcnt(0)
    """, list(src), ["v10", "v12", "v13"], lds=1024, arch=arch)
    raw = src.reshape(-1).view(np.uint8)
    np.testing.assert_array_equal(out[0], raw[:64].view(np.int8).astype(np.int32).view(np.uint32))
    np.testing.assert_array_equal(out[1], raw[:64].astype(np.uint32))
    halves = src.reshape(-1).view(np.int16)[:64]
    np.testing.assert_array_equal(out[2], halves.astype(np.int32).view(np.uint32))


def test_buffer_lanes_past_num_records_write_zero():
    """num_records = 100 bytes: lanes 0-24 (offset 4i + 4 <= 100) load their dword, lanes
    25-63 are out of range and write 0 to their LDS slot (the emulator's buffer bounds rule:
    an out-of-range lane reads 0), over the prefilled sentinel."""
    src = source(1)
    out = run_snippet(prefill(0) + RSRC.format(records=100) + """
        s_mov_b32 m0, 0
        buffer_load_dword v1, s[12:15], 0 offen lds
        s_waitcnt vmcnt(0)
        ds_read_b32 v10, v1
        s_waitcnt lgkmcnt(0)
    """, list(src), ["v10"], lds=1024)
    inside = LANES < 25
    np.testing.assert_array_equal(out[0][inside], src[0][inside])
    np.testing.assert_array_equal(out[0][~inside], np.zeros(39, np.uint32))


def test_ds_read_before_the_vmcnt_wait_is_a_waitcnt_fault():
    """The DMA's LDS bytes are in flight on vmcnt: a ds_read of them after only ``s_waitcnt
    lgkmcnt(0)`` is a ``waitcnt`` fault; a ds_read of bytes it does not write is not."""
    body = """
        s_movk_i32 m0, 0x100
        global_load_lds_dword v1, s[4:5]
        s_waitcnt lgkmcnt(0)
        ds_read_b32 v10, v1 offset:{offset}
        s_waitcnt vmcnt(0) lgkmcnt(0)
    """
    src = source(1)
    with pytest.raises(EmulatorFault) as info:
        run_snippet(body.format(offset=0x100), list(src), ["v10"], lds=1024)
    assert info.value.kind == "waitcnt", info.value
    assert "LDS DMA" in info.value.message
    run_snippet(prefill(0x200) + body.format(offset=0x200), list(src), ["v10"], lds=2048)


def test_another_wave_needs_the_issuing_wave_to_wait_before_the_barrier():
    """Two waves each DMA 64 dwords into their own 256-byte region, meet at s_barrier and read
    the other's region: with ``s_waitcnt vmcnt(0)`` before the barrier they read the other
    wave's data; without it the read is a ``waitcnt`` fault (the issuer never retired it)."""
    body = """
        v_readfirstlane_b32 s9, v0
        s_lshr_b32 s9, s9, 6
        s_lshl_b32 s10, s9, 8
        s_mov_b32 m0, s10
        v_and_b32 v20, 63, v0
        v_lshlrev_b32 v20, 2, v20
        global_load_lds_dword v1, s[4:5]
        {wait}
        s_barrier
        s_xor_b32 s10, s10, 0x100
        v_add_u32 v21, s10, v20
        ds_read_b32 v10, v21
        s_waitcnt lgkmcnt(0)
    """
    src = source(1, seed=3)
    src2 = np.concatenate([src, source(1, seed=4)], axis=1)
    out = run_snippet(body.format(wait="s_waitcnt vmcnt(0)"), [src2[0]], ["v10"], lds=512,
                      block=128)
    np.testing.assert_array_equal(out[0], np.concatenate([src2[0][64:], src2[0][:64]]))
    with pytest.raises(EmulatorFault) as info:
        run_snippet(body.format(wait=""), [src2[0]], ["v10"], lds=512, block=128)
    assert info.value.kind == "waitcnt", info.value


def test_lds_address_outside_the_allocation_is_an_lds_range_fault():
    """M0 = 0x3F0 with 1 KiB of LDS: lane 4 onwards would write past the allocation."""
    with pytest.raises(EmulatorFault) as info:
        run_snippet("""
            s_movk_i32 m0, 0x3f0
            global_load_lds_dword v1, s[4:5]
            s_waitcnt vmcnt(0)
        """, [LANES], ["v2"], lds=1024)
    assert info.value.kind == "lds-range", info.value


@pytest.mark.parametrize("line, arch", [
    ("buffer_load_dwordx4 v11, s[12:15], 0 offen lds", "gfx942"),  # gfx950-only width
    ("global_load_lds_dwordx4 v1, s[4:5]", "gfx942"),
    ("buffer_load_dwordx2 v1, s[12:15], 0 offen lds", "gfx950"),  # no DMA form
    ("buffer_load_format_x v1, s[12:15], 0 offen lds", "gfx950"),
    ("buffer_load_dword v1, s[12:15], 0 idxen lds", "gfx950"),
    ("buffer_load_dword v1, s[12:15], 0 offen lds tfe", "gfx950"),
    ("scratch_load_lds_dword v1, off", "gfx950"),
])
def test_unmodelled_dma_variants_are_refused(line, arch):
    """What the emulator does not model stays an ``unsupported`` fault naming the line."""
    with pytest.raises(EmulatorFault) as info:
        run_snippet(RSRC.format(records=256) + line, [LANES], ["v2"], lds=1024, arch=arch)
    assert info.value.kind == "unsupported", info.value
    assert line.split()[0] in info.value.instruction


def test_dma_is_traced_as_a_load_and_counts_its_lds_write():
    """The DMA is a vector memory load for the trace (its 128-byte lines: 64 lanes x 16 B =
    8 lines) and the report (global bytes read), its LDS write counts as LDS bytes written,
    and the timing model's table gives it the LDS bytes one wave writes (64 x 16)."""
    src = source(5)
    _, report = run_snippet("""
        v_lshlrev_b32 v11, 4, v0
        s_mov_b32 m0, 0
        global_load_lds_dwordx4 v11, s[4:5]
        s_waitcnt vmcnt(0)
    """, list(src), ["v2"], lds=1024, report=True, trace=True)
    dma = next(i for i in report.code if i.mnemonic == "global_load_lds_dwordx4")
    assert dma.cls == "global_load"
    accesses = report.trace.accesses(report.trace.waves[0])
    # five input planes (2 lines each), the DMA, the output store
    assert [a.size for a in accesses] == [2] * 5 + [8] + [2]
    assert report.lds_bytes_written == 64 * 16
    assert report.global_bytes_read == 5 * 64 * 4 + 64 * 16
    assert instruction_table(report.code).lds_bytes[dma.pc] == 64 * 16


def test_timing_model_adds_the_dma_lds_write_to_the_load():
    """cu_model: a load whose table row has ``lds_bytes`` (an LDS DMA) completes that many
    bytes over the LDS rate (128 B a clock) later than the same load without, and that time
    counts as LDS busy time."""
    fitted = mi355x.Fitted(launch_us=0.0, clock_ghz=2.4, l1_cycles=100, l2_cycles=300,
                           hbm_cycles=1000)

    def cycles(lds_bytes):
        table = InstructionTable([LOAD, WAIT, END], [0.0] * 3, [-1, 0, -1], [-1] * 3,
                                 [lds_bytes, 0, 0], [()] * 3, [()] * 3)
        wave = WaveTrace([0, 1, 2], [np.arange(8)], 0, 0)
        return simulate_cu([wave], table, shares=LineShares(), rates=Rates(l2=1e9),
                           fitted=fitted)
    plain, dma = cycles(0), cycles(64 * 16)
    assert dma.cycles - plain.cycles == 64 * 16 / mi355x.LDS_BYTES_PER_CYCLE
    assert dma.busy["lds"] == 64 * 16 / mi355x.LDS_BYTES_PER_CYCLE
