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

from jax_mxfp4._src.triton import mxfp4

E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6])
MASK32 = np.uint64(0xFFFFFFFF)


def _u32(x) -> np.ndarray:
    return np.asarray(x, np.uint64) & MASK32


def _s32(x) -> np.ndarray:
    """uint32 bits (in uint64) as signed int64."""
    return (x.astype(np.int64) ^ 0x80000000) - 0x80000000


def _prmt(a, b, selector):
    """``prmt.b32`` in its default mode: result byte ``i`` is byte ``sel_i & 7`` of ``{b, a}``,
    replaced by its sign bit replicated where ``sel_i & 8``. ``selector``: an immediate or a
    register (only its low 16 bits count)."""
    pool = np.stack([(a >> np.uint64(8 * i)) & np.uint64(0xFF) for i in range(4)]
                    + [(b >> np.uint64(8 * i)) & np.uint64(0xFF) for i in range(4)])
    selector = np.broadcast_to(np.asarray(selector, np.uint64), a.shape)
    out = np.zeros_like(a)
    for i in range(4):
        sel = ((selector >> np.uint64(4 * i)) & np.uint64(0xF)).astype(np.int64)
        byte = np.take_along_axis(pool, (sel & 7)[None], 0)[0]
        sign = np.where(byte & np.uint64(0x80), np.uint64(0xFF), np.uint64(0))
        out |= np.where(sel & 8, sign, byte) << np.uint64(8 * i)
    return out


def _dp4a(a, b, c, b_signed: bool):
    """``dp4a.u32.u32`` / ``dp4a.u32.s32``: ``c`` plus the four byte products of ``a``
    (unsigned) and ``b`` (unsigned, or signed), mod 2**32."""
    total = c.astype(np.int64)
    for i in range(4):
        x = ((a >> np.uint64(8 * i)) & np.uint64(0xFF)).astype(np.int64)
        y = ((b >> np.uint64(8 * i)) & np.uint64(0xFF)).astype(np.int64)
        if b_signed:
            y = (y ^ 0x80) - 0x80
        total += x * y
    return _u32(total & 0xFFFFFFFF)


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
        if token == "%laneid":
            return np.arange(int(np.prod(shape)), dtype=np.uint64).reshape(shape) % np.uint64(32)
        if token.startswith("0f"):  # an fp32 immediate, as its bits
            return np.full(shape, int(token[2:], 16), np.uint64)
        return np.full(shape, int(token, 0) & 0xFFFFFFFF, np.uint64)  # an immediate's bits

    def f32(x):
        return x.astype(np.uint32).view(np.float32)

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
        elif op == "xor.b32":
            result = x[0] ^ x[1]
        elif op == "prmt.b32":
            result = _prmt(x[0], x[1], x[2])
        elif op in ("dp4a.u32.u32", "dp4a.u32.s32"):
            result = _dp4a(x[0], x[1], x[2], op.endswith("s32"))
        elif op == "mad.lo.u32":
            result = (x[0] * x[1] + x[2]) & MASK32
        elif op == "mov.u32":
            result = x[0]
        elif op == "mul.f32":
            with np.errstate(invalid="ignore", over="ignore"):
                result = (f32(x[0]) * f32(x[1])).view(np.uint32).astype(np.uint64)
        elif op == "cvt.rzi.s32.f32":  # NaN -> 0, as PTX has it
            v = f32(x[0])
            result = _u32(np.where(np.isnan(v), 0, np.trunc(np.nan_to_num(v))).astype(np.int64))
        elif op == "cvt.f32.f16":
            half = x[0].astype(np.uint16).view(np.float16)
            result = half.astype(np.float32).view(np.uint32).astype(np.uint64)
        elif op == "mul.rn.bf16x2":
            result = _bf16_mul(x[0], x[1])
        elif op == "bfe.u32":
            result = (x[0] >> x[1]) & ((np.uint64(1) << x[2]) - np.uint64(1))
        elif op in ("add.u32", "add.s32"):
            result = (x[0] + x[1]) & MASK32
        elif op == "sub.s32":
            result = _u32(_s32(x[0]) - _s32(x[1]))
        elif op in ("max.u32", "min.u32"):
            result = (np.maximum if op.startswith("max") else np.minimum)(x[0], x[1])
        elif op == "max.s32":
            result = _u32(np.maximum(_s32(x[0]), _s32(x[1])))
        elif op == "setp.eq.u32":
            result = x[0] == x[1]
        elif op == "selp.b32":
            result = np.where(x[2], x[0], x[1])
        elif op == "shfl.sync.idx.b32":  # lane i of each 32 reads lane x[1] (mask: all lanes)
            assert args[2:] == ["0x1f", "0xffffffff"], statement
            warps = x[0].reshape(-1, 32)
            lanes = (x[1].reshape(-1, 32) & np.uint64(31)).astype(np.int64)
            result = np.take_along_axis(warps, lanes, 1).reshape(x[0].shape)
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


def _e4m3_query(rng, n: int) -> np.ndarray:
    """``n`` e4m3 values as fp32: every finite e4m3 value first (+-448, the subnormals down
    to ``2**-9``, both zeros), then random finite ones."""
    codes = np.arange(256, dtype=np.uint8)
    codes = codes[(codes & 0x7F) != 0x7F]  # no NaN
    codes = np.concatenate([codes, rng.choice(codes, n)])[:n]
    return codes.view(ml_dtypes.float8_e4m3fn).astype(np.float32)


def _slice_bytes(x: np.ndarray, shift: int) -> np.ndarray:
    """Byte ``shift / 8`` of four int32 elements (``x[..., 0..3]``) packed low to high."""
    u = _u32(x.astype(np.int64) & 0xFFFFFFFF)
    return sum(((u[..., i] >> np.uint64(shift)) & np.uint64(0xFF)) << np.uint64(8 * i)
               for i in range(4))


def test_group_dot(rng):
    """``row_dot._GROUP_DOT``: a scale group's four code words against its query slices give
    ``sum(2 * e2m1 * x)`` exactly (``x = q * 2**9`` of e4m3 queries over their whole range),
    with zeros in ``$1..$3``."""
    from jax_mxfp4._src.triton import row_dot

    words = _words(rng)
    words = words[: len(words) // 4 * 4].reshape(-1, 4)  # [groups, 4 words]
    x = (_e4m3_query(rng, words.size * 8).reshape(-1, 4, 8).astype(np.float64) * 512)
    x = x.astype(np.int64)  # [groups, word, element]
    # the extremes: every element 6 or -6 against +-448 (|dot| = 32 * 12 * 448 * 2**9)
    words[:4] = [[0x77777777] * 4, [0xFFFFFFFF] * 4, [0x77777777] * 4, [0xF7F7F7F7] * 4]
    x[:4] = 448 * 512 * np.array([1, 1, -1, 1])[:, None, None]
    slices = [_slice_bytes(x[:, :, 4 * half:4 * half + 4], shift)
              for shift in (0, 8, 16) for half in (0, 1)]  # lo0, lo1, mid0, mid1, hi0, hi1
    start = _u32((-12 * x.sum(axis=(1, 2))) & 0xFFFFFFFF)
    operands = [None] * 4 + [words[:, w] for w in range(4)]
    operands += [sl[:, w] for sl in slices for w in range(4)]
    operands += [start] + [np.zeros_like(start)] * 3
    operands += [np.full_like(start, 0x0F0E0D0C)] * 4 + [np.full_like(start, 0x090A0B0C)] * 4
    regs = run_ptx(row_dot._GROUP_DOT.value, operands)
    doubled = np.stack([_element(words, k) * 2 for k in range(8)], axis=-1)  # [g, 4, 8]
    want = (doubled.astype(np.int64) * x).sum(axis=(1, 2))
    assert np.abs(want).max() > 2**24  # the range reaches past fp32's exact integers
    np.testing.assert_array_equal(regs["$0"], _u32(want & 0xFFFFFFFF))
    for out in ("$1", "$2", "$3"):
        assert not regs[out].any()


def test_query_slices(rng):
    """``row_dot._FIXED`` (``x = q * 2**9``, NaN as 0) and ``row_dot._SLICES`` (the low,
    middle and high bytes of four elements' ``x``), and ``_TABLE_WORDS``' two words."""
    from jax_mxfp4._src.triton import row_dot

    q = _e4m3_query(rng, 4096)
    q[:3] = [np.nan, -np.nan, 448.0]
    fixed = run_ptx(row_dot._FIXED.value, [None, q.view(np.uint32)])["$0"]
    want = np.where(np.isnan(q), 0, q.astype(np.float64) * 512).astype(np.int64)
    np.testing.assert_array_equal(fixed, _u32(want & 0xFFFFFFFF))
    x = want.reshape(-1, 4)
    regs = run_ptx(row_dot._SLICES.value, [None] * 3 + [_u32(x[:, i] & 0xFFFFFFFF)
                                                        for i in range(4)])
    for out, shift in (("$0", 0), ("$1", 8), ("$2", 16)):
        np.testing.assert_array_equal(regs[out], _slice_bytes(x, shift), err_msg=out)
    tables = run_ptx(row_dot._TABLE_WORDS.value, [None, None, np.zeros(64, np.uint64)])
    assert (tables["$0"] == 0x0F0E0D0C).all() and (tables["$1"] == 0x090A0B0C).all()


def test_quad_factors(rng):
    """``index_rows_gluon._QUAD_LANES``, ``_OWN_FACTORS`` then ``_QUAD_SHARE``: each lane of a
    quad holding the same four tokens' scale words gets every token's group factors and
    factor, though each lane computed one token's: bit for bit the rule (``top = min(smax,
    240)``, ``2**(s_g - top)``, ``2**(top - 113)``, NaN bits for byte 255), and a group's dot
    ``x`` (the tile's range: 0 or ``2**-24`` to ``2**31``) times its group factor and then the
    factor, in fp32, is ``x * 2**(s_g - 113)`` rounded once wherever the group lies at most
    100 binades below the token's largest."""
    from jax_mxfp4._src.ops.index_scores import gluon_rows as rows

    words = _words(rng)
    words = words[: len(words) // 32 * 32].reshape(-1, 4)  # [quads, 4 tokens]
    lanes = [np.repeat(words[:, k], 4) for k in range(4)]  # lane 4 q + i holds quad q's
    quad = run_ptx(rows._QUAD_LANES.value, [None] * 8 + lanes)
    sources, own = [quad[f"${k}"] for k in range(4)], [quad[f"${4 + k}"] for k in range(4)]
    factors = run_ptx(rows._OWN_FACTORS.value, [None] * 20 + lanes + own)
    shared = []
    for v in range(5):
        regs = run_ptx(rows._QUAD_SHARE.value,
                       [None] * 4 + [factors[f"${4 * v + k}"] for k in range(4)] + sources)
        shared.append(np.stack([regs[f"${k}"].reshape(-1, 4)[:, 0] for k in range(4)], 1))
        for k in range(4):  # the four lanes of a quad agree
            assert (regs[f"${k}"].reshape(-1, 4) == shared[-1][:, k:k + 1]).all(), (v, k)
    byte = np.stack([(words >> np.uint64(8 * g)) & np.uint64(0xFF) for g in range(4)])
    byte = byte.astype(np.int64)  # [group, quad, token]
    smax = byte.max(axis=0)
    top = np.minimum(smax, 240)
    assert (smax == 255).any() and ((smax > 240) & (smax < 255)).any()
    for g in range(4):
        want = (np.maximum(byte[g] - top, -127) + 127) << 23
        np.testing.assert_array_equal(shared[g], want, err_msg=f"group {g}")
    np.testing.assert_array_equal(shared[4], np.where(smax == 255, 0x7FC00000, (top + 14) << 23))
    x = (rng.choice([-1, 1], smax.shape) * np.exp2(rng.uniform(-24, 31, smax.shape)))
    x = x.astype(np.float32)
    x.flat[::97] = 0
    factor = shared[4].astype(np.uint32).view(np.float32)
    ends = []
    for g in range(4):
        kept = (smax != 255) & (byte[g] >= smax - 100)
        with np.errstate(over="ignore"):
            got = (x * shared[g].astype(np.uint32).view(np.float32)) * factor
            want = (x.astype(np.float64) * np.exp2(byte[g] - 113.0)).astype(np.float32)
        np.testing.assert_array_equal(got[kept].view(np.uint32), want[kept].view(np.uint32))
        ends += [np.isinf(want[kept]).any(), (np.abs(want[kept]) < 2.0**-126).any()]
    assert all(ends)  # overflow and subnormal results among them
    assert np.isnan(factor[smax == 255]).all()


def test_interpreter_knows_every_instruction():
    """Every opcode the decode's PTX uses is one ``run_ptx`` executes (a new instruction in
    the text must come with its semantics here, not be skipped)."""
    from jax_mxfp4._src.ops.index_scores import gluon_rows as rows
    from jax_mxfp4._src.triton import row_dot

    known = {".reg", "mov.b32", "mov.f32", "mov.u32", "shl.b32", "shr.b32", "and.b32",
             "or.b32", "xor.b32", "prmt.b32", "cvt.f32.f16", "mul.rn.bf16x2", "dp4a.u32.u32",
             "dp4a.u32.s32", "mad.lo.u32", "mul.f32", "cvt.rzi.s32.f32", "bfe.u32", "add.u32",
             "add.s32", "sub.s32", "max.u32", "min.u32", "max.s32", "setp.eq.u32", "selp.b32",
             "shfl.sync.idx.b32"}
    texts = {name: _ptx(name) for name in ("_FP16_PAIRS", "_WORD_FP32", "_BF16_SCALED")}
    texts.update({name: getattr(row_dot, name).value
                  for name in ("_GROUP_DOT", "_FIXED", "_SLICES", "_TABLE_WORDS")})
    texts.update({name: getattr(rows, name).value
                  for name in ("_QUAD_LANES", "_OWN_FACTORS", "_QUAD_SHARE")})
    for name, text in texts.items():
        ops = set(re.findall(r"(?:^|;)\s*([.\w]+)", text.strip().strip("{}")))
        assert ops <= known, (name, ops - known)
