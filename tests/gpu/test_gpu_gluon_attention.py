"""The Gluon attention split kernel (``jax_mxfp4.gpu.kernels.attention_gluon``: warps own
tokens for QK and head dims for PV; two pages a split here) on the GPU, launched through
torch (the lowering takes it only under ``cuda_kernels="gluon"``): its partials merged by the
Triton ``reduce_kernel`` must match the float64 oracle as SPEC §10 asks of attention
(``oracle.attention_close``), NaN and infinities exactly where the oracle has them, and empty
rows zeros."""

from __future__ import annotations

import gpu_env
import ml_dtypes
import numpy as np
import oracle
import pytest
from conftest import SM_SCALE, attention_case, non_finite_v

pytestmark = gpu_env.required()
torch = pytest.importorskip("torch")


def _gluon_attention(case) -> np.ndarray:
    from jax_mxfp4.gpu.kernels import attention_gluon, sparse_attention

    q, k_pool, v_pool, table, ctx = case.args()
    dev = torch.device("cuda")
    tokens, q_heads, _ = q.shape
    num_pages, kv_heads = k_pool.shape[:2]
    group, n = q_heads // kv_heads, table.shape[-1]
    rows, pages = tokens * kv_heads, 2
    splits = -(-n // pages)
    parts = rows * splits * 16
    o = torch.zeros(parts * 128, dtype=torch.bfloat16, device=dev)
    m = torch.zeros(parts, dtype=torch.float32, device=dev)
    l_ = torch.zeros(parts, dtype=torch.float32, device=dev)
    q_t = torch.from_numpy(q.view(np.uint16).astype(np.int16)).to(dev).view(torch.bfloat16)
    pools = [torch.from_numpy(np.ascontiguousarray(p)).to(dev) for p in (k_pool, v_pool)]
    table_t = torch.from_numpy(table.reshape(rows, n)).to(dev)
    ctx_t = torch.from_numpy(ctx.reshape(rows)).to(dev)
    attention_gluon.attention_split_kernel[(rows, splits, 1)](
        q_t, *pools, table_t, ctx_t, o, m, l_, kv_heads, num_pages, n, float(SM_SCALE),
        G=group, PAGES=pages, SPLITS=splits, Q_IS_FP8=False,
        num_warps=attention_gluon.NUM_WARPS)
    out = torch.zeros((tokens, q_heads, 128), dtype=torch.bfloat16, device=dev)
    sparse_attention.reduce_kernel[sparse_attention.reduce_grid(rows)](
        o, m, l_, out, out, G=group, GP=16, SPLITS=splits, MXFP8=False,
        BLOCKS=sparse_attention.REDUCE_BLOCKS, PTX=True, num_warps=4)
    bits = out.view(torch.int16).cpu().numpy().view(np.uint16)
    return bits.view(ml_dtypes.bfloat16).astype(np.float32)


@pytest.mark.parametrize("group", [16, 8])
def test_gluon_attention_matches_the_oracle(rng, group):
    ctx = rng.integers(0, 16 * 128 + 1, (24, 2))
    ctx[0, 0] = 0  # an empty row: zeros
    ctx[1, 1] = 16 * 128
    ctx[2, 0] = 1
    case = attention_case(rng, ctx, group=group, n_pages=16)
    non_finite_v(case)
    got = _gluon_attention(case)
    want = oracle.sparse_attention(*case.args(), sm_scale=SM_SCALE).astype(np.float32)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
    finite = np.isfinite(want)
    ok, why = oracle.attention_close(np.where(finite, got, 0), np.where(finite, want, 0))
    assert ok, why
    assert np.all(got[0, :group] == 0)
