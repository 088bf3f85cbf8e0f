"""FlyDSL kernel: merge split-K attention partials, and the output stores both paths share.

Partition ``p`` of row ``r`` left ``m_p`` (its base-2 row max), ``l_p`` (its row sum) and
``o_p = O_p / l_p`` rounded to bf16 (SPEC §7). The merge takes
``M = max_p m_p``, ``w_p = 2**(m_p - M) * l_p`` (0 for an empty partition) and writes
``out = bf16(sum_p (w_p / sum_q w_q) o_p)`` (zeros when every partition is empty; NaN when a
partition's ``m_p`` is NaN: a poisoned q head, SPEC §9.2), or its MXFP8
quantization (SPEC §8): ``sb = clamp(E - 8 + (M7 > 96), 0, 254)`` from the bf16 block amax and
``e4m3(x * 2**(127 - sb))``.

One wave per row; lane ``(c, b) = (lane // 4, lane % 4)`` owns q head ``c`` (< G), output
elements ``32b .. 32b + 31`` (one MX block). Kernarg layout:
:data:`ARGS` below. Grid: :func:`jax_mxfp4._src.flydsl.abi.grid`.
"""

from __future__ import annotations

import functools

from jax_mxfp4._src.flydsl import _ir as ir
from jax_mxfp4._src.flydsl import _numerics as numerics
from jax_mxfp4._src.flydsl._signature import jit_launcher
from jax_mxfp4._src.flydsl.abi import BLOCK_THREADS, Arg, Specialization

ARGS = (
    Arg("partial_out", "pointer", "bf16[R, NP, G, 128] from the split kernel"),
    Arg("partial_stats", "pointer", "f32[R, NP, G, 2] from the split kernel"),
    Arg("out", "pointer", "bf16[T, Hkv*G, 128] or e4m3[T, Hkv*G*128] (mxfp8 values)"),
    Arg("out_aux", "pointer", "mxfp8: u8[T, Hkv*G*4] scales; bf16: unused (may be null)"),
    Arg("num_rows", "i32", "R"),
    Arg("num_partitions", "i32", "NP"),
)

THREADS = BLOCK_THREADS["attention_merge"]


def store_output_block(output: str, out, out_aux, row_head, block, values) -> None:
    """Store 32 fp32 ``values`` (elements ``32*block..`` of q-head row ``row_head``) as bf16,
    or as MXFP8 values plus their scale byte."""
    if output == "bf16":
        words = [numerics.pack_bf16x2(values[i], values[i + 1]) for i in range(0, 32, 2)]
        elem = ir.add(ir.mul(ir.zext64(row_head), ir.ci64(128)), ir.mul(ir.zext64(block),
                                                                        ir.ci64(32)))
        at = ir.mul(elem, ir.ci64(2))
        for k in range(4):
            chunk = ir.from_elements(ir.vec(4, ir.i32()), words[4 * k : 4 * k + 4])
            ir.store(chunk, ir.global_ptr(out), ir.add(at, ir.ci64(16 * k)), align=16)
        return
    rounded = [numerics.bf16_round_f32(v) for v in values]
    words, byte = numerics.mxfp8_block(rounded)
    at = ir.add(ir.mul(ir.zext64(row_head), ir.ci64(128)), ir.mul(ir.zext64(block), ir.ci64(32)))
    for k in range(2):
        chunk = ir.from_elements(ir.vec(4, ir.i32()), words[4 * k : 4 * k + 4])
        ir.store(chunk, ir.global_ptr(out), ir.add(at, ir.ci64(16 * k)), align=16)
    scale_at = ir.add(ir.mul(ir.zext64(row_head), ir.ci64(4)), ir.zext64(block))
    ir.store(ir.trunc8(byte), ir.global_ptr(out_aux), scale_at, align=1)


def _stats(a, r, part, head, group: int):
    """(m_p, l_p) of partition ``part``."""
    idx = ir.add(ir.mul(ir.add(ir.mul(ir.zext64(r), ir.zext64(a.num_partitions)), ir.zext64(part)),
                        ir.ci64(group)), ir.zext64(head))
    pair = ir.load(ir.vec(2, ir.f32()), ir.global_ptr(a.partial_stats), ir.mul(idx, ir.ci64(8)),
                   align=8)
    return ir.extract(pair, 0), ir.extract(pair, 1)


def _partial_values(a, r, part, head, block, group: int) -> list:
    idx = ir.add(ir.mul(ir.add(ir.mul(ir.add(ir.mul(ir.zext64(r), ir.zext64(a.num_partitions)),
                                             ir.zext64(part)), ir.ci64(group)), ir.zext64(head)),
                        ir.ci64(128)), ir.mul(ir.zext64(block), ir.ci64(32)))
    words = []
    for k in range(4):
        chunk = ir.load(ir.vec(4, ir.i32()), ir.global_ptr(a.partial_out),
                        ir.add(ir.mul(idx, ir.ci64(2)), ir.ci64(16 * k)), align=16)
        words += [ir.extract(chunk, e) for e in range(4)]
    return numerics.bf16_words_to_f32(words)


def _body(spec: Specialization, a) -> None:
    lane = ir.thread_id()
    r = ir.block_id("x")
    head, block = ir.lshr(lane, ir.ci32(2)), ir.band(lane, ir.ci32(3))
    with ir.when(ir.lt(head, ir.ci32(spec.group))):
        def find_max(p, carried):
            m, total = _stats(a, r, p, head, spec.group)
            poisoned = ir.select(ir.is_nan(m), ir.cf32(1.0), carried[1])  # SPEC §9.2
            return [ir.select(ir.fgt(total, ir.cf32(0.0)), ir.fmax(carried[0], m), carried[0]),
                    poisoned]

        top, poisoned = ir.loop(ir.ci32(0), a.num_partitions,
                                [ir.cf32(ir.NEG_INF), ir.cf32(0.0)], find_max)

        def weight_of(p):
            m, total = _stats(a, r, p, head, spec.group)
            return ir.select(ir.fgt(total, ir.cf32(0.0)), ir.fmul(ir.exp2(ir.fsub(m, top)), total),
                             ir.cf32(0.0))

        (total,) = ir.loop(ir.ci32(0), a.num_partitions, [ir.cf32(0.0)],
                           lambda p, carried: [ir.fadd(carried[0], weight_of(p))])
        # Weights normalized before the sum (as the Triton reduce kernel does): w_p * o_p
        # with l_p up to the page count would overflow fp32 for partials near bf16's max.
        nonzero = ir.fgt(total, ir.cf32(0.0))
        inverse = ir.select(nonzero, ir.fdiv(ir.cf32(1.0), ir.select(nonzero, total, ir.cf32(1.0))),
                            ir.cf32(0.0))

        def accumulate(p, carried):
            weight = ir.fmul(weight_of(p), inverse)
            values = _partial_values(a, r, p, head, block, spec.group)
            return [ir.fadd(x, ir.fmul(weight, v)) for x, v in zip(carried, values, strict=True)]

        values = ir.loop(ir.ci32(0), a.num_partitions, [ir.cf32(0.0)] * 32, accumulate)
        nan = ir.fgt(poisoned, ir.cf32(0.0))
        values = [ir.select(nan, ir.cf32(float("nan")), v) for v in values]
        row_head = ir.add(ir.mul(r, ir.ci32(spec.group)), head)
        store_output_block(spec.output, a.out, a.out_aux, row_head, block, values)


def build(spec: Specialization):
    """The ``@flyc.jit`` launcher of one attention_merge specialization."""
    assert spec.op == "attention_merge"
    return jit_launcher(spec.symbol, ARGS, functools.partial(_body, spec), THREADS)
