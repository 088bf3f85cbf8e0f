"""The GPU write_cache kernels (``claim_kernel`` then ``write_cache_kernel``) run by Triton's
interpreter on the CPU, against the float64 oracle: repeated slots keep their last row (the
hash table's atomics, or the short writes' scan), out-of-range slots are skipped, every round
mode.

Run as a script by ``test_triton_interpreter.py`` (``TRITON_INTERPRET=1`` before the kernels
are decorated). Prints ``ok <name>`` per check; raises on a mismatch.
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"

import numpy as np
import oracle
import triton
import triton.language as tl
from host_array import HostArray

from jax_mxfp4._src.core.formats import ROUND_MODE_CODES
from jax_mxfp4._src.ops.write_cache import triton as kernels


@triton.jit
def _winner_probe(slots_ptr, keys_ptr, winners_ptr, out_ptr, T, P, TABLE_BITS: tl.constexpr,
                  ROWS: tl.constexpr):
    """Stores, per row of ``slots``, whether the write kernel's rule
    (``kernels.writable_slots``) lets it write."""
    t = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    _, ok = kernels.writable_slots(slots_ptr, keys_ptr, winners_ptr, t, T, P, TABLE_BITS)
    tl.store(out_ptr + t, ok.to(tl.int32), mask=t < T)


def _run(pool, x_bf16, slots, round_mode, table: bool):
    """The lowering's launches: the slot table then the write (``table``), or the write
    alone scanning the slots (a short write)."""
    t, heads = x_bf16.shape[:2]
    bits = kernels.table_bits(t) if table else 0
    keys = HostArray(np.full((1 << bits) + 1, -1, np.int32))
    winners = HostArray(np.full(1 << bits, -1, np.int32))
    slots_h = HostArray(slots)
    pages = pool.shape[0]
    if table:
        kernels.claim_kernel[(-(-t // kernels.CLAIM_ROWS),)](
            slots_h, keys, winners, t, pages, TABLE_BITS=bits, ROWS=kernels.CLAIM_ROWS)
    out = HostArray(pool.copy())
    rows = t * heads
    kernels.write_cache_kernel[kernels.grid(rows)](
        out, HostArray(x_bf16), slots_h, keys, winners, out, t, heads, pages,
        ROUND=ROUND_MODE_CODES[round_mode], ROWS=kernels.rows_per_program(rows),
        TABLE_BITS=bits)
    return out.array


def check_repeated_slots(rng) -> None:
    pages, heads, tokens = 3, 2, 70
    pool = rng.integers(0, 256, (pages, heads, 8704), dtype=np.uint8)
    x = oracle.to_bf16(rng.standard_normal((tokens, heads, 128)) * 3)
    slots = rng.integers(-3, pages * 128 + 3, tokens).astype(np.int32)
    slots[10:40] = slots[0]  # a run of one slot: row 39 must win
    slots[50] = slots[60]  # and one pair
    for round_mode in ("up", "even", "down"):
        want = oracle.write_cache(pool, x, slots, round_mode)
        for table in (True, False):
            got = _run(pool, x, slots, round_mode, table)
            np.testing.assert_array_equal(got, want, err_msg=f"{round_mode} table={table}")
    print("ok write_cache_repeated_slots")


def check_winner_rule(rng) -> None:
    """Which rows may write, against numpy's last occurrence of each in-range slot. The full
    kernel check above cannot see this rule: the interpreter runs programs, and a program's
    rows, in order, so a later duplicate overwrites an earlier one even without the rule."""
    pages, tokens, rows = 3, 70, 16
    slots = rng.integers(-3, pages * 128 + 3, tokens).astype(np.int32)
    slots[10:40] = slots[0] if 0 <= slots[0] < pages * 128 else 5
    slots[50] = slots[60] = 7
    want = np.zeros(tokens, np.int32)
    for t, slot in enumerate(slots):
        want[t] = 0 <= slot < pages * 128 and slot not in slots[t + 1:]
    for table in (True, False):
        bits = kernels.table_bits(tokens) if table else 0
        keys = HostArray(np.full((1 << bits) + 1, -1, np.int32))
        winners = HostArray(np.full(1 << bits, -1, np.int32))
        slots_h = HostArray(slots)
        if table:
            kernels.claim_kernel[(-(-tokens // kernels.CLAIM_ROWS),)](
                slots_h, keys, winners, tokens, pages, TABLE_BITS=bits, ROWS=kernels.CLAIM_ROWS)
        got = HostArray(np.full(tokens, -1, np.int32))
        _winner_probe[(-(-tokens // rows),)](slots_h, keys, winners, got, tokens, pages,
                                             TABLE_BITS=bits, ROWS=rows)
        np.testing.assert_array_equal(got.array, want, err_msg=f"table={table}")
    print("ok write_cache_winner_rule")


if __name__ == "__main__":
    check_repeated_slots(np.random.default_rng(3))
    check_winner_rule(np.random.default_rng(4))
