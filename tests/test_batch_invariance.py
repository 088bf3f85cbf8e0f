"""Same bits whatever the batch (SPEC §9.1), on the CPU's C++ handlers: each operation on a
batch of rows and on subsets of it (first row, first 8, first 32, shuffled), shared rows
bit-equal. The checks are ``tests/batch_invariance.py``; ``tests/gpu`` runs them on the GPU.

Mutation check (performed by hand): capping each row's context in the C++ attention handler
by the number of rows in the call (``AttendRow`` in ``ffi/cpu/sparse_attention.cc``) fails
test_attention_rows_do_not_depend_on_the_batch [4 of 4].
"""

from __future__ import annotations

import batch_invariance as check
import pytest


@pytest.mark.parametrize("output", ["bf16", "mxfp8"])
@pytest.mark.parametrize("q_dtype", ["bf16", "e4m3"])
def test_attention_rows_do_not_depend_on_the_batch(rng, output, q_dtype):
    check.attention(rng, output, q_dtype=q_dtype)


@pytest.mark.parametrize("shape", ["decode", "decode1", "prefill"])
@pytest.mark.parametrize("q_round", ["e4m3", "none"])
def test_index_and_selection_rows_do_not_depend_on_the_batch(rng, shape, q_round):
    check.index_scores(rng, shape, q_round)


def test_write_cache_rows_do_not_depend_on_the_batch(rng):
    check.write_cache(rng)
