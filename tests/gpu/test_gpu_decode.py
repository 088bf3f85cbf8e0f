"""The inline-PTX MXFP4 decodes of the Triton kernels (``mxfp4.nibbles_fp16``,
``mxfp4.page_values`` in bf16) bit for bit against the float64 oracle, on the GPU: Triton's
interpreter cannot run inline PTX (tests/interpreted_kernels.py checks the portable decode),
so this is where the decode the kernels actually run is held exact. Every code, every scale
byte (0: zeros as the fp32 kernels' ``pow2`` gives; 1: subnormal bf16 results; 254: +-inf past
the range; 255: NaN), dead tokens with NaN scales zeros. Launched through torch (the kernel
takes raw pointers), so it needs torch beside the GPU."""

from __future__ import annotations

import gpu_env
import ml_dtypes
import numpy as np
import oracle
import pytest
import triton
import triton.language as tl

from jax_mxfp4._src.triton import mxfp4

pytestmark = gpu_env.required()
torch = pytest.importorskip("torch")


@triton.jit
def _values_kernel(page_ptr, out_ptr, n_live, DTYPE: tl.constexpr):
    codes, scales = mxfp4.page_bytes(page_ptr, True)
    tok = tl.arange(0, 128)
    even, odd = mxfp4.page_values(codes, scales, tok < n_live, DTYPE, True)
    base = out_ptr + tok[:, None] * 128 + 2 * tl.arange(0, 64)[None, :]
    tl.store(base, even.to(tl.float32))
    tl.store(base + 1, odd.to(tl.float32))


@triton.jit
def _keys_kernel(page_ptr, out_ptr):
    tok = tl.arange(0, 128)
    raw = tl.load(page_ptr + tok[:, None] * 64 + tl.arange(0, 64)[None, :])
    keys = mxfp4.nibbles_fp16(raw)
    tl.store(out_ptr + tok[:, None] * 128 + tl.arange(0, 128)[None, :], keys.to(tl.float32))


def _page(rng) -> np.ndarray:
    """Random codes; scale bytes 0..255 each at least once, the last 10 tokens NaN-scaled."""
    page = rng.integers(0, 256, 8704).astype(np.uint8)
    scales = rng.permutation(np.resize(np.arange(256, dtype=np.uint8), 512))
    page[8192:] = scales
    page[8192 + 4 * 118:] = 255
    return page


def _run(kernel, page, *args, **constants) -> np.ndarray:
    dev = torch.device("cuda")
    out = torch.zeros(128 * 128, dtype=torch.float32, device=dev)
    kernel[(1,)](torch.from_numpy(page).to(dev), out, *args, **constants, num_warps=4)
    return out.cpu().numpy().reshape(128, 128)


def _expected_values(page) -> np.ndarray:
    with np.errstate(over="ignore"):
        want = oracle.dequant_pool(page[None])[0].astype(np.float32)
    byte = np.repeat(page[8192:].reshape(128, 4), 32, axis=1)
    want[byte == 0] *= 0.0  # 2**-127 scales flush (signed zeros), as pow2 does in every kernel
    return want.astype(ml_dtypes.bfloat16).astype(np.float32)


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_value_decode_is_exact(rng, dtype):
    page = _page(rng)
    got = _run(_values_kernel, page, 118, DTYPE=tl.bfloat16 if dtype == "bf16" else tl.float32)
    want = _expected_values(page)[:118]
    assert np.isnan(want).any() and np.isinf(want).any() and (want == 0).any()
    same = oracle.bits_equal(got[:118], want)
    assert same.all(), f"{(~same).sum()} values differ, first at {np.argwhere(~same)[:4]}"
    assert (got[118:] == 0).all()  # dead tokens (NaN scales) are zeros, of either sign


def test_key_decode_is_exact(rng):
    page = _page(rng)
    got = _run(_keys_kernel, page)
    codes = np.stack([page[:8192] & 15, page[:8192] >> 4], axis=-1).reshape(128, 128)
    want = (oracle.E2M1_TABLE[codes] * 2.0**-14).astype(np.float32)
    assert oracle.bits_equal(got, want).all()
