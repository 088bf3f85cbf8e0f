"""Every MFMA form the code objects use, run as assembly snippets, against float64 matrix
products, through the register layouts AMD documents (packed here independently of the
emulator's own layout code):

* dense A/B: lane ``i + M*(k // e)`` holds ``e = K*M/64`` consecutive k of row i, low element
  first (AMD Matrix Instruction Calculator for CDNA3, composable_kernel for the gfx950
  doubled-K forms); C/D: register ``i % 4``, lane ``16*(i//4) + j`` (16x16), register
  ``4*(i//8) + i%4``, lane ``32*((i//4)%2) + j`` (32x32) (calculator; AMD matrix-core blog);
* f8f6f4: fp4 lanes hold 32 consecutive k; fp8 lanes hold two chunks of 16 k, chunk c of lane
  group g being k = 16*(c*G + g) (AMD matrix-core blog, CDNA4 32x32x64 examples);
* e8m0 block scales of row i / column j for k-block b in lane ``i + M*b``.

Data: random values whose products and sums are exact in fp32 (so the comparison is bit for
bit and only the layout can make it fail), zeros, the largest magnitudes, and every scale byte
0..255 (255 = NaN). Mutations: swapping lanes 0 and 1 in the emulator's output layout
(``mfma.output_slot``) failed every test here; taking the f8f6f4 fp8 operands as 32
contiguous k per lane (like fp4) failed every scaled case with an fp8 operand.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from snippets import as_f32, f32_bits, run_snippet

from cdna_emulator import EmulatorFault

FP8 = {"gfx950": ml_dtypes.float8_e4m3fn, "gfx942": ml_dtypes.float8_e4m3fnuz}


def dense_lane(m_dim, k_dim):
    i, k = np.meshgrid(np.arange(m_dim), np.arange(k_dim), indexing="ij")
    per_lane = k_dim * m_dim // 64
    return i + m_dim * (k // per_lane), k % per_lane


def f8f6f4_lane(m_dim, k_dim, bits):
    i, k = np.meshgrid(np.arange(m_dim), np.arange(k_dim), indexing="ij")
    groups = 64 // m_dim
    if bits == 4:
        return i + m_dim * (k // 32), k % 32
    chunk = k // 16
    return i + m_dim * (chunk % groups), (chunk // groups) * 16 + k % 16


def pack(codes: np.ndarray, lanes, elems, bits: int) -> np.ndarray:
    """Element codes ``[M, K]`` -> registers uint32 ``[R, 64]`` by a (lane, element) map."""
    per_lane = int(elems.max()) + 1
    lane_vals = np.zeros((64, per_lane), np.uint64)
    lane_vals[lanes, elems] = codes
    words = per_lane * bits // 32
    out = np.zeros((words, 64), np.uint32)
    per_word = 32 // bits
    for e in range(per_lane):
        out[e // per_word] |= (lane_vals[:, e].astype(np.uint32) << np.uint32(
            bits * (e % per_word)))
    return out


def output_slot(m_dim):
    i, j = np.meshgrid(np.arange(m_dim), np.arange(m_dim), indexing="ij")
    if m_dim == 16:
        return i % 4, 16 * (i // 4) + j
    return 4 * (i // 8) + i % 4, 32 * ((i // 4) % 2) + j


def pack_c(c: np.ndarray) -> np.ndarray:
    m_dim = c.shape[0]
    reg, lane = output_slot(m_dim)
    out = np.zeros((m_dim * m_dim // 64, 64), np.uint32)
    out[reg, lane] = f32_bits(c)
    return out


def unpack_d(regs: np.ndarray, m_dim: int) -> np.ndarray:
    reg, lane = output_slot(m_dim)
    return as_f32(regs[reg, lane])


def run_mfma(instruction: str, a_regs, b_regs, c_regs, extra=(), arch="gfx950", m_dim=16,
             c_operand=None):
    """Run one MFMA per wave: inputs per wave stacked along lanes; D as [waves, M, M]."""
    waves = a_regs.shape[0]
    na, nb, nc = a_regs.shape[1], b_regs.shape[1], c_regs.shape[1]
    planes = [a_regs, b_regs, c_regs] + [x[:, None, :] for x in extra]
    inputs = np.concatenate(planes, axis=1)  # [waves, regs, 64]
    inputs = inputs.transpose(1, 0, 2).reshape(inputs.shape[1], -1)
    first = 2
    ra = f"v[{first}:{first + na - 1}]"
    rb = f"v[{first + na}:{first + na + nb - 1}]"
    rc = c_operand or f"v[{first + na + nb}:{first + na + nb + nc - 1}]"
    scale_regs = [f"v{first + na + nb + nc + i}" for i in range(len(extra))]
    nd = m_dim * m_dim // 64
    dst = 64
    rd = f"v[{dst}:{dst + nd - 1}]"
    body = instruction.format(d=rd, a=ra, b=rb, c=rc, sa=scale_regs[0] if extra else "",
                              sb=scale_regs[1] if extra else "")
    out = run_snippet(body, inputs, [f"v{dst + r}" for r in range(nd)], arch=arch, vgprs=96)
    out = out.reshape(nd, waves, 64).transpose(1, 0, 2)
    return np.stack([unpack_d(out[w], m_dim) for w in range(waves)])


def exact_values(rng, shape, choices, low=-3, high=3):
    """Values from ``choices`` times small powers of two (exact products and sums)."""
    return rng.choice(choices, shape) * 2.0 ** rng.integers(low, high, shape)


# ---- dense MFMAs ---------------------------------------------------------------------------

DENSE = [
    # (mnemonic, arch, M, K, element type)
    ("v_mfma_f32_16x16x16_f16", "gfx942", 16, 16, "f16"),
    ("v_mfma_f32_16x16x16_bf16", "gfx942", 16, 16, "bf16"),
    ("v_mfma_f32_32x32x8_f16", "gfx942", 32, 8, "f16"),
    ("v_mfma_f32_32x32x8_bf16", "gfx942", 32, 8, "bf16"),
    ("v_mfma_f32_16x16x16_f16", "gfx950", 16, 16, "f16"),
    ("v_mfma_f32_16x16x32_f16", "gfx950", 16, 32, "f16"),
    ("v_mfma_f32_16x16x32_bf16", "gfx950", 16, 32, "bf16"),
    ("v_mfma_f32_32x32x16_f16", "gfx950", 32, 16, "f16"),
    ("v_mfma_f32_32x32x16_bf16", "gfx950", 32, 16, "bf16"),
    ("v_mfma_f32_32x32x8_f16", "gfx950", 32, 8, "f16"),
    ("v_mfma_f32_16x16x32_fp8_fp8", "gfx942", 16, 32, "fp8"),
    ("v_mfma_f32_16x16x32_fp8_fp8", "gfx950", 16, 32, "fp8"),
]


def codes_of(values, kind, arch):
    if kind == "f16":
        return values.astype(np.float16).view(np.uint16), 16
    if kind == "bf16":
        return values.astype(ml_dtypes.bfloat16).view(np.uint16), 16
    return values.astype(FP8[arch]).view(np.uint8), 8


@pytest.mark.parametrize(("name", "arch", "m_dim", "k_dim", "kind"), DENSE)
def test_dense_mfma_matches_float64_product(rng, name, arch, m_dim, k_dim, kind):
    """D = A @ B + C for 4 random cases and one of zeros plus largest magnitudes, with C from
    registers and from the inline constant 0."""
    waves = 5
    a = exact_values(rng, (waves, m_dim, k_dim), [0.0, 0.5, 1.0, -1.5, 3.0])
    b = exact_values(rng, (waves, k_dim, m_dim), [0.0, 1.0, -1.25, 2.0])
    c = exact_values(rng, (waves, m_dim, m_dim), [0.0, 1.0, -0.75])
    big = {"f16": 65504.0, "bf16": 2.0**100, "fp8": 448.0 if arch == "gfx950" else 240.0}[kind]
    a[-1] = 0
    a[-1, :, 0] = big
    b[-1] = 0
    b[-1, 0, :] = -big / 2 if kind != "bf16" else -(2.0**20)
    lanes, elems = dense_lane(m_dim, k_dim)
    ac = [codes_of(x, kind, arch) for x in a]
    bc = [codes_of(x.T, kind, arch) for x in b]
    a_regs = np.stack([pack(cd, lanes, elems, bits) for cd, bits in ac])
    b_regs = np.stack([pack(cd, lanes, elems, bits) for cd, bits in bc])
    c_regs = np.stack([pack_c(x.astype(np.float32)) for x in c])
    got = run_mfma(name + " {d}, {a}, {b}, {c}", a_regs, b_regs, c_regs, arch=arch,
                   m_dim=m_dim)
    av = np.stack([_decode(cd, kind, arch) for cd, _ in ac])
    bv = np.stack([_decode(cd, kind, arch).T for cd, _ in bc])
    want = (av @ bv + c).astype(np.float32)
    np.testing.assert_array_equal(got, want)
    got0 = run_mfma(name + " {d}, {a}, {b}, 0", a_regs, b_regs, c_regs, arch=arch,
                    m_dim=m_dim)
    np.testing.assert_array_equal(got0, (av @ bv).astype(np.float32))


def _decode(codes, kind, arch):
    if kind == "f16":
        return codes.view(np.float16).astype(np.float64)
    if kind == "bf16":
        return codes.view(ml_dtypes.bfloat16).astype(np.float64)
    return codes.view(FP8[arch]).astype(np.float64)


# ---- scaled f8f6f4 -----------------------------------------------------------------------------

FORMATS = {"fp8": (0, 8), "fp4": (4, 4)}


def f8f6f4_codes(values, fmt):
    if fmt == "fp4":
        return values.astype(ml_dtypes.float4_e2m1fn).view(np.uint8) & 15
    return values.astype(ml_dtypes.float8_e4m3fn).view(np.uint8)


def f8f6f4_decode(codes, fmt):
    if fmt == "fp4":
        return codes.astype(np.uint8).view(ml_dtypes.float4_e2m1fn).astype(np.float64)
    return codes.view(ml_dtypes.float8_e4m3fn).astype(np.float64)


def scale_regs(bytes_mn_b: np.ndarray) -> np.ndarray:
    """Scale bytes ``[M, blocks]`` -> one register per lane: lane i + M*b holds (i, b); the
    other bytes of the register are noise (only byte 0 is read without op_sel)."""
    m_dim, blocks = bytes_mn_b.shape
    reg = np.full(64, 0xDEADBE00, np.uint32)
    for b in range(blocks):
        reg[np.arange(m_dim) + m_dim * b] = 0xDEADBE00 | bytes_mn_b[:, b].astype(np.uint32)
    return reg


SCALED = [
    # (A format, B format, M, K)
    ("fp4", "fp8", 16, 128),  # what the FlyDSL index and attention kernels issue
    ("fp8", "fp8", 16, 128),
    ("fp4", "fp4", 16, 128),
    ("fp8", "fp4", 16, 128),
    ("fp4", "fp8", 32, 64),
    ("fp8", "fp8", 32, 64),
]


@pytest.mark.parametrize(("fa", "fb", "m_dim", "k_dim"), SCALED)
def test_scaled_mfma_matches_float64_product(rng, fa, fb, m_dim, k_dim):
    """v_mfma_scale_f32_MxNxK_f8f6f4 with cbsz/blgp formats and per-32-block e8m0 scales:
    D[i][j] = C + sum_b 2**(sa[i,b]-127) * 2**(sb[j,b]-127) * sum_{k in b} A[i,k] B[k,j].
    Eight random cases with scales 100..150, then every scale byte 0..255 for A and B
    (255 = NaN). Zero emulator faults."""
    blocks = k_dim // 32
    (ca, bits_a), (cb, bits_b) = FORMATS[fa], FORMATS[fb]
    na_regs, nb_regs = m_dim * k_dim * bits_a // 2048, m_dim * k_dim * bits_b // 2048
    waves = 8 + 256 // m_dim
    a = exact_values(rng, (waves, m_dim, k_dim), [0.0, 0.5, 1.0, -1.5, 2.0, -6.0, 4.0], -1, 1)
    b = exact_values(rng, (waves, k_dim, m_dim), [0.0, 1.0, -0.5, 3.0, -2.0], -1, 1)
    sa = rng.integers(100, 151, (waves, m_dim, blocks))
    sb = rng.integers(100, 151, (waves, m_dim, blocks))
    every = np.arange(256).reshape(-1, m_dim)  # each later wave sweeps m_dim scale bytes
    for w in range(8, waves):
        sa[w] = every[w - 8][:, None]
        sb[w] = every[::-1][w - 8][:, None]
    c = exact_values(rng, (waves, m_dim, m_dim), [0.0, 1.0, -0.75])
    la, ea = f8f6f4_lane(m_dim, k_dim, bits_a)
    lb, eb = f8f6f4_lane(m_dim, k_dim, bits_b)
    a_codes = [f8f6f4_codes(x, fa) for x in a]
    b_codes = [f8f6f4_codes(x.T, fb) for x in b]
    a_regs = np.stack([pack(cd, la, ea, bits_a) for cd in a_codes])
    b_regs = np.stack([pack(cd, lb, eb, bits_b) for cd in b_codes])
    assert a_regs.shape[1] == na_regs and b_regs.shape[1] == nb_regs
    c_regs = np.stack([pack_c(x.astype(np.float32)) for x in c])
    extra = (np.stack([scale_regs(s) for s in sa]), np.stack([scale_regs(s) for s in sb]))
    name = f"v_mfma_scale_f32_{m_dim}x{m_dim}x{k_dim}_f8f6f4"
    got = run_mfma(name + f" {{d}}, {{a}}, {{b}}, {{c}}, {{sa}}, {{sb}} cbsz:{ca} blgp:{cb}",
                   a_regs, b_regs, c_regs, extra=extra, m_dim=m_dim)
    av = np.stack([f8f6f4_decode(cd, fa) for cd in a_codes])
    bv = np.stack([f8f6f4_decode(cd, fb).T for cd in b_codes])
    fa_ = np.where(sa == 255, np.nan, np.ldexp(1.0, sa - 127))  # [w, M, blocks]
    fb_ = np.where(sb == 255, np.nan, np.ldexp(1.0, sb - 127))
    part = np.einsum("wibk,wbkj->wijb", av.reshape(waves, m_dim, blocks, 32),
                     bv.reshape(waves, blocks, 32, m_dim))
    want = (np.einsum("wijb,wib,wjb->wij", part, fa_, fb_) + c).astype(np.float32)
    assert (np.isnan(got) == np.isnan(want)).all()
    np.testing.assert_array_equal(got[~np.isnan(got)], want[~np.isnan(want)])


def test_scale_from_an_inline_constant_uses_the_exponent_field(rng):
    """An inline or SGPR scale uses bits [30:23] of its 32-bit value (LLVM PR #158117):
    ``2.0`` scales A by 2, ``0.5`` scales B by 1/2."""
    m_dim, k_dim = 16, 128
    a = exact_values(rng, (1, m_dim, k_dim), [0.0, 1.0, -2.0], 0, 1)
    b = exact_values(rng, (1, k_dim, m_dim), [0.0, 1.0, 0.5], 0, 1)
    la, ea = f8f6f4_lane(m_dim, k_dim, 4)
    lb, eb = f8f6f4_lane(m_dim, k_dim, 8)
    a_regs = pack(f8f6f4_codes(a[0], "fp4"), la, ea, 4)[None]
    b_regs = pack(f8f6f4_codes(b[0].T, "fp8"), lb, eb, 8)[None]
    c_regs = np.zeros((1, 4, 64), np.uint32)
    got = run_mfma("v_mfma_scale_f32_16x16x128_f8f6f4 {d}, {a}, {b}, 0, 2.0, 0.5 cbsz:4",
                   a_regs, b_regs, c_regs)
    np.testing.assert_array_equal(got[0], (a[0] @ b[0]).astype(np.float32))


@pytest.mark.parametrize("instruction", [
    "v_mfma_scale_f32_16x16x128_f8f6f4 {d}, {a}, {b}, 0, 1.0, 1.0 cbsz:4 abid:1",
    "v_mfma_f32_16x16x128_f8f6f4 {d}, {a}, {b}, 0 cbsz:4 abid:2",
])
def test_an_abid_broadcast_is_refused_not_dropped(instruction):
    """``abid`` selects which A block a broadcast uses; the emulator does not model it, so a
    nonzero one is a fault (it used to be dropped: the MFMA ran as if abid were 0). Issue 46;
    mutation check: the old ``mods.pop("abid", None)`` made this fail."""
    regs = np.zeros((1, 8, 64), np.uint32)
    with pytest.raises(EmulatorFault, match="abid"):
        run_mfma(instruction, regs[:, :4], regs, np.zeros((1, 4, 64), np.uint32))


def test_mfma_writes_accumulation_registers():
    """An MFMA whose C and D are AGPRs (Triton's gfx942 code): a[i] is unified VGPR
    accum_offset + i; v_accvgpr_write/read move values in and out."""
    m_dim, k_dim = 16, 16
    rng = np.random.default_rng(7)
    a = exact_values(rng, (m_dim, k_dim), [0.0, 1.0, -2.0])
    b = exact_values(rng, (k_dim, m_dim), [0.0, 1.0, 0.5])
    c = exact_values(rng, (m_dim, m_dim), [0.0, 1.0, 3.0])
    lanes, elems = dense_lane(m_dim, k_dim)
    a_regs = pack(a.astype(np.float16).view(np.uint16), lanes, elems, 16)
    b_regs = pack(b.T.astype(np.float16).view(np.uint16), lanes, elems, 16)
    inputs = np.concatenate([a_regs, b_regs, pack_c(c.astype(np.float32))])
    body = """
        v_accvgpr_write_b32 a0, v6
        v_accvgpr_write_b32 a1, v7
        v_accvgpr_write_b32 a2, v8
        v_accvgpr_write_b32 a3, v9
        v_mfma_f32_16x16x16_f16 a[4:7], v[2:3], v[4:5], a[0:3]
        v_accvgpr_read_b32 v20, a4
        v_accvgpr_read_b32 v21, a5
        v_accvgpr_read_b32 v22, a6
        v_accvgpr_read_b32 v23, a7
    """
    out = run_snippet(body, inputs, ["v20", "v21", "v22", "v23"], arch="gfx942", vgprs=32,
                      agprs=8)
    np.testing.assert_array_equal(unpack_d(out, m_dim), (a @ b + c).astype(np.float32))
