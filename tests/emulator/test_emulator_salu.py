"""Scalar bit instructions of the emulator, run as assembly snippets (the ones Triton's gfx942
code emits that have no other test)."""

from __future__ import annotations

import numpy as np
from snippets import run_snippet


def test_s_bitset_sets_and_clears_one_bit_of_the_destination():
    """s_bitset1_b32 / s_bitset0_b32 D, S: bit S[4:0] of D set / cleared, the rest kept (an
    index of 39 is bit 7)."""
    body = """
        s_mov_b32 s30, 0x10
        s_bitset1_b32 s30, 7
        s_mov_b32 s31, 0xffffffff
        s_bitset0_b32 s31, 3
        s_mov_b32 s32, 39
        s_mov_b32 s33, 0
        s_bitset1_b32 s33, s32
        s_mov_b32 s34, 0x80000001
        s_bitset0_b32 s34, 31
        v_mov_b32 v10, s30
        v_mov_b32 v11, s31
        v_mov_b32 v12, s33
        v_mov_b32 v13, s34
    """
    got = run_snippet(body, [np.zeros(64, np.uint32)], ["v10", "v11", "v12", "v13"])
    want = [0x90, 0xFFFFFFF7, 0x80, 0x1]
    for row, value in zip(got, want, strict=True):
        np.testing.assert_array_equal(row, np.full(64, value, np.uint32))
