"""Same bits whatever the batch (SPEC §9.1) on the GPU's kernels: each operation on a batch
of rows and on subsets of it (first row, first 8, first 32, shuffled), shared rows bit-equal
(the checks: ``tests/batch_invariance.py``). The split-K plan of attention follows the page
table only (``plans.attention_splits`` at ``plans.TRITON_PAGES_PER_SPLIT``) and its warp
count is fixed, so a row's partitions and reductions are the same in any batch; the one-row
index tiles' warps and blocks per program follow the grid, and their sums run in the same
order whatever they are."""

from __future__ import annotations

import batch_invariance as check
import gpu_env
import pytest

pytestmark = gpu_env.required()


@pytest.mark.parametrize("output", ["bf16", "mxfp8"])
@pytest.mark.parametrize("q_dtype", ["bf16", "e4m3"])
def test_attention_rows_do_not_depend_on_the_batch(rng, output, q_dtype):
    check.attention(rng, output, num_rows=512, q_dtype=q_dtype)


@pytest.mark.parametrize("shape", ["decode", "prefill"])
@pytest.mark.parametrize("q_round", ["e4m3", "none"])
def test_index_and_selection_rows_do_not_depend_on_the_batch(rng, shape, q_round):
    check.index_scores(rng, shape, q_round)


@pytest.mark.parametrize("end", ["low", "high"])
@pytest.mark.parametrize("q_round", ["e4m3", "none"])
def test_one_row_index_rows_do_not_depend_on_the_batch(rng, q_round, end):
    """Single-row requests (the CUDA-core one-row tiles) over enough blocks that the whole
    batch of 48, and the shuffled one, lie on the other side of an end of
    ``ONE_ROW_PAIRS`` (two blocks per program inside the range, one outside) than the first
    32 requests: ``low``, the batch inside and 32 requests below; ``high``, the batch above
    and 32 (and 8) requests inside. The plans must give the same bits. (Mutation, run by hand
    on the H200 against the earlier single threshold: one-block programs' maxima scaled by
    ``1 + 2**-23`` failed both query roundings; not rerun for the two ends.)"""
    from jax_mxfp4._src.ops.index_scores import triton as index_scores

    units = gpu_env.units()
    low, high = (n * units for n in index_scores.ONE_ROW_PAIRS)
    edge = low if end == "low" else high
    width = -(-edge // 40)  # 48 requests reach the edge, 32 do not
    assert 32 * width < edge <= 48 * width
    blocks = [index_scores.one_row_blocks(n, width, units) for n in (1, 8, 32, 48)]
    assert blocks == ([1, 1, 1, 2] if end == "low" else [1, 2, 2, 1]), blocks
    check.index_scores(rng, "decode1", q_round, one_row_blocks=width)


def test_write_cache_rows_do_not_depend_on_the_batch(rng):
    check.write_cache(rng, num_rows=512)
