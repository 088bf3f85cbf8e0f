"""GPU kernel functions run by Triton's interpreter on the CPU, against the float64 oracle.

Run as a script by ``test_triton_interpreter.py`` (``TRITON_INTERPRET=1`` must be set before
the kernels are decorated, so it needs a process of its own). Only kernels without ``tl.dot``
are checked here, and e4m3 rounding only of values that are exact in e4m3: the interpreter's
fp16 dots are not exact and its fp32 -> e4m3 conversion rounds 1.96 down to 1.0 (triton
3.6.0). Prints one ``ok <name>`` line per check; raises on a mismatch.

Arrays go to the kernels as :class:`HostArray`, a numpy array with the few tensor methods the
interpreter calls (``data_ptr``, storage and view bookkeeping), so no torch is needed.
"""

from __future__ import annotations

import os
import sys

os.environ["TRITON_INTERPRET"] = "1"

import numpy as np
import oracle
import triton
import triton.language as tl
from conftest import SM_SCALE, decode_index_case
from host_array import HostArray

from jax_mxfp4.gpu.kernels import index_scores, mxfp4, sparse_attention
from jax_mxfp4.scaling import folded_score_scale


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
    out = HostArray(np.zeros(128 * 128, np.float32))
    _page_values_kernel[(1,)](HostArray(page), out, 100)
    got = out.array.reshape(128, 128)
    want = oracle.dequant_pool(page[None])[0].astype(np.float32)
    want[100:] = 0.0
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    print("ok page_values")


def one_row_scores(case, q_round: str) -> np.ndarray:
    """index_scores_kernel with the plan's one-row (CUDA-core) tiling; ``f32 [1, T, NB]``."""
    q, pool, table, positions, requests = (np.asarray(a) for a in case.args()[:5])
    rows, requests_n = len(positions), table.shape[0]
    plan = index_scores.plan(rows, 1, requests_n, case.num_blocks, num_sms=132)
    assert plan.one_row, plan
    out = HostArray(np.full((1, rows, case.num_blocks), 7.0, np.float32))
    q_fp8 = str(q.dtype) == "float8_e4m3fn"
    index_scores.index_scores_kernel[plan.grid](
        *map(HostArray, (q, pool, table, positions, requests)), out, rows,
        requests_n, table.shape[1], pool.shape[0], case.num_blocks,
        float(folded_score_scale(SM_SCALE)), H=1, ROWS=plan.rows, M=plan.m,
        BLOCKS=plan.blocks, Q_IS_FP8=q_fp8, ROUND_Q=False, USE_FP8=False,
        DOT_DTYPE=tl.bfloat16 if q_round == "none" else tl.float16, ONE_ROW=True, FOLD=False,
        num_warps=plan.num_warps)
    return out.array


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


@triton.jit
def _mxfp8_store_kernel(o_ptr, values_ptr, scales_ptr, t, qh0):
    g = tl.arange(0, 4)
    o = tl.load(o_ptr + g[:, None] * 128 + tl.arange(0, 128)[None, :])
    sparse_attention._store_output(o, values_ptr, scales_ptr, t, qh0, g, g < 4, 4, True)


def check_mxfp8_epilogue(rng) -> None:
    """The attention kernel's MXFP8 store of one token's 4 q heads (16 blocks): blocks with an
    Inf or NaN get scale byte 255 and NaN values (SPEC §15.13); finite blocks get the SPEC §1.6
    scale. Finite values are e4m3-exact after scaling (small integers times a power of two),
    so the interpreter's inexact e4m3 rounding cannot hide or fake a difference."""
    o = rng.integers(-15, 16, (4, 128)).astype(np.float32)
    o *= np.exp2(rng.integers(-20, 20, (4, 4, 1))).repeat(32, 1).reshape(4, 128)
    o[0, 3], o[1, 40], o[2, 64:96], o[3, 100] = np.inf, np.nan, -np.inf, np.nan
    o[3, 101] = np.inf
    values = HostArray(np.zeros(4 * 128, oracle.E4M3))
    scales = HostArray(np.zeros(4 * 4, np.uint8))
    _mxfp8_store_kernel[(1,)](HostArray(o), values, scales, 0, 0)
    want_values, want_scales = oracle.quantize_mxfp8(o.reshape(1, -1))
    got_scales = scales.array.reshape(1, -1)
    np.testing.assert_array_equal(got_scales, want_scales)
    assert (got_scales.reshape(4, 4) == 255).sum() == 4, got_scales
    np.testing.assert_array_equal(values.array.view(np.uint8),
                                  want_values.view(np.uint8).reshape(-1))
    print("ok mxfp8_epilogue")


def main() -> int:
    rng = np.random.default_rng(0)
    check_page_values(rng)
    check_one_row_index_scores(rng)
    check_mxfp8_epilogue(rng)
    return 0


if __name__ == "__main__":
    sys.exit(main())
