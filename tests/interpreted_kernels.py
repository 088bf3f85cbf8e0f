"""GPU kernel functions run by Triton's interpreter on the CPU, against the float64 oracle.

Run as a script by ``test_triton_interpreter.py`` (``TRITON_INTERPRET=1`` must be set before
the kernels are decorated, so it needs a process of its own). Only kernels without ``tl.dot``
and without in-kernel e4m3 rounding are checked here: the interpreter's fp16 dots are not
exact and its fp32 -> e4m3 conversion rounds 1.96 down to 1.0 (checked 2026-11-29, triton
3.6.0). Prints one ``ok <name>`` line per check; raises on a mismatch.
"""

from __future__ import annotations

import os
import sys

os.environ["TRITON_INTERPRET"] = "1"

import numpy as np
import oracle
import torch
import triton
import triton.language as tl
from conftest import SM_SCALE, decode_index_case

from jax_mxfp4.gpu.kernels import index_scores, mxfp4, select_blocks
from jax_mxfp4.reference._common import folded_score_scale


@triton.jit
def _page_values_kernel(page_ptr, out_ptr, n_live):
    words, scales = mxfp4.load_page(page_ptr)
    tok = tl.arange(0, 128)
    values = mxfp4.page_values(words, scales, tok < n_live, tl.float32)
    tl.store(out_ptr + tok[:, None] * 128 + tl.arange(0, 128)[None, :], values)


def check_page_values(rng) -> None:
    """Every element of a random page (scale bytes 1..254, so some values overflow to inf)
    dequantized bit for bit; tokens past the live count are zeros."""
    page = rng.integers(0, 256, 8704).astype(np.uint8)
    page[8192:] = rng.integers(1, 255, 512)
    out = torch.zeros(128 * 128)
    _page_values_kernel[(1,)](torch.from_numpy(page), out, 100)
    got = out.numpy().reshape(128, 128)
    want = oracle.dequant_pool(page[None])[0].astype(np.float32)
    want[100:] = 0.0
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    print("ok page_values")


def _torch(x: np.ndarray) -> torch.Tensor:
    """A CPU tensor sharing ``x``'s bytes (ml_dtypes' e4m3 and bf16 included)."""
    x = np.ascontiguousarray(x)
    if str(x.dtype) == "float8_e4m3fn":
        return torch.from_numpy(x.view(np.uint8)).view(torch.float8_e4m3fn)
    if str(x.dtype) == "bfloat16":
        return torch.from_numpy(x.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(x)


def one_row_scores(case, q_round: str) -> np.ndarray:
    """index_scores_kernel with the plan's one-row (CUDA-core) tiling; ``f32 [1, T, NB]``."""
    q, pool, table, positions, requests = (np.asarray(a) for a in case.args()[:5])
    rows, requests_n = len(positions), table.shape[0]
    plan = index_scores.plan(rows, 1, requests_n, case.num_blocks)
    assert plan.one_row, plan
    out = torch.full((1, rows, case.num_blocks), 7.0)
    q_fp8 = str(q.dtype) == "float8_e4m3fn"
    index_scores.index_scores_kernel[plan.grid](
        _torch(q), _torch(pool), _torch(table), _torch(positions), _torch(requests), out, rows,
        requests_n, table.shape[1], pool.shape[0], case.num_blocks,
        float(folded_score_scale(SM_SCALE)), H=1, ROWS=plan.rows, M=plan.m,
        BLOCKS=plan.blocks, Q_IS_FP8=q_fp8, ROUND_Q=False, USE_FP8=False,
        DOT_DTYPE=tl.bfloat16 if q_round == "none" else tl.float16, ONE_ROW=True, FOLD=False,
        num_warps=plan.num_warps)
    return out.numpy()


def check_one_row_index_scores(rng) -> None:
    """Exact data (e4m3 queries, one scale byte per token): bit-equal to the oracle. bf16
    queries kept as bf16 (q_round="none"), scales 110..140: within 2 ulp of the magnitude."""
    kw = dict(num_heads=1, num_blocks=6, table_width=8, num_pages=40)
    exact = decode_index_case(rng, [700, 40, 129, 1, 0], 1, q_dtype="e4m3", per_token=True,
                              scale_lo=124, scale_hi=130, **kw)
    got = one_row_scores(exact, "e4m3")
    want = oracle.index_scores(*exact.args(), num_blocks=exact.num_blocks, sm_scale=SM_SCALE)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    case = decode_index_case(rng, [600, 33, 128, 257, 0, 1], 1, scale_lo=110, scale_hi=140,
                             **kw)
    got = one_row_scores(case, "none")
    static = dict(num_blocks=case.num_blocks, sm_scale=SM_SCALE, q_round="none")
    want = oracle.index_scores(*case.args(), **static).astype(np.float64)
    assert np.array_equal(np.isneginf(got), np.isneginf(want))
    live = np.isfinite(want)
    ulp = oracle.ulp_f32(oracle.index_score_magnitudes(*case.args(), **static)[live])
    err = np.abs(got[live] - want[live]) / ulp
    assert err.max() <= 2, err.max()
    print("ok one_row_index_scores")


def interpreted_select(scores, table, positions, requests, topk, init_blocks, local_blocks):
    """select_blocks_kernel on one (row, head) per program, as the lowering launches it."""
    heads, rows, num_blocks = scores.shape
    ids = torch.full((heads, rows, topk), 7, dtype=torch.int32)
    pages = torch.full((rows, heads, topk), 7, dtype=torch.int32)
    ctx = torch.full((rows, heads), 7, dtype=torch.int32)
    select_blocks.select_blocks_kernel[(rows, heads, 1)](
        _torch(scores), _torch(table), _torch(positions), _torch(requests), ids, pages, ctx,
        rows, table.shape[0], table.shape[1], num_blocks, init_blocks, local_blocks, H=heads,
        NBP=select_blocks.padded(num_blocks), TOPK=topk, KP=select_blocks.padded(topk))
    return ids.numpy(), pages.numpy(), ctx.numpy()


def check_select_blocks(rng) -> None:
    """Forced blocks by construction, scores that could outrank sentinels (1e30, +inf, NaN,
    FLT_MAX), ties, -0/+0, position INT32_MAX, padding rows: equal to the oracle."""
    heads, rows, num_blocks = 2, 12, 9
    scores = rng.integers(-2, 3, (heads, rows, num_blocks)).astype(np.float32)
    poison = np.array([1e30, np.inf, np.nan, -np.inf, 3.4e38, -0.0], np.float32)
    mask = rng.random(scores.shape) < 0.4
    scores[mask] = rng.choice(poison, mask.sum())
    table = rng.integers(0, 1000, (3, num_blocks + 1)).astype(np.int32)
    positions = rng.integers(-1, num_blocks * 128 + 300, rows).astype(np.int32)
    positions[:3] = [2**31 - 1, -1, 130]
    requests = rng.integers(0, 3, rows).astype(np.int32)
    requests[3] = 5  # outside the table: a padding row
    for topk, init_blocks, local_blocks in [(2, 1, 1), (3, 2, 2), (16, 0, 1), (1, 3, 0)]:
        got = interpreted_select(scores, table, positions, requests, topk, init_blocks,
                                 local_blocks)
        spec_pos = np.where((requests >= 0) & (requests < 3), positions, -1)
        want = oracle.select_blocks(scores, table, spec_pos, np.clip(requests, 0, 2),
                                    topk=topk, init_blocks=init_blocks,
                                    local_blocks=local_blocks)
        for g, w in zip(got, want, strict=True):
            np.testing.assert_array_equal(g, w)
    print("ok select_blocks")


def main() -> int:
    rng = np.random.default_rng(0)
    check_page_values(rng)
    check_one_row_index_scores(rng)
    check_select_blocks(rng)
    return 0


if __name__ == "__main__":
    sys.exit(main())
