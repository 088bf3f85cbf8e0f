"""The emulator's fault model, one small assembly snippet per fault, and the legitimate
patterns next to each that must *not* fault (compilers compute on garbage lanes, combine
masks with defined zeros, wait for exactly the loads they use).

Each fault names the instruction, its line, the wave, and where it applies the lane and
address. Mutations of the emulator (recorded at each test): each made the named test fail.
"""

from __future__ import annotations

import numpy as np
import pytest
from snippets import IN_BASE, kernel_text, run_snippet

from cdna_emulator import EmulatorFault, Memory, Program, run

LANES = np.arange(64, dtype=np.uint32)


def expect_fault(kind, body, inputs=(LANES,), outputs=("v2",), **kw):
    with pytest.raises(EmulatorFault) as info:
        run_snippet(body, list(inputs), list(outputs), **kw)
    fault = info.value
    assert fault.kind == kind, fault
    return fault


# ---- memory -------------------------------------------------------------------------------------

def test_global_read_past_a_buffer_faults_with_lane_and_address():
    """Lane 5 reads 64 KiB past the input plane; reads are checked like writes."""
    body = """
        v_cmp_eq_u32_e32 vcc, 5, v0
        v_cndmask_b32_e64 v10, 0, 0x10000, vcc
        v_add_u32_e32 v10, v1, v10
        global_load_dword v11, v10, s[4:5] offset:-256
        s_waitcnt vmcnt(0)
    """
    fault = expect_fault("memory", body)
    assert fault.lane == 5 and "global_load_dword" in fault.instruction
    assert fault.address == IN_BASE + 4 * 5 + 0x10000  # (s[4:5] sits past plane 0)
    assert fault.wave == 0 and fault.line is not None


def test_kernarg_read_within_its_last_granule_reads_zeros():
    """The snippets' kernarg segment is 24 bytes; LLVM widens a 12-byte kernarg load at a
    16-byte boundary to ``s_load_dwordx4``, so bytes 24..31 (the rest of the last 16-byte
    granule) read as zeros. (Mutation: mapping exactly ``len(kernarg)`` bytes made this test
    fault.)"""
    out = run_snippet("""
        s_load_dwordx4 s[12:15], s[0:1], 0x10
        s_waitcnt lgkmcnt(0)
        v_mov_b32_e32 v2, s12
        v_mov_b32_e32 v3, s14
    """, [LANES], ["v2", "v3"])
    assert (out[0] == 64 * 4).all() and (out[1] == 0).all()


def test_kernarg_read_past_its_last_granule_faults():
    """Byte 32 is past the 24-byte segment's last granule. (Mutation: padding the segment to
    two granules more made this test pass without a fault.)"""
    expect_fault("memory", """
        s_load_dword s12, s[0:1], 0x20
        s_waitcnt lgkmcnt(0)
        v_mov_b32_e32 v2, s12
    """)


def test_global_store_to_a_read_only_buffer_faults():
    fault = expect_fault("memory", "global_store_dword v1, v2, s[4:5] offset:-256")
    assert "read-only" in fault.message and fault.lane == 0


def test_lds_access_outside_the_allocation_faults():
    """A 64-byte LDS allocation; lane 16 writes at byte 64."""
    fault = expect_fault("lds-range", """
        v_lshlrev_b32_e32 v10, 2, v0
        ds_write_b32 v10, v2
        s_waitcnt lgkmcnt(0)
    """, lds=64)
    assert fault.lane == 16 and fault.address == 64


def test_scratch_outside_the_private_segment_faults():
    """(Snippets have no private segment: any scratch access is out of range.)"""
    expect_fault("scratch-range", "scratch_store_dword off, v2, off offset:4")


# ---- definedness --------------------------------------------------------------------------------

def test_undefined_register_as_an_address_faults():
    """v40 is never written. (Mutation: marking every VGPR defined at launch made this
    test fail.)"""
    fault = expect_fault("undefined", """
        global_load_dword v11, v40, s[4:5]
        s_waitcnt vmcnt(0)
    """)
    assert "v40" in fault.message and fault.lane == 0


def test_undefined_value_stored_to_memory_faults_but_selected_away_does_not():
    """Arithmetic on a never-written register propagates; a v_cndmask that picks the defined
    operand in every active lane (what compilers emit for masked lanes) is defined."""
    expect_fault("undefined", "v_add_u32_e32 v2, v40, v2")
    run_snippet("""
        v_cmp_gt_u32_e32 vcc, 64, v0
        v_cndmask_b32_e32 v2, v40, v2, vcc
    """, [LANES], ["v2"])


def test_undefined_lanes_outside_exec_are_ignored():
    """Lanes 32..63 never write v12; a store of v12 under EXEC = lanes 0..31 is fine, under
    the full EXEC it faults at lane 32."""
    body = """
        v_cmp_gt_u32_e32 vcc, 32, v0
        s_and_saveexec_b64 s[20:21], vcc
        v_mov_b32_e32 v12, 7
        global_store_dword v1, v12, s[6:7]
        s_or_b64 exec, exec, s[20:21]
    """
    run_snippet(body, [LANES], ["v2"])
    fault = expect_fault("undefined", body + "global_store_dword v1, v12, s[6:7]")
    assert fault.lane == 32


def test_branch_on_undefined_scc_faults_and_defined_zero_masks_decide():
    """SCC from comparing a never-written SGPR is undefined; an AND with a defined zero mask
    is defined whatever the other operand holds."""
    fault = expect_fault("undefined", """
        s_cmp_eq_u32 s40, 0
        s_cbranch_scc1 .Ldone
        v_mov_b32_e32 v2, 1
    .Ldone:
    """)
    assert "SCC" in fault.message
    run_snippet("""
        s_mov_b64 s[20:21], 0
        s_and_b64 vcc, s[40:41], s[20:21]
        s_cbranch_vccnz .Lskip
        v_mov_b32_e32 v2, 1
    .Lskip:
    """, [LANES], ["v2"])


def test_exec_from_undefined_mask_faults():
    expect_fault("undefined", "s_and_saveexec_b64 s[20:21], s[40:41]")


def test_mfma_rows_propagate_definedness():
    """An MFMA whose A rows 0..7 are undefined (lanes 8..15 of each lane group defined):
    result rows 8..15 are defined and can be stored; storing row 0 faults."""
    body = """
        v_and_b32_e32 v20, 15, v0
        v_cmp_le_u32_e32 vcc, 8, v20
        s_and_saveexec_b64 s[20:21], vcc
        v_mov_b32_e32 v30, 0x3c00
        v_mov_b32_e32 v31, 0x3c00
        s_or_b64 exec, exec, s[20:21]
        v_mov_b32_e32 v32, 0x3c003c00
        v_mov_b32_e32 v33, 0x3c003c00
        v_mfma_f32_16x16x16_f16 v[40:43], v[30:31], v[32:33], 0
        s_nop 7
        s_nop 3
    """
    # D row i is register i % 4 of lane group i // 4: rows 8..15 are lane groups 2 and 3.
    upper = """
        v_cmp_le_u32_e32 vcc, 32, v0
        s_and_saveexec_b64 s[20:21], vcc
        global_store_dword v1, v40, s[6:7]
        s_or_b64 exec, exec, s[20:21]
    """
    run_snippet(body + upper, [LANES], ["v2"])
    expect_fault("undefined", body + "global_store_dword v1, v40, s[6:7]")


# ---- waitcnt ------------------------------------------------------------------------------------

def test_load_used_before_its_waitcnt_faults():
    """(Mutation: dropping the waitcnt check of VALU sources made this test fail.)"""
    fault = expect_fault("waitcnt", """
        global_load_dword v10, v1, s[4:5] offset:-256
        v_add_u32_e32 v2, v10, v2
        s_waitcnt vmcnt(0)
    """)
    assert "vmcnt" in fault.message and "v10" in fault.message


def test_vmcnt_retires_the_oldest_loads_in_order():
    """Two loads, vmcnt(1): the first is visible, the second still in flight."""
    two = """
        global_load_dword v10, v1, s[4:5] offset:-256
        global_load_dword v11, v1, s[4:5] offset:-256
        s_waitcnt vmcnt(1)
    """
    run_snippet(two + "v_mov_b32_e32 v2, v10\ns_waitcnt vmcnt(0)", [LANES], ["v2"])
    expect_fault("waitcnt", two + "v_mov_b32_e32 v2, v11\ns_waitcnt vmcnt(0)")


def test_vmcnt_saturates_at_63_loads_in_flight():
    """The 6-bit vmcnt cannot count past 63: after 63 later loads issue, the first one has
    completed (LLVM's waitcnt insertion relies on this, and Triton's gfx942 attention kernels
    use a load that way); after 62 it may still be in flight. (Mutation: removing the
    saturation rule made this test and the four gfx942 Triton attention tests fail with a
    waitcnt fault.)"""
    def body(later):
        loads = "\n".join(f"global_load_dword v{20 + i}, v1, s[4:5] offset:-256"
                          for i in range(later))
        return (f"global_load_dword v10, v1, s[4:5] offset:-256\n{loads}\n"
                "v_mov_b32_e32 v2, v10\ns_waitcnt vmcnt(0)")
    run_snippet(body(63), [LANES], ["v2"], vgprs=96)
    expect_fault("waitcnt", body(62), vgprs=96)


def test_scalar_loads_retire_only_at_lgkmcnt_zero():
    """Scalar loads return out of order: after two s_loads, lgkmcnt(1) guarantees neither.
    (Mutation: treating scalar loads as in order, like LDS, made this test fail.)"""
    two = """
        s_load_dword s20, s[0:1], 0x10
        s_load_dword s21, s[0:1], 0x10
        s_waitcnt lgkmcnt(1)
    """
    fault = expect_fault("waitcnt", two + "s_mov_b32 s22, s20")
    assert "lgkmcnt" in fault.message
    run_snippet(two + "s_waitcnt lgkmcnt(0)\ns_mov_b32 s22, s20", [LANES], ["v2"])


def test_overwriting_a_register_with_a_load_in_flight_faults():
    expect_fault("waitcnt", """
        global_load_dword v10, v1, s[4:5] offset:-256
        v_mov_b32_e32 v10, 0
        s_waitcnt vmcnt(0)
    """)


def test_lds_read_needs_lgkmcnt():
    expect_fault("waitcnt", """
        v_lshlrev_b32_e32 v10, 2, v0
        ds_write_b32 v10, v2
        ds_read_b32 v11, v10
        v_mov_b32_e32 v2, v11
        s_waitcnt lgkmcnt(0)
    """, lds=256)


def test_read2_whose_destination_overlaps_its_address():
    """ds_read2st64_b32 v[10:11], v10 ...: both addresses come from v10 as it was before the
    instruction (Triton's gfx950 index scorer reuses the register so). (Found by profiling
    that kernel: the emulator computed the second address from the first loaded value.)"""
    out, = run_snippet("""
        v_lshlrev_b32_e32 v10, 2, v0
        v_add_u32_e32 v12, 0x3000, v2
        ds_write_b32 v10, v2
        ds_write_b32 v10, v12 offset:512
        s_waitcnt lgkmcnt(0)
        ds_read2st64_b32 v[10:11], v10 offset1:2
        s_waitcnt lgkmcnt(0)
        v_add_u32_e32 v2, v10, v11
    """, [LANES], ["v2"], lds=1024)
    np.testing.assert_array_equal(out[:64], 2 * LANES + 0x3000)


def test_ds_address_is_a_32_bit_sum():
    """ds_read_b32 v, vA offset:N with vA = -64 reads address N - 64: LLVM folds a constant
    into the offset of an address it computed as (r - rows) * 8, which is negative (the gfx950
    index scorer's row-key loop). (Found there: the emulator summed in 64 bits and reported an
    lds-range fault at 2**32 + N - 64.)"""
    out, = run_snippet("""
        v_lshlrev_b32_e32 v10, 2, v0
        ds_write_b32 v10, v2
        s_waitcnt lgkmcnt(0)
        v_subrev_u32_e32 v11, 64, v10
        ds_read_b32 v12, v11 offset:64
        s_waitcnt lgkmcnt(0)
        v_mov_b32_e32 v2, v12
    """, [LANES], ["v2"], lds=1024)
    np.testing.assert_array_equal(out[:64], LANES[:64])


# ---- LDS races ----------------------------------------------------------------------------------

RACE_BODY = """
    v_lshlrev_b32_e32 v10, 2, v0
    v_xor_b32_e32 v11, 0x100, v10
    ds_write_b32 v10, v2
    s_waitcnt lgkmcnt(0)
    {sync}
    ds_read_b32 v12, v11
    s_waitcnt lgkmcnt(0)
    v_mov_b32_e32 v2, v12
"""


def test_lds_exchange_between_waves_needs_a_barrier():
    """Two waves of a workgroup swap 256-byte halves of LDS: with s_barrier between the
    write and the read it is correct, without it a race. (Mutation: not bumping the barrier
    epoch at s_barrier made the barrier case fail.)"""
    lanes = np.arange(128, dtype=np.uint32)
    out = run_snippet(RACE_BODY.format(sync="s_barrier"), [lanes], ["v2"], lds=512,
                      block=128)
    np.testing.assert_array_equal(out[0], lanes ^ 64)
    fault = expect_fault("lds-race", RACE_BODY.format(sync=""), inputs=[lanes], lds=512,
                         block=128)
    assert fault.workgroup == (0, 0, 0) and "ds_read_b32" in fault.instruction


def test_diverged_waves_reconverge_and_meet_at_the_barrier():
    """Wave 1 loops 3 extra times before the barrier; both must still exchange correctly."""
    lanes = np.arange(128, dtype=np.uint32)
    loop = """
        v_readfirstlane_b32 s20, v0
        s_cmp_lt_u32 s20, 64
        s_cbranch_scc1 .Lafter
        s_mov_b32 s21, 3
    .Lloop:
        s_add_i32 s21, s21, -1
        s_cmp_lg_u32 s21, 0
        s_cbranch_scc1 .Lloop
    .Lafter:
        s_barrier
    """
    out = run_snippet(RACE_BODY.format(sync=loop), [lanes], ["v2"], lds=512, block=128)
    np.testing.assert_array_equal(out[0], lanes ^ 64)


# ---- runaway kernels and unknown instructions ---------------------------------------------------

def test_a_kernel_that_never_ends_exhausts_the_step_budget():
    fault = expect_fault("step-budget", ".Lspin:\ns_branch .Lspin", max_steps=1000)
    assert "s_branch" in fault.instruction


def test_unknown_opcode_and_modifier_are_refused_at_parse_time():
    for body, word in (("v_frobnicate_b32 v2, v2", "v_frobnicate_b32"),
                       ("v_add_u32_e32 v2, v2, v2 row_shl:1", "row_shl"),
                       ("v_mfma_f32_16x16x16_f16 v[40:43], v[30:31], v[32:33], 0 blgp:2",
                        "blgp")):
        text = kernel_text(body, 1, ["v2"], arch="gfx950", vgprs=64)
        kernel = Program.from_asm(text).kernel("snippet")
        with pytest.raises(EmulatorFault) as info:
            kernel.code("gfx950")
        assert info.value.kind == "unsupported" and word in str(info.value)
        assert info.value.line is not None


def test_launch_checks():
    """Block larger than the metadata allows, too few kernarg bytes."""
    kernel = Program.from_asm(kernel_text("", 1, [], arch="gfx950", vgprs=64)).kernel(
        "snippet")
    for kw in (dict(block=(128, 1, 1), kernarg=b"\0" * 24),
               dict(block=(64, 1, 1), kernarg=b"\0" * 8)):
        with pytest.raises(EmulatorFault) as info:
            run(kernel, grid=(1, 1, 1), memory=Memory(), **kw)
        assert info.value.kind == "launch"
