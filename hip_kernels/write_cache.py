"""FlyDSL kernel: quantize bf16 rows to MXFP4 and store them into 8704-byte pages (SPEC §3).

One work-item per (token, head, 32-element block): it reads 64 bytes of bf16, takes the block
amax on the fp32 bit patterns (subnormals count), picks the e8m0 byte by the runtime
``round_mode`` (SPEC §1.4 / ``formats.mxfp4_scale_byte``), rounds each element of
``|x| * 2**(127 - byte)`` (an exact power-of-two product) to the nearest e2m1 magnitude with
ties to the even code, and stores 16 data bytes at ``page + offset*64 + 16*block`` and the
scale byte at ``page + 8192 + offset*4 + block``. A slot outside ``[0, P*128)`` writes nothing.

Kernarg layout: :data:`ARGS` below (the one declaration). Grid: :func:`.abi.grid`.
"""

from __future__ import annotations

from jax.interpreters import mlir

from jax_mxfp4.formats import PAGE_BYTES, ROUND_MODE_CODES
from jax_mxfp4.formats import PAGE_SCALE_OFFSET as SCALE_OFFSET
from jax_mxfp4.gpu import launch as launcher
from jax_mxfp4.pages import last_writer_slots

from . import _ir as I
from . import _launch
from ._signature import jit_launcher
from .abi import BLOCK_THREADS, Arg, Specialization
from .code_object import code_object

ARGS = (
    Arg("pool", "pointer", "u8[P, Hkv, 8704] pool, written in place (index pool: Hkv = 1)"),
    Arg("x", "pointer", "bf16[T, Hkv, 128] rows to quantize"),
    Arg("slots", "pointer", "s32[T] slot = page * 128 + offset; outside [0, P*128) is skipped"),
    Arg("num_tokens", "i32", "T"),
    Arg("num_pages", "i32", "P"),
    Arg("num_heads", "i32", "Hkv"),
    Arg("round_mode", "i32", "e8m0 rounding: 0 up, 1 even, 2 down (formats.ROUND_MODE_CODES)"),
)

THREADS = BLOCK_THREADS["write_cache"]
# e2m1 magnitude boundaries and whether a value exactly on one rounds up (ties to even code).
_STEPS = ((0.25, False), (0.75, True), (1.25, False), (1.75, True), (2.5, False), (3.5, True),
          (5.0, False))


def _scale_byte(amax, mode):
    """e8m0 byte of a block from its amax bits, for round mode 0 up / 1 even / 2 down."""
    exp_field = I.band(I.lshr(amax, I.ci32(23)), I.ci32(0xFF))
    mant = I.band(amax, I.ci32(0x7FFFFF))
    up = I.smax(I.add(I.sub(exp_field, I.ci32(2)), I.select(I.ugt(mant, I.ci32(0x400000)),
                                                              I.ci32(1), I.ci32(0))), I.ci32(1))
    up = I.select(I.eq(amax, I.ci32(0)), I.ci32(0), up)
    rounded = I.band(I.lshr(I.add(amax, I.ci32(0x200000)), I.ci32(23)), I.ci32(0xFF))
    even = I.smax(I.sub(rounded, I.ci32(2)), I.ci32(0))
    down = I.smax(I.sub(exp_field, I.ci32(2)), I.ci32(0))
    byte = I.select(I.eq(mode, I.ci32(1)), even, I.select(I.eq(mode, I.ci32(2)), down, up))
    return I.select(I.eq(exp_field, I.ci32(0xFF)), I.ci32(255), I.smin(byte, I.ci32(254)))


def _pow2_factor(byte):
    """fp32 ``2**(127 - byte)`` exactly (subnormal for bytes 254 and 255)."""
    normal = I.shl(I.sub(I.ci32(254), byte), I.ci32(23))
    small = I.select(I.eq(byte, I.ci32(254)), I.ci32(0x00400000), I.ci32(0x00200000))
    return I.f32_from_bits(I.select(I.le(byte, I.ci32(253)), normal, small))


def _code(bits, factor):
    """e2m1 code (sign in bit 3) of the fp32 element with bit pattern ``bits``."""
    magnitude = I.fmul(I.f32_from_bits(I.band(bits, I.ci32(0x7FFFFFFF))), factor)
    code = I.ci32(0)
    for bound, tie_up in _STEPS:
        above = I.fge(magnitude, I.cf32(bound)) if tie_up else I.fgt(magnitude, I.cf32(bound))
        code = I.add(code, I.select(above, I.ci32(1), I.ci32(0)))
    return I.bor(code, I.shl(I.lshr(bits, I.ci32(31)), I.ci32(3)))


def _quantize_block(x_ptr, elem_offset, mode):
    """Load 32 bf16 at ``elem_offset``; return (4 i32 words of packed codes, scale byte)."""
    words = []
    for k in range(4):
        at = I.add(I.mul(elem_offset, I.ci64(2)), I.ci64(16 * k))
        chunk = I.load(I.vec(4, I.i32()), x_ptr, at, align=16)
        words += [I.extract(chunk, e) for e in range(4)]
    bits = []
    for w in words:
        bits += [I.shl(w, I.ci32(16)), I.band(w, I.ci32(0xFFFF0000))]
    amax = I.ci32(0)
    for b in bits:
        amax = I.umax(amax, I.band(b, I.ci32(0x7FFFFFFF)))
    byte = _scale_byte(amax, mode)
    factor = _pow2_factor(byte)
    codes = [_code(b, factor) for b in bits]
    packed = []
    for k in range(4):
        word = I.ci32(0)
        for e in range(8):
            word = I.bor(word, I.shl(codes[8 * k + e], I.ci32(4 * e)))
        packed.append(word)
    return packed, byte


def _body(a) -> None:
    """One work-item per (token, head, block); ``a``: the kernel's arguments by name."""
    pool, x, slots, num_tokens = a.pool, a.x, a.slots, a.num_tokens
    num_pages, num_heads, round_mode = a.num_pages, a.num_heads, a.round_mode
    tid, bid = I.thread_id(), I.block_id()
    item = I.add(I.mul(bid, I.ci32(THREADS)), tid)
    block = I.band(item, I.ci32(3))
    row = I.lshr(item, I.ci32(2))
    head, token = I.srem(row, num_heads), I.sdiv(row, num_heads)
    with I.when(I.lt(token, num_tokens)):
        slot = I.sext64(I.load(I.i32(), I.global_ptr(slots), I.mul(I.zext64(token), I.ci64(4)),
                               align=4))
        limit = I.mul(I.zext64(num_pages), I.ci64(128))
        inside = I.land(I.ge(slot, I.ci64(0)), I.lt(slot, limit))
        with I.when(inside):
            elem = I.add(I.mul(I.add(I.mul(I.zext64(token), I.zext64(num_heads)), I.zext64(head)),
                               I.ci64(128)), I.mul(I.zext64(block), I.ci64(32)))
            packed, byte = _quantize_block(I.global_ptr(x), elem, round_mode)
            page, offset = I.sdiv(slot, I.ci64(128)), I.srem(slot, I.ci64(128))
            page_head = I.add(I.mul(page, I.zext64(num_heads)), I.zext64(head))
            base = I.mul(page_head, I.ci64(PAGE_BYTES))
            within = I.add(I.mul(offset, I.ci64(64)), I.mul(I.zext64(block), I.ci64(16)))
            data = I.from_elements(I.vec(4, I.i32()), packed)
            I.store(data, I.global_ptr(pool), I.add(base, within), align=16)
            scale_at = I.add(base, I.add(I.ci64(SCALE_OFFSET),
                                         I.add(I.mul(offset, I.ci64(4)), I.zext64(block))))
            I.store(I.trunc8(byte), I.global_ptr(pool), scale_at, align=1)


def build(spec: Specialization):
    """The ``@flyc.jit`` launcher of the write_cache kernel (one specialization)."""
    assert spec.op == "write_cache"
    return jit_launcher(spec.symbol, ARGS, _body, THREADS)


# --- lowering (available / covers / lower: jax_mxfp4.lowering.KernelModule) -----------------

SPEC = Specialization("write_cache")


def available(target, config) -> str | None:
    return _launch.available(target, config) or _launch.code_object_problem(SPEC, target.arch)


def covers(call) -> str | None:
    return None  # every call: the round mode is a runtime argument


def kernel_name(call) -> str:
    return SPEC.symbol


def lower(ctx, call, pool, x, slots):
    """Slots a later row overwrites are dropped first (``pages.last_writer_slots``): the
    kernel writes its rows in parallel, and the last writer must win (SPEC §15.14)."""
    pool_aval, x_aval, slots_aval = call.avals_in
    tokens = x_aval.shape[0]
    heads = pool_aval.shape[1] if len(pool_aval.shape) == 3 else 1
    sub = ctx.replace(avals_in=[slots_aval], avals_out=[slots_aval])
    slots = mlir.lower_fun(lambda s: [last_writer_slots(s)])(sub, slots)[0]
    co = code_object(SPEC, arch=call.target.arch)
    launch = _launch.launch(
        co, _launch.empty_or(co.grid(num_tokens=tokens, num_heads=heads), tokens, heads),
        buffers=(None, "x", "slots", "pool"),  # the pool result, aliased to operand 0
        scalars={"num_tokens": tokens, "num_pages": pool_aval.shape[0], "num_heads": heads,
                 "round_mode": ROUND_MODE_CODES[call.params["round_mode"]]})
    return launcher.emit(ctx, launch, [pool, x, slots], call.avals_in, call.avals_out, {0: 0})
