"""Triton kernel: quantize bf16 rows to MXFP4 and store them into pool pages, in place
(SPEC §3, §1.4, §2.3; the pool operand is aliased to the result).

One program quantizes ``ROWS`` (token, head) rows: the block amax is taken on bf16 bit
patterns, the e8m0 byte follows ``ROUND`` (0 up, 1 even, 2 down), and each element's e2m1
code comes from comparing ``|x| * 2**(127 - byte)`` (exact) with the rounding boundaries,
ties to the even code. A slot outside ``[0, P*128)`` is skipped, and of several rows with the
same slot only the last is written (SPEC §3.1), so the result does not depend on the order
programs run in: ``claim_kernel`` first enters every slot into an open-addressing hash table
(``4 T`` entries or more, linear probing, compare-and-swap on the key) and keeps the largest row
index per slot with an atomic max; ``write_cache_kernel`` then looks its slot up and writes
only if it is the winner. O(T), no sort and no row-by-row scan. Short writes (a decode step's
few tokens) skip the table: the write kernel scans the slots for later writers itself.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import triton
import triton.language as tl
from jax.core import ShapedArray
from jax.interpreters import mlir

from jax_mxfp4._src.core.formats import ROUND_MODE_CODES
from jax_mxfp4._src.gpu import launch as launcher
from jax_mxfp4._src.triton import mxfp4, triton_call
from jax_mxfp4._src.triton.mxfp4 import (
    GROUP_DATA_BYTES,
    HEAD_DIM,
    PAGE_TOKENS,
    TOKEN_DATA_BYTES,
    TOKEN_GROUPS,
    TOKEN_SCALE_BYTES,
)


@triton.jit
def _scale_byte(amax, ROUND: tl.constexpr):
    """e8m0 byte of each block from its amax as fp32 bits (int32)."""
    expo = (amax >> 23) & 0xFF
    if ROUND == 0:
        byte = tl.maximum(expo - 2 + ((amax & 0x7FFFFF) > 0x400000).to(tl.int32), 1)
        byte = tl.where(amax == 0, 0, byte)
    elif ROUND == 1:
        byte = tl.maximum((((amax + 0x200000) >> 23) & 0xFF) - 2, 0)
    else:
        byte = tl.maximum(expo - 2, 0)
    return tl.where(expo == 0xFF, 255, tl.minimum(byte, 254))


@triton.jit
def _codes(bits, byte):
    """e2m1 codes of fp32 patterns ``bits`` (int32) under scale ``byte`` (broadcast)."""
    k = 127 - byte
    k1 = tl.minimum(tl.maximum(k + 1, -126), 127)
    v = (bits & 0x7FFFFFFF).to(tl.float32, bitcast=True) * mxfp4.pow2(k1) * mxfp4.pow2(k - k1)
    code = (v > 0.25).to(tl.int32) + (v >= 0.75).to(tl.int32) + (v > 1.25).to(tl.int32)
    code += (v >= 1.75).to(tl.int32) + (v > 2.5).to(tl.int32) + (v >= 3.5).to(tl.int32)
    code += (v > 5.0).to(tl.int32)
    return code | ((bits >> 28) & 8)


@triton.jit
def _slot_hash(slot, TABLE_BITS: tl.constexpr):
    """Fibonacci hash of the slots into ``[0, 2**TABLE_BITS)``."""
    return ((slot.to(tl.uint32) * 2654435761) >> (32 - TABLE_BITS)).to(tl.int32)


@triton.jit
def claim_kernel(slots_ptr, keys_ptr, winners_ptr, T, P, TABLE_BITS: tl.constexpr,
                 ROWS: tl.constexpr):
    """keys ``s32[2**TABLE_BITS + 1]`` and winners ``s32[2**TABLE_BITS]``, all -1 on entry
    (the last key is a parking place for lanes with nothing to insert): every in-range slot
    of ``slots s32[T]`` gets an entry, and its winner is the largest row index naming it."""
    t = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    slot = tl.load(slots_ptr + t, mask=t < T, other=-1)
    pending = (t < T) & (slot >= 0) & (slot.to(tl.int64) < P.to(tl.int64) * PAGE_TOKENS)
    h = _slot_hash(slot, TABLE_BITS)
    while tl.max(pending.to(tl.int32), axis=0) > 0:
        at = tl.where(pending, h, 1 << TABLE_BITS)
        old = tl.atomic_cas(keys_ptr + at, tl.where(pending, -1, -2),
                            tl.where(pending, slot, -2))
        placed = pending & ((old == -1) | (old == slot))
        tl.atomic_max(winners_ptr + h, t, mask=placed)
        pending = pending & ~placed
        h = tl.where(pending, (h + 1) & ((1 << TABLE_BITS) - 1), h)


@triton.jit
def _winner(keys_ptr, winners_ptr, slot, live, TABLE_BITS: tl.constexpr):
    """The winning row of each live slot (looked up in ``claim_kernel``'s table), -1
    elsewhere."""
    h = _slot_hash(slot, TABLE_BITS)
    winner = tl.full(slot.shape, -1, tl.int32)
    searching = live
    while tl.max(searching.to(tl.int32), axis=0) > 0:
        key = tl.load(keys_ptr + h, mask=searching, other=-1)
        found = searching & (key == slot)
        winner = tl.where(found, tl.load(winners_ptr + h, mask=found, other=-1), winner)
        searching = searching & (key != slot) & (key != -1)
        h = (h + 1) & ((1 << TABLE_BITS) - 1)
    return winner


@triton.jit
def _is_last(slots_ptr, t, slot, T, SCAN: tl.constexpr):
    """Whether no later row ``t' > t`` has the same slot (per row of ``t``): every program
    reads all ``T`` slots, so this is for short writes only (``SCAN_MAX_TOKENS``)."""
    last = slot >= 0
    for start in range(0, T, SCAN):
        u = start + tl.arange(0, SCAN)
        other = tl.load(slots_ptr + u, mask=u < T, other=-1)
        clash = (other[None, :] == slot[:, None]) & (u[None, :] > t[:, None])
        last = last & (tl.max(clash.to(tl.int32), axis=1) == 0)
    return last


@triton.jit
def writable_slots(slots_ptr, keys_ptr, winners_ptr, t, T, P, TABLE_BITS: tl.constexpr):
    """The slot of each row ``t`` (int32, -1 past ``T``) and whether the row may write it:
    a row of the call, its slot in ``[0, P*128)``, and no later row naming the same slot
    (the short writes' scan, ``TABLE_BITS == 0``, or ``claim_kernel``'s winner)."""
    in_call = t < T
    slot = tl.load(slots_ptr + t, mask=in_call, other=-1)
    ok = in_call & (slot >= 0) & (slot.to(tl.int64) < P.to(tl.int64) * PAGE_TOKENS)
    if TABLE_BITS == 0:
        ok = ok & _is_last(slots_ptr, t, tl.where(ok, slot, -1), T, SCAN_ROWS)
    else:
        ok = ok & (_winner(keys_ptr, winners_ptr, slot, ok, TABLE_BITS) == t)
    return slot, ok


@triton.jit
def write_cache_kernel(pool_ptr, x_ptr, slots_ptr, keys_ptr, winners_ptr, out_ptr, T, H, P,
                       ROUND: tl.constexpr, ROWS: tl.constexpr, TABLE_BITS: tl.constexpr):
    """pool/out ``u8[P, H, 8704]`` (aliased), x ``bf16[T, H, 128]``, slots ``s32[T]``, and
    the slot table of ``claim_kernel``, or (``TABLE_BITS == 0``: a short write, no table)
    null table pointers and a scan of the slots for later writers."""
    rr = tl.program_id(0) * ROWS + tl.arange(0, ROWS)  # (token, head) rows
    t = rr // H
    h = rr % H
    # The rows' values are loaded with their slots, not after the slot checks: a row of the
    # call is always inside x, and only the stores below wait for the checks (one dependent
    # round trip fewer before the arithmetic).
    i = tl.arange(0, TOKEN_DATA_BYTES)
    src = x_ptr + rr.to(tl.int64)[:, None] * HEAD_DIM + 2 * i[None, :]
    lo = tl.load(src, mask=(t < T)[:, None], other=0.0).to(tl.int16, bitcast=True)
    hi = tl.load(src + 1, mask=(t < T)[:, None], other=0.0).to(tl.int16, bitcast=True)
    slot, ok = writable_slots(slots_ptr, keys_ptr, winners_ptr, t, T, P, TABLE_BITS)
    lo = lo.to(tl.int32) << 16
    hi = hi.to(tl.int32) << 16
    # the even (odd) elements by scale group: [ROWS, 4, 16]
    amax = tl.maximum(tl.reshape(lo & 0x7FFFFFFF, (ROWS, TOKEN_GROUPS, GROUP_DATA_BYTES)),
                      tl.reshape(hi & 0x7FFFFFFF, (ROWS, TOKEN_GROUPS, GROUP_DATA_BYTES)))
    byte = _scale_byte(tl.max(amax, axis=2), ROUND)  # [ROWS, 4]
    per = tl.reshape(tl.broadcast_to(byte[:, :, None], (ROWS, TOKEN_GROUPS, GROUP_DATA_BYTES)),
                     (ROWS, TOKEN_DATA_BYTES))
    packed = _codes(lo, per) | (_codes(hi, per) << 4)
    page = slot.to(tl.int64) // PAGE_TOKENS
    off = slot.to(tl.int64) % PAGE_TOKENS
    base = out_ptr + (page * H + h) * mxfp4.PAGE_BYTES
    tl.store(base[:, None] + off[:, None] * TOKEN_DATA_BYTES + i[None, :], packed.to(tl.uint8),
             mask=ok[:, None])
    c = tl.arange(0, TOKEN_SCALE_BYTES)
    tl.store(base[:, None] + mxfp4.PAGE_SCALE_OFFSET + off[:, None] * TOKEN_SCALE_BYTES
             + c[None, :], byte.to(tl.uint8), mask=ok[:, None])


def table_bits(num_tokens: int) -> int:
    """log2 of the slot table's entries: at least four per token (short probe chains)."""
    return max(4, (4 * max(num_tokens, 1) - 1).bit_length())


def rows_per_program(num_rows: int) -> int:
    return 16 if num_rows <= 4096 else 32


def grid(num_rows: int) -> tuple[int, int, int]:
    return (triton.cdiv(max(num_rows, 1), rows_per_program(num_rows)), 1, 1)


# --- lowering (covers / lower: dispatch.lowering.KernelModule) ------------------------------------

CLAIM_ROWS = 256  # tokens per claim_kernel program
SCAN_ROWS = tl.constexpr(256)  # slots _is_last compares at a time
SCAN_MAX_TOKENS = 256
"""Writes of at most this many tokens find each slot's last writer with one scan of the slots
inside the write kernel (one launch, as a decode step's writes are); longer ones build the
slot table first (two launches and a fill, O(T)). Side by side on the H200: bench/RESULTS.md."""


def available(target, config) -> str | None:
    return triton_call.launcher_problem(target)


def covers(call) -> str | None:
    return None  # every call of the operation


def kernel_name(call) -> str:
    if call.avals_in[1].shape[0] <= SCAN_MAX_TOKENS:
        return "write_cache_kernel[slot scan]"
    return "claim_kernel+write_cache_kernel"


def lower(ctx, call, pool, x, slots):
    """A short write: one launch that scans the slots; a longer one: the slot table
    (``claim_kernel``, over XLA-filled ``-1`` arrays), then the (token, head) rows
    (``write_cache_kernel``). The pool is aliased to the result (in place)."""
    pool_aval, x_aval, slots_aval = call.avals_in
    num_tokens = x_aval.shape[0]
    heads = pool_aval.shape[1] if len(pool_aval.shape) == 3 else 1
    rows = num_tokens * heads
    pages = np.int32(pool_aval.shape[0])
    constants = {"ROUND": ROUND_MODE_CODES[call.params["round_mode"]],
                 "ROWS": rows_per_program(rows)}
    if num_tokens <= SCAN_MAX_TOKENS:
        launch = triton_call.launch(
            write_cache_kernel, call.target, grid=grid(rows) if rows else (0, 1, 1),
            buffers=("pool_ptr", "x_ptr", "slots_ptr", "out_ptr"),
            avals=(*call.avals_in, *call.avals_out),
            nulls={"keys_ptr": jnp.int32, "winners_ptr": jnp.int32},
            scalars={"T": np.int32(num_tokens), "H": np.int32(heads), "P": pages},
            constants={**constants, "TABLE_BITS": 0})
        return launcher.emit(ctx, launch, [pool, x, slots], call.avals_in, call.avals_out,
                             {0: 0})
    bits = table_bits(num_tokens)
    table_avals = [ShapedArray(((1 << bits) + 1,), jnp.int32),
                   ShapedArray((1 << bits,), jnp.int32)]
    fill = ctx.replace(avals_in=[], avals_out=table_avals)
    empty = mlir.lower_fun(lambda: [jnp.full(a.shape, -1, jnp.int32) for a in table_avals],
                           multiple_results=True)(fill)
    claim = triton_call.launch(
        claim_kernel, call.target,
        grid=(triton.cdiv(num_tokens, CLAIM_ROWS), 1, 1),
        buffers=("slots_ptr", None, None, "keys_ptr", "winners_ptr"),  # written in place
        avals=(slots_aval, *table_avals, *table_avals),
        scalars={"T": np.int32(num_tokens), "P": pages},
        constants={"TABLE_BITS": bits, "ROWS": CLAIM_ROWS})
    keys, winners = launcher.emit(ctx, claim, [slots, *empty], [slots_aval, *table_avals],
                                  table_avals, {1: 0, 2: 1})
    launch = triton_call.launch(
        write_cache_kernel, call.target, grid=grid(rows) if rows else (0, 1, 1),
        buffers=("pool_ptr", "x_ptr", "slots_ptr", "keys_ptr", "winners_ptr", "out_ptr"),
        avals=(*call.avals_in, *table_avals, *call.avals_out),
        scalars={"T": np.int32(num_tokens), "H": np.int32(heads), "P": pages},
        constants={**constants, "TABLE_BITS": bits},
    )
    return launcher.emit(ctx, launch, [pool, x, slots, keys, winners],
                         [*call.avals_in, *table_avals], call.avals_out, {0: 0})
