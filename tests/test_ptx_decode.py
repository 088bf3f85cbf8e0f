"""The inline PTX of the CUDA decode (``mxfp4._FP16_PAIRS``, ``_WORD_FP32``, ``_BF16_SCALED``)
run on the CPU: a small interpreter of the few PTX instructions they use executes the very
text the kernels compile, on every byte value in every position and on random words, against
numpy's e2m1 table. tests/gpu holds the kernels bit-exact on the device; this catches a wrong
mask, shift or byte-permute selector in CI, without a GPU. Mutations: selector ``0x1404`` ->
``0x0414`` in ``_FP16_PAIRS`` fails ``test_fp16_pairs``; a mask of ``0x0E0E0E0E`` ->
``0x0E0E0E0C`` in ``_BYTES`` fails the pairs and the word tests; ``_BF16_SCALED`` scaling
its ``$0`` by ``$6`` instead of ``$5`` fails ``test_scaled_bf16``."""

from __future__ import annotations

import re

import ml_dtypes
import numpy as np
import pytest

pytest.importorskip("triton")

from jax_mxfp4.gpu.kernels import mxfp4

E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6])
MASK32 = np.uint64(0xFFFFFFFF)


def _u32(x) -> np.ndarray:
    return np.asarray(x, np.uint64) & MASK32


def _prmt(a, b, selector: int):
    """``prmt.b32`` in its default mode: result byte ``i`` is byte ``sel_i & 7`` of ``{b, a}``,
    replaced by its sign bit replicated where ``sel_i & 8``."""
    pool = [(a >> np.uint64(8 * i)) & np.uint64(0xFF) for i in range(4)]
    pool += [(b >> np.uint64(8 * i)) & np.uint64(0xFF) for i in range(4)]
    out = np.zeros_like(a)
    for i in range(4):
        sel = (selector >> (4 * i)) & 0xF
        byte = pool[sel & 7]
        if sel & 8:
            byte = np.where(byte & np.uint64(0x80), np.uint64(0xFF), np.uint64(0))
        out |= byte << np.uint64(8 * i)
    return out


def _bf16_mul(a, b):
    """``mul.rn.bf16x2``: each half's product rounded once to bf16 (products of these powers
    of two and e2m1 values are exact in fp32, so fp32 then bf16 rounds once)."""
    out = np.zeros_like(a)
    for shift in (0, 16):
        x = ((a >> np.uint64(shift)) & np.uint64(0xFFFF)).astype(np.uint16)
        y = ((b >> np.uint64(shift)) & np.uint64(0xFFFF)).astype(np.uint16)
        with np.errstate(over="ignore", invalid="ignore"):
            prod = (x.view(ml_dtypes.bfloat16).astype(np.float32)
                    * y.view(ml_dtypes.bfloat16).astype(np.float32))
        out |= prod.astype(ml_dtypes.bfloat16).view(np.uint16).astype(np.uint64) << np.uint64(shift)
    return out


def run_ptx(text: str, operands: list) -> dict:
    """Execute ``text`` (one inline-asm body) with ``$k`` bound to ``operands[k]`` (uint32
    arrays; outputs may be ``None``); returns every ``$k`` and register after the last
    statement. Raises on an instruction this interpreter does not know."""
    regs = {f"${k}": (None if v is None else _u32(v)) for k, v in enumerate(operands)}
    shape = next(v.shape for v in regs.values() if v is not None)

    def value(token: str):
        token = token.strip()
        if token in regs:
            return regs[token]
        return np.full(shape, int(token, 0), np.uint64)  # an immediate, as wide as the data

    for statement in filter(None, (s.strip() for s in text.strip().strip("{}").split(";"))):
        op, _, rest = statement.partition(" ")
        if op == ".reg":
            continue
        if op == "mov.b32" and rest.startswith("{"):  # unpack a register into two halves
            halves, src = rest.rsplit(",", 1)
            lo, hi = (h.strip() for h in halves.strip("{} ").split(","))
            regs[lo], regs[hi] = value(src) & np.uint64(0xFFFF), value(src) >> np.uint64(16)
            continue
        dst, *args = (a.strip() for a in rest.split(","))
        x = [value(a) for a in args]
        if op in ("mov.b32", "mov.f32"):
            result = x[0]
        elif op == "shl.b32":
            result = (x[0] << x[1]) & MASK32
        elif op == "shr.b32":
            result = x[0] >> x[1]
        elif op == "and.b32":
            result = x[0] & x[1]
        elif op == "or.b32":
            result = x[0] | x[1]
        elif op == "prmt.b32":
            result = _prmt(x[0], x[1], int(args[2], 0))
        elif op == "cvt.f32.f16":
            half = x[0].astype(np.uint16).view(np.float16)
            result = half.astype(np.float32).view(np.uint32).astype(np.uint64)
        elif op == "mul.rn.bf16x2":
            result = _bf16_mul(x[0], x[1])
        else:
            raise NotImplementedError(statement)
        regs[dst] = np.asarray(result, np.uint64)
    return regs


def _words(rng) -> np.ndarray:
    """Every byte value in every byte position, then random words."""
    every = np.arange(256, dtype=np.uint64)
    structured = np.concatenate([every << np.uint64(8 * i) for i in range(4)])
    return np.concatenate([structured, rng.integers(0, 2**32, 50_000, dtype=np.uint64)])


def _element(words, k: int) -> np.ndarray:
    """Element ``k`` (bits ``4k``) of each word, as float64 e2m1."""
    return E2M1[((words >> np.uint64(4 * k)) & np.uint64(15)).astype(np.int64)]


def _f16_bits(x) -> np.ndarray:
    return np.asarray(x, np.float16).view(np.uint16).astype(np.uint64)


def _ptx(name: str) -> str:
    return getattr(mxfp4, name).value


def test_fp16_pairs(rng):
    """``_FP16_PAIRS``: $0 = (b0, b1) low nibbles, $1 = (b2, b3) low, $2 = (b0, b1) high,
    $3 = (b2, b3) high, each fp16 ``e2m1 * 2**-14`` bit for bit (signed zeros included)."""
    words = _words(rng)
    regs = run_ptx(_ptx("_FP16_PAIRS"), [None] * 4 + [words])
    for out, (first, second) in enumerate([(0, 2), (4, 6), (1, 3), (5, 7)]):
        want = (_f16_bits(_element(words, first) * 2.0**-14)
                | _f16_bits(_element(words, second) * 2.0**-14) << np.uint64(16))
        np.testing.assert_array_equal(regs[f"${out}"], want, err_msg=f"${out}")


def test_word_values(rng):
    """``_WORD_FP32``: the eight elements of a word as fp32 ``e2m1 * 2**-14`` in
    ``WORD_ORDER``, bit for bit."""
    words = _words(rng)
    regs = run_ptx(_ptx("_WORD_FP32"), [None] * 8 + [words])
    for out, k in enumerate(mxfp4.WORD_ORDER.value):
        want = (_element(words, k) * 2.0**-14).astype(np.float32).view(np.uint32)
        np.testing.assert_array_equal(regs[f"${out}"], want, err_msg=f"${out}: element {k}")


def test_scaled_bf16(rng):
    """``_BF16_SCALED``: each nibble times its byte's bf16 factor (a power of two, 0, or NaN,
    as ``value_factors`` makes them), rounded once to bf16 (+-inf past the range)."""
    words = _words(rng)
    scale_bytes = rng.integers(0, 256, (4, len(words)))
    bits = np.where(scale_bytes == 255, 0x7FC0, scale_bytes << 7).astype(np.uint64)
    factors = [bits[0] | bits[1] << np.uint64(16), bits[2] | bits[3] << np.uint64(16)]
    regs = run_ptx(_ptx("_BF16_SCALED"), [None] * 4 + [words, *factors])
    factor = bits.astype(np.uint16).view(ml_dtypes.bfloat16).astype(np.float64)
    for out, (first, second) in enumerate([(0, 2), (4, 6), (1, 3), (5, 7)]):
        for half, k in ((0, first), (1, second)):
            byte = k // 2
            with np.errstate(over="ignore", invalid="ignore"):
                want = (_element(words, k) * factor[byte]).astype(ml_dtypes.bfloat16)
            got = ((regs[f"${out}"] >> np.uint64(16 * half)) & np.uint64(0xFFFF))
            got = got.astype(np.uint16).view(ml_dtypes.bfloat16)
            nan = np.isnan(want.astype(np.float32))
            np.testing.assert_array_equal(np.isnan(got.astype(np.float32)), nan)
            np.testing.assert_array_equal(got.view(np.uint16)[~nan], want.view(np.uint16)[~nan],
                                          err_msg=f"${out} element {k}")


def test_interpreter_knows_every_instruction():
    """Every opcode the decode's PTX uses is one ``run_ptx`` executes (a new instruction in
    the text must come with its semantics here, not be skipped)."""
    known = {".reg", "mov.b32", "mov.f32", "shl.b32", "shr.b32", "and.b32", "or.b32",
             "prmt.b32", "cvt.f32.f16", "mul.rn.bf16x2"}
    for name in ("_FP16_PAIRS", "_WORD_FP32", "_BF16_SCALED"):
        ops = set(re.findall(r"(?:^|;)\s*([.\w]+)", _ptx(name).strip().strip("{}")))
        assert ops <= known, (name, ops - known)
