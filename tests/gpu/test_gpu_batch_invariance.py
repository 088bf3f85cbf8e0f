"""Same bits whatever the batch (SPEC §15.15) on the GPU's kernels: each operation on a batch
of rows and on subsets of it (first row, first 8, first 32, shuffled), shared rows bit-equal
(the checks: ``tests/batch_invariance.py``). The split-K plan of attention follows the page
table only (``plans.attention_splits``) and its warp count is fixed, so a row's partitions and
reductions are the same in any batch."""

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


def test_write_cache_rows_do_not_depend_on_the_batch(rng):
    check.write_cache(rng, num_rows=512)
