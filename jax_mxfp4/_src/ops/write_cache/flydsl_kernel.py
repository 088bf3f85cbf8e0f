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

from jax_mxfp4._src.core.formats import PAGE_BYTES
from jax_mxfp4._src.core.formats import PAGE_SCALE_OFFSET as SCALE_OFFSET
from jax_mxfp4._src.flydsl import _ir as ir
from jax_mxfp4._src.flydsl._signature import jit_launcher
from jax_mxfp4._src.flydsl.abi import BLOCK_THREADS, Arg, Specialization

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
    exp_field = ir.band(ir.lshr(amax, ir.ci32(23)), ir.ci32(0xFF))
    mant = ir.band(amax, ir.ci32(0x7FFFFF))
    up = ir.smax(ir.add(ir.sub(exp_field, ir.ci32(2)), ir.select(ir.ugt(mant, ir.ci32(0x400000)),
                                                              ir.ci32(1), ir.ci32(0))), ir.ci32(1))
    up = ir.select(ir.eq(amax, ir.ci32(0)), ir.ci32(0), up)
    rounded = ir.band(ir.lshr(ir.add(amax, ir.ci32(0x200000)), ir.ci32(23)), ir.ci32(0xFF))
    even = ir.smax(ir.sub(rounded, ir.ci32(2)), ir.ci32(0))
    down = ir.smax(ir.sub(exp_field, ir.ci32(2)), ir.ci32(0))
    byte = ir.select(ir.eq(mode, ir.ci32(1)), even, ir.select(ir.eq(mode, ir.ci32(2)), down, up))
    return ir.select(ir.eq(exp_field, ir.ci32(0xFF)), ir.ci32(255), ir.smin(byte, ir.ci32(254)))


def _pow2_factor(byte):
    """fp32 ``2**(127 - byte)`` exactly (subnormal for bytes 254 and 255)."""
    normal = ir.shl(ir.sub(ir.ci32(254), byte), ir.ci32(23))
    small = ir.select(ir.eq(byte, ir.ci32(254)), ir.ci32(0x00400000), ir.ci32(0x00200000))
    return ir.f32_from_bits(ir.select(ir.le(byte, ir.ci32(253)), normal, small))


def _code(bits, factor):
    """e2m1 code (sign in bit 3) of the fp32 element with bit pattern ``bits``."""
    magnitude = ir.fmul(ir.f32_from_bits(ir.band(bits, ir.ci32(0x7FFFFFFF))), factor)
    code = ir.ci32(0)
    for bound, tie_up in _STEPS:
        above = ir.fge(magnitude, ir.cf32(bound)) if tie_up else ir.fgt(magnitude, ir.cf32(bound))
        code = ir.add(code, ir.select(above, ir.ci32(1), ir.ci32(0)))
    return ir.bor(code, ir.shl(ir.lshr(bits, ir.ci32(31)), ir.ci32(3)))


def _quantize_block(x_ptr, elem_offset, mode):
    """Load 32 bf16 at ``elem_offset``; return (4 i32 words of packed codes, scale byte)."""
    words = []
    for k in range(4):
        at = ir.add(ir.mul(elem_offset, ir.ci64(2)), ir.ci64(16 * k))
        chunk = ir.load(ir.vec(4, ir.i32()), x_ptr, at, align=16)
        words += [ir.extract(chunk, e) for e in range(4)]
    bits = []
    for w in words:
        bits += [ir.shl(w, ir.ci32(16)), ir.band(w, ir.ci32(0xFFFF0000))]
    amax = ir.ci32(0)
    for b in bits:
        amax = ir.umax(amax, ir.band(b, ir.ci32(0x7FFFFFFF)))
    byte = _scale_byte(amax, mode)
    factor = _pow2_factor(byte)
    codes = [_code(b, factor) for b in bits]
    packed = []
    for k in range(4):
        word = ir.ci32(0)
        for e in range(8):
            word = ir.bor(word, ir.shl(codes[8 * k + e], ir.ci32(4 * e)))
        packed.append(word)
    return packed, byte


def _body(a) -> None:
    """One work-item per (token, head, block); ``a``: the kernel's arguments by name."""
    pool, x, slots, num_tokens = a.pool, a.x, a.slots, a.num_tokens
    num_pages, num_heads, round_mode = a.num_pages, a.num_heads, a.round_mode
    tid, bid = ir.thread_id(), ir.block_id()
    item = ir.add(ir.mul(bid, ir.ci32(THREADS)), tid)
    block = ir.band(item, ir.ci32(3))
    row = ir.lshr(item, ir.ci32(2))
    head, token = ir.srem(row, num_heads), ir.sdiv(row, num_heads)
    with ir.when(ir.lt(token, num_tokens)):
        slot = ir.sext64(ir.load(ir.i32(), ir.global_ptr(slots), ir.mul(ir.zext64(token),
                                                                        ir.ci64(4)),
                                 align=4))
        limit = ir.mul(ir.zext64(num_pages), ir.ci64(128))
        inside = ir.land(ir.ge(slot, ir.ci64(0)), ir.lt(slot, limit))
        with ir.when(inside):
            elem = ir.add(ir.mul(ir.add(ir.mul(ir.zext64(token), ir.zext64(num_heads)),
                                        ir.zext64(head)),
                                 ir.ci64(128)), ir.mul(ir.zext64(block), ir.ci64(32)))
            packed, byte = _quantize_block(ir.global_ptr(x), elem, round_mode)
            page, offset = ir.sdiv(slot, ir.ci64(128)), ir.srem(slot, ir.ci64(128))
            page_head = ir.add(ir.mul(page, ir.zext64(num_heads)), ir.zext64(head))
            base = ir.mul(page_head, ir.ci64(PAGE_BYTES))
            within = ir.add(ir.mul(offset, ir.ci64(64)), ir.mul(ir.zext64(block), ir.ci64(16)))
            data = ir.from_elements(ir.vec(4, ir.i32()), packed)
            ir.store(data, ir.global_ptr(pool), ir.add(base, within), align=16)
            scale_at = ir.add(base, ir.add(ir.ci64(SCALE_OFFSET),
                                           ir.add(ir.mul(offset, ir.ci64(4)), ir.zext64(block))))
            ir.store(ir.trunc8(byte), ir.global_ptr(pool), scale_at, align=1)


def build(spec: Specialization):
    """The ``@flyc.jit`` launcher of the write_cache kernel (one specialization)."""
    assert spec.op == "write_cache"
    return jit_launcher(spec.symbol, ARGS, _body, THREADS)
