"""What the kernels' exactness rests on in the GPU's tensor cores, checked on the device.

The key decodes feed e2m1 codes to ``mma.sync`` as fp16 ``e2m1 * 2**-14`` (``mxfp4._FP16_PAIRS``):
code 1 is the fp16 subnormal ``2**-15``, so the exact-data tests of every tensor-core index
tile and of attention rest on subnormal fp16 operands going in unflushed. This checks that
directly, on products and 32-term sums that fp32 holds exactly. It also asks the same of bf16
subnormals (``e2m1 * 2**-126``, code 1 the bf16 subnormal ``2**-127``: a value decode that left
its ``2**126`` to the other operand would rest on it) and reports the answer as a fact, not a
requirement: no kernel relies on it yet."""

from __future__ import annotations

import gpu_env
import jax
import ml_dtypes
import numpy as np

pytestmark = gpu_env.required()

E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, 0, -0.5, -1, -1.5, -2, -3, -4, -6])


def _dot(a_bits: np.ndarray, b_bits: np.ndarray, dtype) -> np.ndarray:
    """``a [16, 32] @ b [32, 16]`` on the tensor cores (``tl.dot``, fp32 accumulation), the
    operands given as the 16-bit patterns of ``dtype`` ("fp16" or "bf16")."""
    import jax.numpy as jnp
    import triton
    import triton.language as tl
    from jax.core import ShapedArray

    from jax_mxfp4._src.core.targets import CUDA, Target
    from jax_mxfp4._src.gpu import launch as launcher
    from jax_mxfp4._src.triton import triton_call

    @triton.jit
    def dot_kernel(a_ptr, b_ptr, out_ptr, FP16: tl.constexpr):
        # the operands travel as bf16 buffers (the launcher's 16-bit type), fp16 bits in them
        m, k, n = tl.arange(0, 16), tl.arange(0, 32), tl.arange(0, 16)
        a = tl.load(a_ptr + m[:, None] * 32 + k[None, :])
        b = tl.load(b_ptr + k[:, None] * 16 + n[None, :])
        if FP16:
            a, b = a.to(tl.float16, bitcast=True), b.to(tl.float16, bitcast=True)
        tl.store(out_ptr + m[:, None] * 16 + n[None, :], tl.dot(a, b))

    arch = "".join(gpu_env.gpu().compute_capability.split("."))
    target = Target(CUDA, CUDA, arch, gpu_env.units())
    element = ml_dtypes.bfloat16
    avals = (ShapedArray((16, 32), element), ShapedArray((32, 16), element),
             ShapedArray((16, 16), jnp.float32))
    step = triton_call.launch(
        dot_kernel, target, grid=(1, 1, 1), buffers=("a_ptr", "b_ptr", "out_ptr"),
        avals=avals, scalars={}, constants={"FP16": dtype == "fp16"})
    run = jax.jit(lambda a, b: launcher.call(step, (a, b), avals[2:])[0])
    return np.asarray(run(jnp.asarray(a_bits.view(element)), jnp.asarray(b_bits.view(element))))


def _operands(rng, dtype):
    """Keys ``[16, 32]`` (every e2m1 code, code 1 in every row, at the decode's fp16 or bf16
    placement) and a query-like ``[32, 16]`` whose products and sums fp32 holds exactly, as
    bit patterns, with their values in float64."""
    codes = rng.integers(0, 16, (16, 32))
    codes[:, ::4] = 1  # the subnormal code in every row
    if dtype == "fp16":
        keys = E2M1[codes] * 2.0**-14
        key_bits = keys.astype(np.float16).view(np.uint16)
        q = rng.integers(-8, 9, (32, 16)) * 2.0**rng.integers(-2, 5, (32, 16))  # e4m3-like
        q_bits = q.astype(np.float16).view(np.uint16)
    else:
        keys = E2M1[codes] * 2.0**-126
        key_bits = keys.astype(ml_dtypes.bfloat16).view(np.uint16)
        q = rng.integers(-8, 9, (32, 16)) * 2.0**(rng.integers(-2, 5, (32, 16)) + 120)
        q_bits = q.astype(ml_dtypes.bfloat16).view(np.uint16)
    return key_bits, q_bits, keys @ q


def test_fp16_subnormal_operands_are_exact(rng):
    key_bits, q_bits, want = _operands(rng, "fp16")
    assert ((key_bits[:, ::4] & 0x7C00) == 0).all()  # 2**-15: exponent field 0
    got = _dot(key_bits, q_bits, "fp16")
    np.testing.assert_array_equal(got, want.astype(np.float32))


def test_bf16_subnormal_operands(rng, capsys):
    """Whether bf16 subnormal operands reach the product unflushed: printed (``-s``), and
    checked to be one or the other: exact, or exact once code 1's subnormals are zeros."""
    key_bits, q_bits, want = _operands(rng, "bf16")
    assert ((key_bits[:, ::4] & 0x7F80) == 0).all()  # 2**-127: exponent field 0
    got = _dot(key_bits, q_bits, "bf16")
    flushed = key_bits.copy()
    flushed[(flushed & 0x7F80) == 0] &= 0x8000
    keys_flushed = flushed.view(ml_dtypes.bfloat16).astype(np.float64)
    q = q_bits.view(ml_dtypes.bfloat16).astype(np.float64)
    exact = np.array_equal(got, want.astype(np.float32))
    flush = np.array_equal(got, (keys_flushed @ q).astype(np.float32))
    with capsys.disabled():
        print(f"\nbf16 subnormal operands on {gpu_env.gpu().device_kind}: "
              f"{'kept exact' if exact else 'flushed to zero' if flush else 'neither'}")
    assert exact or flush
