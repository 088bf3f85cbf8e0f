"""What the API fuzz of the emulated backends found in the emulator (issue 43,
tests/test_emulated_fuzz.py; cdna_emulator/README.md, "Findings of the API fuzz"), one
snippet per gap or tracking error, each against the ISA pseudocode's result or the fault
model's rule.

Mutation checks (by hand; each made the named test fail): the 16-bit shifts taking both
halves' counts from the low half (test_packed_16_bit_shifts_follow_the_pseudocode); the
atomics performed all lanes at once (test_atomics_on_one_dword_take_the_lanes_in_turn);
``buffer_wbl2`` not counted on vmcnt (test_cache_control_counts_on_vmcnt); ds_permute's
lowest lane winning (test_ds_permute_sends_forward_highest_lane_wins); ``lane_defined``
returning a view of the definedness plane again
(test_an_instruction_overwriting_its_undefined_source_stays_undefined);
``v_mad_u64_u32``'s low dword needing the addend's high dword
(test_mad_u64_low_dword_does_not_need_the_addend_high_dword); the word write of
``v_cvt_pk_fp8_f32`` tracked per lane again (test_word_writes_keep_each_half_definedness);
overlapping read-only regions refused
(test_read_only_regions_over_the_same_memory_may_overlap).
"""

from __future__ import annotations

import struct

import ml_dtypes
import numpy as np
import pytest
from snippets import IN_BASE, OUT_BASE, f32_bits, kernel_text, run_snippet

from cdna_emulator import EmulatorFault, Memory, Program, run
from cdna_emulator.memory import AccessError

LANES = np.arange(64, dtype=np.uint32)
TABLE = 0x30_0000_0000


def expect_fault(kind, body, inputs=(LANES,), outputs=("v2",), **kw):
    with pytest.raises(EmulatorFault) as info:
        run_snippet(body, list(inputs), list(outputs), **kw)
    assert info.value.kind == kind, info.value
    return info.value


# ---- v_pk_lshlrev_b16 / v_pk_lshrrev_b16 / v_pk_ashrrev_i16 (Triton's index kernel) -----------

def test_packed_16_bit_shifts_follow_the_pseudocode():
    """Each half of S1 shifted by the low 4 bits of the same half of S0 (``S0.u32[3:0]`` /
    ``S0.u32[19:16]``), the halves as op_sel / op_sel_hi pick them; Triton's form shifts both
    halves by an inline constant (``8 ... op_sel_hi:[0,1]``)."""
    rng = np.random.default_rng(0)
    value, count = rng.integers(0, 2**32, (2, 64), dtype=np.uint32)
    out = run_snippet("""
        v_pk_lshlrev_b16 v10, v3, v2
        v_pk_lshrrev_b16 v11, v3, v2
        v_pk_ashrrev_i16 v12, v3, v2
        v_pk_lshlrev_b16 v13, 8, v2 op_sel_hi:[0,1]
        v_pk_lshrrev_b16 v14, v3, v2 op_sel:[1,0] op_sel_hi:[0,1]
    """, [value, count], ["v10", "v11", "v12", "v13", "v14"])
    lo, hi = value & 0xFFFF, value >> 16
    c_lo, c_hi = count & 15, (count >> 16) & 15

    def pack(a, b):
        return (a.astype(np.uint32) & 0xFFFF) | ((b.astype(np.uint32) & 0xFFFF) << 16)

    def ashr(x, c):
        return (x.astype(np.uint16).view(np.int16) >> c.astype(np.int16)).view(np.uint16)
    np.testing.assert_array_equal(out[0], pack(lo << c_lo, hi << c_hi))
    np.testing.assert_array_equal(out[1], pack(lo >> c_lo, hi >> c_hi))
    np.testing.assert_array_equal(out[2], pack(ashr(lo, c_lo), ashr(hi, c_hi)))
    np.testing.assert_array_equal(out[3], pack(lo << 8, hi << 8))
    np.testing.assert_array_equal(out[4], pack(lo >> c_hi, hi >> c_lo))


# ---- v_mbcnt, ds_permute (Triton's claim kernel) -------------------------------------------------

def test_mbcnt_counts_the_mask_bits_of_lower_lanes():
    """``D = S1 + popcount(S0 & ThreadMask[31:0])`` (lo) / ``[63:32]`` (hi), ThreadMask =
    ``(1 << lane) - 1``: with S0 = -1 the pair gives the lane id."""
    mask = np.full(64, 0x5A5A5A5A, np.uint32)
    out = run_snippet("""
        v_mbcnt_lo_u32_b32 v10, -1, 0
        v_mbcnt_hi_u32_b32 v10, -1, v10
        v_mbcnt_lo_u32_b32 v11, v2, 7
        v_mbcnt_hi_u32_b32 v12, v2, 0
    """, [mask], ["v10", "v11", "v12"])
    below = [(1 << lane) - 1 for lane in range(64)]
    lo = np.array([bin(0x5A5A5A5A & b & 0xFFFFFFFF).count("1") for b in below])
    hi = np.array([bin(0x5A5A5A5A & (b >> 32)).count("1") for b in below])
    np.testing.assert_array_equal(out[0], LANES)
    np.testing.assert_array_equal(out[1], lo + 7)
    np.testing.assert_array_equal(out[2], hi)


def test_ds_permute_sends_forward_highest_lane_wins():
    """Active lane i sends its data to lane ``addr / 4 % 64``; the highest sender wins, an
    active lane nobody sent to gets 0, an inactive one keeps its value (DS_PERMUTE_B32
    pseudocode). Only the even lanes are active, and lanes 4k and 4k + 2 both send to lane
    2k."""
    data = LANES * 1000 + 1
    target = (LANES // 4) * 2 * 4
    out = run_snippet("""
        v_mov_b32_e32 v10, 0x1234
        v_and_b32_e32 v12, 1, v0
        v_cmp_eq_u32_e32 vcc, 0, v12
        s_and_saveexec_b64 s[20:21], vcc
        ds_permute_b32 v10, v3, v2
        s_waitcnt lgkmcnt(0)
        s_or_b64 exec, exec, s[20:21]
    """, [data, target], ["v10"])[0]
    want = np.full(64, 0x1234, np.uint32)
    want[::2] = 0  # active lanes nobody sends to
    for i in range(0, 64, 2):
        want[(i // 4) * 2] = data[i]  # in lane order: 4k + 2 overwrites 4k
    np.testing.assert_array_equal(out, want)


# ---- global atomics, buffer_wbl2 / buffer_inv ------------------------------------------------

def run_with_table(body, table, outputs, inputs=(LANES,)):
    """``run_snippet`` with ``table`` (uint32, writable) mapped at :data:`TABLE`, its
    address in s[10:11]; returns the outputs (``table`` is updated in place)."""
    setup = f"s_mov_b32 s10, {TABLE & 0xFFFFFFFF:#x}\ns_mov_b32 s11, {TABLE >> 32:#x}\n"
    inputs = np.ascontiguousarray(np.asarray(inputs, np.uint32).reshape(len(inputs), 64))
    out = np.zeros((len(outputs), 64), np.uint32)
    text = kernel_text(setup + body, len(inputs), list(outputs), arch="gfx942", vgprs=64)
    memory = Memory()
    memory.map(IN_BASE, inputs.reshape(-1).view(np.uint8), writable=False, name="in")
    memory.map(OUT_BASE, out.reshape(-1).view(np.uint8), writable=True, name="out")
    memory.map(TABLE, table.view(np.uint8), writable=True, name="table")
    kernarg = struct.pack("<QQI", IN_BASE, OUT_BASE, 64 * 4) + b"\0" * 4
    run(Program.from_asm(text).kernel("snippet"), grid=(1, 1, 1), block=(64, 1, 1),
        kernarg=kernarg, memory=memory, arch="gfx942")
    return out


def test_atomics_on_one_dword_take_the_lanes_in_turn():
    """Lane l: ``cmpswap`` dword l % 4 from 0 to l + 1 (returning the old value: the first
    lane of each dword sees 0 and wins, the later ones see its value), ``smax`` of l - 32
    into dword 4 + l % 8 (no return), ``add`` 1 into dword 20 (returning 0, 1, .., 63 in
    lane order); Triton's release/acquire fences around them (``buffer_wbl2 sc1``,
    ``buffer_inv sc1``)."""
    table = np.zeros(32, np.uint32)
    out = run_with_table("""
        v_and_b32_e32 v10, 3, v0
        v_lshlrev_b32_e32 v10, 2, v10
        v_add_u32_e32 v14, 1, v0
        v_mov_b32_e32 v15, 0
        buffer_wbl2 sc1
        global_atomic_cmpswap v12, v10, v[14:15], s[10:11] sc0
        s_waitcnt vmcnt(0)
        buffer_inv sc1
        v_and_b32_e32 v16, 7, v0
        v_lshlrev_b32_e32 v16, 2, v16
        v_subrev_u32_e32 v17, 32, v0
        global_atomic_smax v16, v17, s[10:11] offset:16
        v_mov_b32_e32 v18, 1
        v_mov_b32_e32 v19, 0
        global_atomic_add v13, v19, v18, s[10:11] offset:80 sc0
        s_waitcnt vmcnt(0)
    """, table, ["v12", "v13"])
    np.testing.assert_array_equal(table[:4], np.arange(4) + 1)
    np.testing.assert_array_equal(out[0], np.where(LANES < 4, 0, LANES % 4 + 1))
    np.testing.assert_array_equal(table[4:12].view(np.int32), np.arange(56, 64) - 32)
    np.testing.assert_array_equal(out[1], LANES)
    assert table[20] == 64


def test_an_atomic_is_a_load_for_waitcnt_and_a_store_for_memory():
    """Its returned value is in flight until ``s_waitcnt vmcnt``; on a read-only buffer it
    faults like a store."""
    expect_fault("waitcnt", """
        v_mov_b32_e32 v14, 1
        global_atomic_add v12, v1, v14, s[6:7] sc0
        v_mov_b32_e32 v2, v12
        s_waitcnt vmcnt(0)
    """)
    fault = expect_fault("memory", """
        v_mov_b32_e32 v14, 1
        global_atomic_add v1, v14, s[4:5] offset:-256
        s_waitcnt vmcnt(0)
    """)
    assert "read-only" in fault.message


def test_cache_control_counts_on_vmcnt():
    """``buffer_wbl2`` / ``buffer_inv`` move no data and count on vmcnt in order (LLVM
    waits ``vmcnt(0)`` after a ``buffer_wbl2``): a load before one is retired by
    ``vmcnt(1)``, a load after one is not."""
    load = "global_load_dword v10, v1, s[4:5] offset:-256"
    for fence in ("buffer_wbl2 sc1", "buffer_inv sc1"):
        run_snippet(f"{load}\n{fence}\ns_waitcnt vmcnt(1)\nv_mov_b32_e32 v2, v10\n"
                    "s_waitcnt vmcnt(0)", [LANES], ["v2"])
        expect_fault("waitcnt", f"{fence}\n{load}\ns_waitcnt vmcnt(1)\nv_mov_b32_e32 v2, v10\n"
                     "s_waitcnt vmcnt(0)")


# ---- definedness ---------------------------------------------------------------------------

def test_an_instruction_overwriting_its_undefined_source_stays_undefined():
    """``v10 = v2 + v10`` with v10 never written is undefined: the definedness of the sources
    is taken before the instruction writes its destination (it was a view of the plane the
    write then marked defined, so any in-place update of garbage became defined, e.g. the
    ``v_pk_fma_f32 v[148:149], v[52:53], v[148:149], ...`` of Triton's gfx950 attention)."""
    expect_fault("undefined", "v_add_u32_e32 v10, v2, v10", outputs=("v10",))
    expect_fault("undefined", "v_pk_fma_f32 v[10:11], v[2:3], v[10:11], v[2:3]",
                 inputs=(LANES, LANES), outputs=("v11",))


def test_mad_u64_low_dword_does_not_need_the_addend_high_dword():
    """``D[31:0] = (S0 * S1 + S2[31:0]) mod 2**32``: LLVM's 64 x 32-bit multiply adds into a
    pair whose high dword was never written and keeps the low dword (Triton's select_blocks:
    ``v_mad_u64_u32 v[18:19], s[18:19], v9, s24, v[18:19]``). The high dword stays
    undefined."""
    body = """
        v_mov_b32_e32 v12, 5
        v_mad_u64_u32 v[12:13], s[20:21], v2, v3, v[12:13]
    """
    a = LANES * 0x01000193 + 7
    b = LANES + 0xFFFF0000
    low = run_snippet(body, [a, b], ["v12"])[0]
    np.testing.assert_array_equal(low, (a.astype(np.uint64) * b + 5).astype(np.uint32))
    expect_fault("undefined", body, inputs=(a, b), outputs=("v13",))


def test_word_writes_keep_each_half_definedness():
    """``v_cvt_pk_fp8_f32`` writes one 16-bit word and keeps the other: after the low word
    (from defined values) and then the high word, the register is defined; after the low
    word alone, a read of the low word (``v_cvt_scalef32_pk_f16_fp8`` without op_sel) is
    defined and a read of the high word, or a store of the whole register, is not (Triton's
    gfx950 attention writes v48's low word from the query and its high word from other
    registers, then reads the low word)."""
    x = f32_bits(np.linspace(-3, 3, 64))
    both = run_snippet("""
        v_cvt_pk_fp8_f32 v10, v2, v3
        v_cvt_pk_fp8_f32 v10, v3, v2 op_sel:[0,0,1]
        v_cvt_scalef32_pk_f16_fp8 v11, v10, 1.0
    """, [x, x], ["v10", "v11"])
    codes = np.asarray(np.linspace(-3, 3, 64), ml_dtypes.float8_e4m3fn).view(np.uint8)
    np.testing.assert_array_equal(both[0] & 0xFF, codes)
    low_only = """
        v_cvt_pk_fp8_f32 v10, v2, v3
        v_cvt_scalef32_pk_f16_fp8 v11, v10, 1.0
        v_cvt_scalef32_pk_f16_fp8 v12, v10, 1.0 op_sel:[1,0,0]
    """
    low = run_snippet(low_only, [x, x], ["v11"])[0]
    np.testing.assert_array_equal(low, both[1])
    expect_fault("undefined", low_only, inputs=(x, x), outputs=("v12",))
    expect_fault("undefined", low_only, inputs=(x, x), outputs=("v10",))


# ---- overlapping buffers ---------------------------------------------------------------------

def test_read_only_regions_over_the_same_memory_may_overlap():
    """One array passed as ``k_pool`` and ``v_pool`` maps twice at one address: read-only
    windows onto the same host bytes merge (also nested and partly overlapping ones); an
    overlap with a writable region, or of read-only regions over different memory, is
    refused."""
    host = np.arange(256, dtype=np.uint32).view(np.uint8)  # 1024 bytes
    memory = Memory()
    memory.map(0x1000, host, writable=False, name="k_pool")
    memory.map(0x1000, host, writable=False, name="v_pool")
    memory.map(0x1100, host[256:512], writable=False, name="nested")
    addresses = np.array([0x1000, 0x13FC], np.uint64)
    np.testing.assert_array_equal(memory.read(addresses, 4).view(np.uint32)[:, 0], [0, 255])
    assert len(memory.regions) == 1
    partial = Memory()
    partial.map(0x1000, host[:600], writable=False, name="a")
    partial.map(0x1000 + 400, host[400:], writable=False, name="b")
    np.testing.assert_array_equal(partial.read(np.array([0x1000 + 1020], np.uint64), 4),
                                  host[1020:].reshape(1, 4))
    with pytest.raises(ValueError, match="overlaps"):
        memory.map(0x1000, host, writable=True, name="written")
    written = Memory()
    written.map(0x1000, host, writable=True, name="out")
    with pytest.raises(ValueError, match="overlaps"):
        written.map(0x1000, host, writable=False, name="in")
    with pytest.raises(ValueError, match="overlaps"):
        memory.map(0x1000, host.copy(), writable=False, name="other memory")
    with pytest.raises(AccessError, match="read-only"):  # the merged region stays read-only
        memory.write(addresses, np.zeros((2, 4), np.uint8))
