"""The Gluon index tile (``jax_mxfp4.gpu.kernels.index_tile_gluon``, keys decoded straight into
the tensor cores' registers) against the float64 oracle on the GPU, launched through torch
(it is not in the lowering yet): within the index score tolerance (docs/spec.md §10), ``-inf``
exactly where the oracle has it, NaN where a live token's scale byte is 255."""

from __future__ import annotations

import gpu_env
import numpy as np
import oracle
import pytest
from conftest import SM_SCALE, decode_index_case

from jax_mxfp4.scaling import folded_score_scale

pytestmark = gpu_env.required()
torch = pytest.importorskip("torch")


def _tile_scores(case, rows_per_tile: int) -> np.ndarray:
    from jax_mxfp4.gpu.kernels import index_tile_gluon as kernels

    q, pool, table, positions, requests = (np.asarray(a) for a in case.args()[:5])
    dev = torch.device("cuda")
    heads = q.shape[1]
    t = len(positions)
    out = torch.full((heads, t, case.num_blocks), 7.0, dtype=torch.float32, device=dev)
    q_bits = torch.from_numpy(q.view(np.uint16).astype(np.int16)).to(dev).view(torch.bfloat16)
    grid = (-(-t // rows_per_tile), case.num_blocks, 1)
    kernels.index_tile_kernel[grid](
        q_bits, torch.from_numpy(pool).to(dev), torch.from_numpy(table).to(dev),
        torch.from_numpy(positions).to(dev), torch.from_numpy(requests).to(dev), out,
        t, table.shape[0], table.shape[1], pool.shape[0], case.num_blocks,
        float(folded_score_scale(SM_SCALE)), H=heads, ROWS=rows_per_tile, ROUND_Q=True,
        num_warps=kernels.WARPS)
    return out.cpu().numpy()


@pytest.mark.parametrize("heads,rows_per_request", [(1, 8), (4, 4), (1, 1)])
def test_gluon_tile_within_tolerance(rng, heads, rows_per_request):
    kw = dict(num_heads=heads, num_blocks=5, table_width=6, num_pages=40, scale_lo=110,
              scale_hi=140)
    case = decode_index_case(rng, [600, 33, 128, 257, 0], rows_per_request, **kw)
    pool = np.asarray(case.pool)
    page = case.block_table[0, 2]
    pool[page, 8192 + 4 * 5 + 1] = 255  # token 5 of request 0's block 2: NaN keys
    static = dict(num_blocks=case.num_blocks, sm_scale=SM_SCALE, q_round="e4m3")
    truth = oracle.index_scores(*case.args(), **static).astype(np.float64)
    got = _tile_scores(case, max(1, 16 // heads) if rows_per_request > 1 else 1)
    assert np.array_equal(np.isneginf(got), np.isneginf(truth))
    assert np.array_equal(np.isnan(got), np.isnan(truth))
    assert np.isnan(truth).any()
    live = np.isfinite(truth)
    assert live.sum() > 8
    magnitude = oracle.index_score_magnitudes(*case.args(), **static)[live]
    err = oracle.index_score_errors(got[live], truth[live], magnitude)
    assert err.max() <= 1, err.max()
