"""Triton kernel: quantize bf16 rows to MXFP4 and store them into pool pages, in place
(SPEC §3, §1.4, §15.1, §15.6; the pool operand is aliased to the result).

One program quantizes ``ROWS`` (token, head) rows: the block amax is taken on bf16 bit
patterns, the e8m0 byte follows ``ROUND`` (0 up, 1 even, 2 down), and each element's e2m1
code comes from comparing ``|x| * 2**(127 - byte)`` (exact) with the rounding boundaries,
ties to the even code. A slot outside ``[0, P*128)`` is skipped, and of several rows with the
same slot only the last is written (as the CPU handler and XLA's scatter do), so the result
does not depend on the order programs run in.
"""

from __future__ import annotations

import numpy as np
import triton
import triton.language as tl
from jax.interpreters import mlir

from jax_mxfp4.formats import ROUND_MODE_CODES
from jax_mxfp4.gpu import launch as launcher
from jax_mxfp4.gpu import triton_call
from jax_mxfp4.gpu.kernels import mxfp4
from jax_mxfp4.rows import last_writer_slots


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
def _is_last(slots_ptr, t, slot, T, SCAN: tl.constexpr):
    """Whether no later row ``t' > t`` has the same slot (per row of ``t``)."""
    last = slot >= 0
    for start in range(0, T, SCAN):
        u = start + tl.arange(0, SCAN)
        other = tl.load(slots_ptr + u, mask=u < T, other=-1)
        clash = (other[None, :] == slot[:, None]) & (u[None, :] > t[:, None])
        last = last & (tl.max(clash.to(tl.int32), axis=1) == 0)
    return last


@triton.jit
def write_cache_kernel(pool_ptr, x_ptr, slots_ptr, out_ptr, T, H, P, ROUND: tl.constexpr,
                       ROWS: tl.constexpr, SCAN: tl.constexpr, DEDUP: tl.constexpr = True):
    """pool/out ``u8[P, H, 8704]`` (aliased), x ``bf16[T, H, 128]``, slots ``s32[T]``."""
    rr = tl.program_id(0) * ROWS + tl.arange(0, ROWS)  # (token, head) rows
    t = rr // H
    h = rr % H
    ok = t < T
    slot = tl.load(slots_ptr + t, mask=ok, other=-1)
    ok = ok & (slot >= 0) & (slot.to(tl.int64) < P.to(tl.int64) * 128)
    if DEDUP:
        ok = ok & _is_last(slots_ptr, t, tl.where(ok, slot, -1), T, SCAN)
    i = tl.arange(0, 64)
    src = x_ptr + rr.to(tl.int64)[:, None] * 128 + 2 * i[None, :]
    lo = tl.load(src, mask=ok[:, None], other=0.0).to(tl.int16, bitcast=True).to(tl.int32)
    hi = tl.load(src + 1, mask=ok[:, None], other=0.0).to(tl.int16, bitcast=True).to(tl.int32)
    lo = lo << 16
    hi = hi << 16
    amax = tl.maximum(tl.reshape(lo & 0x7FFFFFFF, (ROWS, 4, 16)),
                      tl.reshape(hi & 0x7FFFFFFF, (ROWS, 4, 16)))
    byte = _scale_byte(tl.max(amax, axis=2), ROUND)  # [ROWS, 4]
    per = tl.reshape(tl.broadcast_to(byte[:, :, None], (ROWS, 4, 16)), (ROWS, 64))
    packed = _codes(lo, per) | (_codes(hi, per) << 4)
    page = slot.to(tl.int64) // 128
    off = slot.to(tl.int64) % 128
    base = out_ptr + (page * H + h) * mxfp4.PAGE_BYTES
    tl.store(base[:, None] + off[:, None] * 64 + i[None, :], packed.to(tl.uint8),
             mask=ok[:, None])
    c = tl.arange(0, 4)
    tl.store(base[:, None] + mxfp4.SCALE_OFFSET + off[:, None] * 4 + c[None, :], byte.to(tl.uint8),
             mask=ok[:, None])


def rows_per_program(num_rows: int) -> int:
    return 16 if num_rows <= 4096 else 32


def grid(num_rows: int) -> tuple[int, int, int]:
    return (triton.cdiv(max(num_rows, 1), rows_per_program(num_rows)), 1, 1)


# --- lowering (covers / lower: jax_mxfp4.lowering.KernelModule) -----------------------------

# Up to this many rows the kernel finds each slot's last writer itself (every program
# compares its rows with all T slots: quadratic); above it, the slots are sorted first
# (``rows.last_writer_slots``). Timings of both: bench/RESULTS.md.
KERNEL_DEDUP_MAX_ROWS = 4096


def available(target, config) -> str | None:
    return triton_call.launcher_problem(target)


def covers(call) -> str | None:
    return None  # every call of the operation


def kernel_name(call) -> str:
    return "write_cache_kernel"


def lower(ctx, call, pool, x, slots):
    """One launch over (token, head) rows; the pool is aliased to the result (in place)."""
    pool_aval, x_aval, slots_aval = call.avals_in
    num_tokens = x_aval.shape[0]
    heads = pool_aval.shape[1] if len(pool_aval.shape) == 3 else 1
    rows = num_tokens * heads
    dedup_in_kernel = num_tokens <= KERNEL_DEDUP_MAX_ROWS
    if not dedup_in_kernel:
        sub = ctx.replace(avals_in=[slots_aval], avals_out=[slots_aval])
        slots = mlir.lower_fun(lambda s: [last_writer_slots(s)])(sub, slots)[0]
    launch = triton_call.launch(
        write_cache_kernel, call.target, grid=grid(rows) if rows else (0, 1, 1),
        buffers=("pool_ptr", "x_ptr", "slots_ptr", "out_ptr"),
        avals=(*call.avals_in, *call.avals_out),
        scalars={"T": np.int32(num_tokens), "H": np.int32(heads),
                 "P": np.int32(pool_aval.shape[0])},
        constants={"ROUND": ROUND_MODE_CODES[call.params["round_mode"]],
                   "ROWS": rows_per_program(rows), "SCAN": 256, "DEDUP": dedup_in_kernel},
    )
    return launcher.emit(ctx, launch, [pool, x, slots], call.avals_in, call.avals_out, {0: 0})
