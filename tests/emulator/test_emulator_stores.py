"""Sub-dword global stores of a VGPR's high half (``*_d16_hi``), which LLVM selects for a
store of the second 16-bit element of a packed pair (the Triton attention kernel's direct
bf16 output at one page per row)."""

from __future__ import annotations

import numpy as np
from snippets import run_snippet


def test_store_short_and_byte_d16_hi_write_the_high_half():
    """The lane's output dword cleared, then ``global_store_short_d16_hi`` of v2 at its byte
    0 and ``global_store_byte_d16_hi`` of v2 at its byte 2, read back: bits 31..16 of v2 in
    bytes 0-1 and bits 23..16 in byte 2, byte 3 left 0. (Mutation: the store writing the low
    half, as a plain ``global_store_short`` does, gives 0x00341234 and fails.)"""
    body = """
        v_mov_b32 v10, 0
        global_store_dword v1, v10, s[6:7]
        s_waitcnt vmcnt(0)
        global_store_short_d16_hi v1, v2, s[6:7]
        global_store_byte_d16_hi v1, v2, s[6:7] offset:2
        s_waitcnt vmcnt(0)
        global_load_dword v11, v1, s[6:7]
        s_waitcnt vmcnt(0)
    """
    values = (0xABCD1234 + np.arange(64, dtype=np.uint32) * 0x10101) & 0xFFFFFFFF
    (got,) = run_snippet(body, [values.astype(np.uint32)], ["v11"])
    want = (values >> 16) | (((values >> 16) & 0xFF) << 16)
    np.testing.assert_array_equal(got, want.astype(np.uint32))
