"""Triton device functions: one query row's exact integer dots over a page's code words (the
one-row index scorer, S = 1, on an e4m3-exact query).

Why integers: an e4m3 value is an integer multiple of ``2**-9`` below ``448 * 2**9 < 2**18`` in
magnitude, and twice an e2m1 value is an integer in ``[-12, 12]``, so a 32-element scale
group's dot in units of ``2**-10`` is an integer below ``2**27``: exact in int32, rounded once
when it becomes fp32. ``dp4a`` sums four byte products into int32 in one instruction, where
the fp32 route takes a nibble decode, a widening and an FMA per element. Exact where the fp32
route is (every partial sum exact), more exact elsewhere, and the same for every row of a
batch: SPEC §10's rules for the scorers hold.

The operands (:func:`query_slices`, :data:`_GROUP_DOT`):

* a key element as the unsigned byte ``12 + 2 * e2m1`` (0..24): two byte permutes per four
  nibbles look it up, one over the nibbles as they are (a negative nibble's sign bit makes the
  permute give 0, the table's bytes being below 128) and one over the nibbles with their sign
  bits flipped (the negative table), then an OR;
* the query as three byte slices of ``x = q * 2**9``: bits 0-7 and 8-15 unsigned, bits 16-23
  signed (``x`` is two's complement below ``2**18``, so they are the bytes of ``x >> 16``);
* ``sum((12 + k) * x) = sum(k * x) + 12 * sum(x)``: the word's ``-12 * sum(x)`` starts the
  low slice's sum, a constant of the program's query.

A NaN query element makes every dot NaN in the fp32 route; here it is one flag per row
(:func:`query_slices`' ``nan``), added to each token's dot.
"""

from __future__ import annotations

import triton
import triton.language as tl

from jax_mxfp4._src.triton import mxfp4
from jax_mxfp4._src.triton.mxfp4 import GROUP_WORDS, TOKEN_GROUPS, TOKEN_WORDS

Q_UNIT_LOG2 = tl.constexpr(9)
"""``x = q * 2**9``: e4m3's smallest subnormal is ``2**-9``, so every e4m3 value is an integer
there."""

KEY_OFFSET = tl.constexpr(12)
"""A key element's byte is ``KEY_OFFSET + 2 * e2m1``: unsigned, so one permute table holds a
sign's eight magnitudes."""

DOT_TO_ROW_UNITS = tl.constexpr(2.0**-24)
"""A group's integer dot (units of ``2**-10``: ``2 * e2m1`` times ``q * 2**9``) in the units
of ``mxfp4.row_logits``' fp32 dots (``e2m1 * 2**-14`` times ``q``)."""

# Byte-permute tables of the key bytes 12 + m (positive nibbles) and 12 - m (negative ones)
# for the magnitudes m = 2 * e2m1 of codes 0..7: 0, 1, 2, 3, 4, 6, 8, 12 (bytes 0-3 in the
# first word, 4-7 in the second).
def tables_ptx(positive: str, negative: str) -> str:
    """PTX setting the permute tables ``t0, t1`` (keys ``12 + m``) and ``t2, t3`` (``12 - m``)
    for :func:`key_bytes_ptx`, their first words from the registers ``positive`` and
    ``negative`` (:data:`_TABLE_WORDS`)."""
    return (f"mov.b32 t0, {positive}; mov.b32 t1, 0x18141210; mov.b32 t2, {negative};"
            " mov.b32 t3, 0x00040608;\n")


def key_bytes_ptx(word: str, low: str, high: str) -> str:
    """PTX decoding one code word ``word`` (a register) into the key bytes ``12 + 2 * e2m1``
    of its elements 0-3 (``low``) and 4-7 (``high``): the word's halves as the permutes'
    selectors, over the nibbles as they are and with their sign bits flipped, then an OR. Needs
    the registers ``x, wh, xh, p, n`` and the tables of :func:`tables_ptx`."""
    return (f"xor.b32 x, {word}, 0x88888888; shr.b32 wh, {word}, 16; shr.b32 xh, x, 16;\n"
            f"prmt.b32 p, t0, t1, {word}; prmt.b32 n, t2, t3, x; or.b32 {low}, p, n;\n"
            f"prmt.b32 p, t0, t1, wh; prmt.b32 n, t2, t3, xh; or.b32 {high}, p, n;\n")
# The first words of both tables as values, not immediates: ptxas copied an immediate from a
# uniform register into a register before every permute that used it. Selector 0x4444 takes
# byte 4 (of the zero operand) four times: 0 in every lane, which ptxas does not fold (it
# folded %laneid >> 5, and reads %clock into a uniform register). $2 only gives the shape.
_TABLE_WORDS = tl.constexpr("{ .reg .b32 z; mov.u32 z, %laneid; prmt.b32 z, z, 0, 0x4444;"
                            " or.b32 $0, z, 0x0F0E0D0C; or.b32 $1, z, 0x090A0B0C; }")


def _word_terms(word: str, lo0: str, lo1: str, mid0: str, mid1: str, hi0: str,
                hi1: str) -> str:
    """PTX adding one code word's 8 terms ``(12 + 2 * e2m1) * x`` to the accumulators ``lo``,
    ``mid``, ``hi`` (byte products of the low, middle and signed high query slices)."""
    return (key_bytes_ptx(word, "k0", "k1")
            + f"dp4a.u32.u32 lo, k0, {lo0}, lo; dp4a.u32.u32 lo, k1, {lo1}, lo;\n"
            f"dp4a.u32.u32 mid, k0, {mid0}, mid; dp4a.u32.u32 mid, k1, {mid1}, mid;\n"
            f"dp4a.u32.s32 hi, k0, {hi0}, hi; dp4a.u32.s32 hi, k1, {hi1}, hi;\n")


def _group_dot_ptx() -> str:
    """One scale group's dot over its four code words, ``pack = 4``: ``$4..$7`` the words,
    then four operands of each query slice (``$8..`` low bytes of elements 0-3, ``$12..`` of
    4-7, ``$16..``, ``$20..`` middle, ``$24..``, ``$28..`` signed high) and ``$32`` the
    group's ``-12 * sum(x)`` (``$33..$35`` unused). ``$0`` = the group's ``sum(2 * e2m1 *
    x)`` (mod 2**32; the value fits in int32), ``$1..$3`` = 0."""
    body = "".join(_word_terms(f"${4 + w}", *(f"${8 + 4 * s + w}" for s in range(6)))
                   for w in range(4))
    return ("{ .reg .b32 x, wh, xh, p, n, k0, k1, lo, mid, hi, t0, t1, t2, t3;\n"
            + tables_ptx("$36", "$40")
            + "mov.b32 lo, $32; mov.b32 mid, 0; mov.b32 hi, 0;\n" + body
            + "mad.lo.u32 lo, mid, 256, lo; mad.lo.u32 $0, hi, 65536, lo;\n"
            + "mov.b32 $1, 0; mov.b32 $2, 0; mov.b32 $3, 0; }")


_GROUP_DOT = tl.constexpr(_group_dot_ptx())
_GROUP_DOT_CONSTRAINTS = tl.constexpr(",".join(["=r"] * 4 + ["r"] * 40))


# x = v * 2**9 (0f44000000: 2**Q_UNIT_LOG2) of an e4m3-exact fp32 $1 (cvt.rzi makes a NaN 0).
_FIXED = tl.constexpr("{ .reg .f32 t; mul.f32 t, $1, 0f44000000; cvt.rzi.s32.f32 $0, t; }")
# Four elements' x ($3..$6) as their low, middle and high byte slices $0, $1, $2: the low
# two bytes of each pair interleaved, then the pairs merged (seven permutes for the three).
_SLICES = tl.constexpr(
    "{ .reg .b32 a, b;\n"
    "prmt.b32 a, $3, $4, 0x5140; prmt.b32 b, $5, $6, 0x5140;\n"
    "prmt.b32 $0, a, b, 0x5410; prmt.b32 $1, a, b, 0x7632;\n"
    "prmt.b32 a, $3, $4, 0x0062; prmt.b32 b, $5, $6, 0x0062; prmt.b32 $2, a, b, 0x5410; }")


@triton.jit
def _fixed(v, PTX: tl.constexpr):
    """e4m3-exact fp32 ``v`` as ``x = v * 2**9`` (int32; a NaN as 0)."""
    if PTX:
        return tl.inline_asm_elementwise(_FIXED, "=r,f", [v], dtype=tl.int32, is_pure=True,
                                         pack=1)
    return (tl.where(v == v, v, 0.0) * (2.0**Q_UNIT_LOG2)).to(tl.int32)


@triton.jit
def _pack(b0, b1, b2, b3, SHIFT: tl.constexpr):
    """Byte ``SHIFT / 8`` of each of four uint32 tensors, packed low to high."""
    return (((b0 >> SHIFT) & 0xFF) | (((b1 >> SHIFT) & 0xFF) << 8)
            | (((b2 >> SHIFT) & 0xFF) << 16) | (((b3 >> SHIFT) & 0xFF) << 24))


@triton.jit
def _slices(x0, x1, x2, x3, PTX: tl.constexpr):
    """Four elements' ``x`` (int32) as their low, middle and high byte slices (uint32)."""
    if PTX:
        return tl.inline_asm_elementwise(_SLICES, "=r,=r,=r,r,r,r,r", [x0, x1, x2, x3],
                                         dtype=(tl.uint32,) * 3, is_pure=True, pack=1)
    u0, u1 = x0.to(tl.uint32, bitcast=True), x1.to(tl.uint32, bitcast=True)
    u2, u3 = x2.to(tl.uint32, bitcast=True), x3.to(tl.uint32, bitcast=True)
    return _pack(u0, u1, u2, u3, 0), _pack(u0, u1, u2, u3, 8), _pack(u0, u1, u2, u3, 16)


@triton.jit
def query_slices(q, PTX: tl.constexpr):
    """A row's query as the group dot (:func:`group_dots`) takes it, from ``q`` (eight fp32
    ``[16]`` in ``mxfp4.WORD_ORDER``, e4m3-exact: ``q[j][w]`` is element ``8w +
    WORD_ORDER[j]``): ``(lo0, lo1, mid0, mid1, hi0, hi1, start)`` uint32 ``[16]`` per word
    column (``lo0``: elements 0-3's low bytes, ``lo1``: 4-7's, and so on; ``start``: the
    group's ``-12 * sum(x)`` at its first word, 0 at the others), and ``nan``, a scalar
    fp32: NaN if an element is NaN, else 0 (a NaN counts as 0 in the slices)."""
    # a word's elements 0..7 are q[0], q[4], q[2], q[6], q[1], q[5], q[3], q[7]
    x0, x1, x2, x3 = _fixed(q[0], PTX), _fixed(q[4], PTX), _fixed(q[2], PTX), _fixed(q[6], PTX)
    x4, x5, x6, x7 = _fixed(q[1], PTX), _fixed(q[5], PTX), _fixed(q[3], PTX), _fixed(q[7], PTX)
    word_start = 0 - (x0 + x1 + x2 + x3 + x4 + x5 + x6 + x7) * KEY_OFFSET  # [16]
    first = tl.arange(0, GROUP_WORDS)[None, :] == 0  # each group's sum at its first word
    group_start = tl.sum(tl.reshape(word_start, (TOKEN_GROUPS, GROUP_WORDS)), axis=1)
    start = tl.where(first, group_start[:, None], 0)
    start = tl.reshape(start, (TOKEN_WORDS,)).to(tl.uint32, bitcast=True)
    zeros = q[0] * 0.0 + q[1] * 0.0 + q[2] * 0.0 + q[3] * 0.0  # NaN where an element is
    zeros += q[4] * 0.0 + q[5] * 0.0 + q[6] * 0.0 + q[7] * 0.0
    lo0, mid0, hi0 = _slices(x0, x1, x2, x3, PTX)
    lo1, mid1, hi1 = _slices(x4, x5, x6, x7, PTX)
    return (lo0, lo1, mid0, mid1, hi0, hi1, start), tl.sum(zeros, axis=0)


@triton.jit
def _offset_key(nibble):
    """``KEY_OFFSET + 2 * e2m1(nibble)`` (int32) of the low 4 bits of ``nibble``: the plain
    form of :data:`_GROUP_DOT`'s byte permutes."""
    mag = nibble & 7
    doubled = tl.where(mag < 2, mag, (2 + (mag & 1)) << ((mag >> 1) - 1))
    return tl.where((nibble & 8) != 0, KEY_OFFSET - doubled, KEY_OFFSET + doubled)


@triton.jit
def _signed_byte(x, SHIFT: tl.constexpr):
    """Byte ``SHIFT / 8`` of uint32 ``x`` as a signed int32."""
    return (((x >> SHIFT) & 0xFF).to(tl.int32) ^ 0x80) - 0x80


@triton.jit
def _element_dot(words, slices, e: tl.constexpr):
    """Element ``e``'s term of :data:`_GROUP_DOT`, as its three ``dp4a`` take it."""
    key = _offset_key(((words >> (4 * e)) & 0xF).to(tl.int32))
    half: tl.constexpr = e // 4
    shift: tl.constexpr = 8 * (e % 4)
    lo = ((slices[half] >> shift) & 0xFF).to(tl.int32)
    mid = ((slices[2 + half] >> shift) & 0xFF).to(tl.int32)
    return key * lo + ((key * mid) << 8) + ((key * _signed_byte(slices[4 + half], shift)) << 16)


@triton.jit
def group_dots(words, slices, PTX: tl.constexpr):
    """Each scale group's ``sum(2 * e2m1 * x)`` over its 32 elements (int32 ``[N, 4]``) from
    ``words`` (uint32 ``[N, 16]``; ``slices`` from :func:`query_slices`, per word column):
    one :data:`_GROUP_DOT` per four words where inline PTX runs (``PTX``: a thread holds a
    group's four words in a row, as the 16-byte loads of :func:`mxfp4.row_words` place
    them), else the same integer steps in plain Triton (the interpreter's form)."""
    if PTX:
        positive, negative = tl.inline_asm_elementwise(
            _TABLE_WORDS, "=r,=r,r", [slices[6]], dtype=(tl.uint32, tl.uint32), is_pure=True,
            pack=1)
        dots = tl.inline_asm_elementwise(
            _GROUP_DOT, _GROUP_DOT_CONSTRAINTS,
            [words, slices[0][None, :], slices[1][None, :], slices[2][None, :],
             slices[3][None, :], slices[4][None, :], slices[5][None, :], slices[6][None, :],
             positive[None, :], negative[None, :]],
            dtype=tl.int32, is_pure=True, pack=4)
        pairs, _ = tl.split(tl.reshape(dots, (words.shape[0], TOKEN_GROUPS, 2, 2)))
        first_of_group, _ = tl.split(pairs)
        return first_of_group
    total = slices[6].to(tl.int32, bitcast=True)[None, :] + _element_dot(words, slices, 0)
    total += _element_dot(words, slices, 1)
    total += _element_dot(words, slices, 2)
    total += _element_dot(words, slices, 3)
    total += _element_dot(words, slices, 4)
    total += _element_dot(words, slices, 5)
    total += _element_dot(words, slices, 6)
    total += _element_dot(words, slices, 7)
    return tl.sum(tl.reshape(total, (words.shape[0], TOKEN_GROUPS, GROUP_WORDS)), axis=2)


@triton.jit
def row_logits(slices, words, scales, PTX: tl.constexpr):
    """:func:`mxfp4.row_logits` on integer group dots: ``(dots f32 [128], smax int32 [128])``
    in the same units (the group's integer dot times :data:`DOT_TO_ROW_UNITS` is exact: it is
    at least 1 where not 0), so ``mxfp4.mul_scale_pow2(dots, smax, mxfp4.ROW_OFFSET)`` gives
    the logits. ``slices`` from :func:`query_slices` (its ``nan`` is the caller's to add)."""
    per_group = group_dots(words, slices, PTX).to(tl.float32)  # [128, 4]
    # in the fp32 route's units before its factors, which may be near 2**-126
    return mxfp4.row_group_sum(per_group * DOT_TO_ROW_UNITS, scales)
