"""select_blocks (SPEC §6, §6.1, §2.5) against the float64 oracle, exactly.

Mutation check: each mutation below was applied to a copy of the package, one edit at a
time, and the tests named after it failed (count of failing parametrizations in brackets;
the listed tests are those that failed, not just the ones meant to catch it).

  * NaN scores keyed +1e30 instead of -1e30 -> test_matches_oracle [36], test_hand_computed
    [2], test_no_local_blocks [2], test_properties::test_topk_invariants.
  * local key 1e31 (local beats init) -> test_matches_oracle[init1/init2] [32],
    test_hand_computed [2], test_topk_invariants.
  * init applied after local (init wins on blocks that are both): NOT caught, and cannot be:
    init blocks are the lowest indices and local blocks the highest, so with ties broken by
    the lower index the selection and its order are identical (an equivalent mutant).
  * ties broken by the higher block index -> test_matches_oracle [42],
    test_ties_lower_index_first [2], test_no_local_blocks [2], test_topk_larger_than_valid
    [2], test_topk_invariants.
  * tail block first instead of last in page_table -> test_matches_oracle [36],
    test_hand_computed [2], test_ties_lower_index_first [2], test_defaults_m3 [2],
    test_no_local_blocks [2], test_topk_larger_than_valid [2], test_topk_invariants.
  * context of a tail row = n_selected*128 -> test_matches_oracle [48], test_hand_computed [2],
    test_defaults_m3 [2], test_no_local_blocks [2], test_topk_larger_than_valid [2],
    test_topk_invariants.
  * valid not clipped to num_blocks -> test_matches_oracle [36], test_topk_larger_than_valid
    [2], test_topk_invariants.
  * padding rows (position -1) selecting block 0 -> test_matches_oracle [48],
    test_hand_computed [2], test_no_local_blocks [2], test_topk_larger_than_valid [2],
    test_topk_invariants.
"""

from __future__ import annotations

import re

import numpy as np
import oracle
import pytest
from conftest import call

import jax_mxfp4 as jm

pytestmark = pytest.mark.emulated  # impl also takes emulated-gfx950 and -gfx942 (conftest)

H, T, NB, B, W = 2, 16, 6, 3, 7
POSITIONS = np.array([-1, 0, 1, 127, 128, 129, 255, 256, 300, 640, 767, 768, 2000, 5, 400, -1],
                     np.int32)


def _scores(rng, shape):
    """Scores with many ties (small integers), NaNs, -inf and plain floats."""
    s = rng.integers(-2, 3, shape).astype(np.float32)
    u = rng.random(shape)
    s[u < 0.3] = rng.standard_normal((u < 0.3).sum()).astype(np.float32) * 10
    s[(u > 0.3) & (u < 0.4)] = np.nan
    s[(u > 0.4) & (u < 0.45)] = -np.inf
    return s


def _case(rng):
    scores = _scores(rng, (H, T, NB))
    table = rng.integers(0, 50, (B, W)).astype(np.int32)
    requests = rng.integers(0, B, T).astype(np.int32)
    return scores, table, POSITIONS.copy(), requests


def _check(impl, scores, table, positions, requests, **kw):
    """``impl``'s select_blocks equal to the oracle; returns ``impl``'s result."""
    got = call(impl, "select_blocks", scores, table, positions, requests, **kw)
    want = oracle.select_blocks(scores, table, positions, requests, **kw)
    ids, page_table, ctx = got
    assert ids.dtype == page_table.dtype == ctx.dtype == np.int32
    np.testing.assert_array_equal(ids, want.block_ids, err_msg="block_ids")
    np.testing.assert_array_equal(page_table, want.page_table, err_msg="page_table")
    np.testing.assert_array_equal(ctx, want.context_lens, err_msg="context_lens")
    return got


@pytest.mark.parametrize("topk", [1, 2, 3, 16])
@pytest.mark.parametrize("init_blocks", [0, 1, 2], ids=lambda v: f"init{v}")
@pytest.mark.parametrize("local_blocks", [1, 2], ids=lambda v: f"local{v}")
def test_matches_oracle(impl, topk, init_blocks, local_blocks, rng):
    _check(impl, *_case(rng), topk=topk, init_blocks=init_blocks, local_blocks=local_blocks)


def test_no_local_blocks(impl, rng):
    _check(impl, *_case(rng), topk=3, init_blocks=0, local_blocks=0)


def test_defaults_m3(impl, rng):
    """The M3 configuration: topk 16 over 24 blocks, init 0, local 1; plain float scores."""
    scores = rng.standard_normal((H, T, 24)).astype(np.float32)
    table = rng.integers(0, 1000, (B, 24)).astype(np.int32)
    positions = rng.integers(-1, 24 * 128 + 300, T).astype(np.int32)
    requests = rng.integers(0, B, T).astype(np.int32)
    got = call(impl, "select_blocks", scores, table, positions, requests)
    want = oracle.select_blocks(scores, table, positions, requests)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)
    assert got[0].shape == (H, T, 16)


def test_hand_computed(impl):
    """One row: scores [3, 1, 3, NaN, 5, 9], position 4*128 + 10 (valid = 5 blocks),
    topk 3, init 1, local 1: forced blocks 0 and 4, then the best of 1, 2, 3 (scores 1, 3,
    NaN) -> blocks [0, 4, 2]; the page table puts the full blocks 0, 2 first and the tail
    block 4 last; context 2*128 + 11."""
    scores = np.full((H, T, NB), -np.inf, np.float32)
    scores[:, 0] = [3, 1, 3, np.nan, 5, 9]
    positions = np.full(T, -1, np.int32)
    positions[0] = 4 * 128 + 10
    table = np.arange(B * W, dtype=np.int32).reshape(B, W) * 10 + 100
    requests = np.full(T, 2, np.int32)
    ids, page_table, ctx = _check(impl, scores, table, positions, requests, topk=3,
                                  init_blocks=1, local_blocks=1)
    assert ids[:, 0].tolist() == [[0, 4, 2]] * H
    assert page_table[0].tolist() == [[table[2, 0], table[2, 2], table[2, 4]]] * H
    assert ctx[0].tolist() == [2 * 128 + 11] * H
    assert (ids[:, 1:] == -1).all() and (page_table[1:] == 0).all() and (ctx[1:] == 0).all()


def test_ties_lower_index_first(impl):
    """Equal keys: the lower block index is selected (and listed) first."""
    scores = np.zeros((H, T, NB), np.float32)
    scores[1] = 7.0
    positions = np.full(T, 5 * 128 + 127, np.int32)  # valid = 6, self block 5
    table = np.tile(np.arange(W, dtype=np.int32), (B, 1))
    requests = np.zeros(T, np.int32)
    ids, page_table, ctx = _check(impl, scores, table, positions, requests, topk=4,
                                  init_blocks=0, local_blocks=1)
    assert ids[0, 0].tolist() == [5, 0, 1, 2]
    assert page_table[0, 0].tolist() == [0, 1, 2, 5]
    assert ctx[0, 0] == 4 * 128


def test_topk_larger_than_valid(impl):
    scores = np.ones((H, T, NB), np.float32)
    positions = np.arange(T, dtype=np.int32) * 60 - 1  # -1, 59, 119, ... 899
    table = np.tile(np.arange(W, dtype=np.int32) + 1, (B, 1))
    requests = np.ones(T, np.int32)
    ids, page_table, ctx = _check(impl, scores, table, positions, requests, topk=16,
                                  init_blocks=0, local_blocks=1)
    for t, p in enumerate(positions):
        valid = min(p // 128 + 1, NB) if p >= 0 else 0
        assert sorted(ids[0, t, :valid].tolist()) == list(range(valid))
        assert (ids[:, t, valid:] == -1).all()
        assert ctx[t, 0] == (min(p + 1, NB * 128) if p >= 0 else 0)
        assert (page_table[t, :, valid:] == 0).all()


# ---------------------------------------------------------------------------------------------
# Rejections (public API)
# ---------------------------------------------------------------------------------------------


def _rejects(exc, name, *args, **kwargs):
    with pytest.raises(exc) as info:
        jm.select_blocks(*args, **kwargs)
    assert re.search(rf"\b{name}\b", str(info.value)), str(info.value)


def test_rejections(rng):
    scores, table, pos, req = _case(rng)
    _rejects(TypeError, "scores", scores.astype(np.float16), table, pos, req)
    _rejects(ValueError, "scores", scores[0], table, pos, req)
    _rejects(ValueError, "block_table", scores, table[:, : NB - 1], pos, req)
    _rejects(TypeError, "block_table", scores, table.astype(np.int64).astype(np.float32), pos,
             req)
    _rejects(ValueError, "positions", scores, table, pos[:-1], req)
    _rejects(TypeError, "requests", scores, table, pos, req.astype(np.float32))
    _rejects(ValueError, "topk", scores, table, pos, req, topk=0)
    _rejects(ValueError, "init_blocks", scores, table, pos, req, init_blocks=-1)
    _rejects(ValueError, "local_blocks", scores, table, pos, req, local_blocks=-1)


# ---------------------------------------------------------------------------------------------
# Forced blocks by construction, NaN order, edges (SPEC §6)
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("poison", [1e30, 1e29, np.inf, 3.4e38, np.nan],
                         ids=["1e30", "1e29", "inf", "flt_max", "nan"])
@pytest.mark.parametrize("params", [(2, 1, 1), (1, 0, 1), (4, 2, 2)], ids=str)
def test_forced_blocks_cannot_be_outranked(impl, poison, params):
    """Scores of 1e30, +inf, FLT_MAX or NaN in the other blocks never push out a row's init
    or local blocks, with topk exactly their number (the tightest case). (Before: init and
    local blocks were keyed 1e30 and 1e29, so a 1e30 or +inf score took the local block's
    place: 1e30, 1e29, inf and flt_max failed on both implementations.)"""
    topk, init_blocks, local_blocks = params
    scores = np.full((H, T, NB), poison, np.float32)
    positions = np.array([5 * 128 + 3, 3 * 128, 127, 1000, 128, 300, -1, 4 * 128 + 9] * 2,
                         np.int32)
    table = np.arange(B * W, dtype=np.int32).reshape(B, W)
    requests = np.arange(T, dtype=np.int32) % B
    ids, _, _ = _check(impl, scores, table, positions, requests, topk=topk,
                         init_blocks=init_blocks, local_blocks=local_blocks)
    for t, p in enumerate(positions):
        valid = min(p // 128 + 1, NB) if p >= 0 else 0
        init = min(init_blocks, valid)
        forced = list(range(init)) + list(range(max(valid - local_blocks, init), valid))
        for h in range(H):
            assert ids[h, t, : len(forced)].tolist() == forced[:topk], (t, h)
            if local_blocks and valid and p < NB * 128:
                assert p // 128 in ids[h, t].tolist()


def test_nan_ranks_below_every_finite_score_and_above_minus_inf(impl):
    """Among the blocks that are not forced: +inf, finite (down to -FLT_MAX), NaN, -inf."""
    scores = np.full((H, T, NB), -np.inf, np.float32)
    scores[:, 0] = [np.nan, -3.4e38, -np.inf, np.inf, np.nan, 0.0]
    positions = np.full(T, -1, np.int32)
    positions[0] = 5 * 128  # valid = 6 blocks, block 5 is the local one
    table = np.arange(B * W, dtype=np.int32).reshape(B, W)
    ids, _, _ = _check(impl, scores, table, positions, np.zeros(T, np.int32), topk=6,
                       init_blocks=0, local_blocks=1)
    assert ids[:, 0].tolist() == [[5, 3, 1, 0, 4, 2]] * H


def test_zero_blocks_select_nothing(impl):
    """NB = 0: no candidates; ids -1, pages 0, contexts 0 (the reference raised before)."""
    scores = np.zeros((H, T, 0), np.float32)
    table = np.zeros((B, 0), np.int32)
    got = _check(impl, scores, table, POSITIONS, np.zeros(T, np.int32), topk=3,
                 init_blocks=1, local_blocks=1)
    assert (got[0] == -1).all() and not got[1].any() and not got[2].any()


@pytest.mark.parametrize("count", [2**31 - 1, 2**31, 2**40, 2**63 + 5])
def test_huge_forced_counts_mean_every_block(impl, rng, count):
    """init_blocks / local_blocks of 2**31 and past: every candidate is forced (the reference
    raised OverflowError before)."""
    scores, table, positions, requests = _case(rng)
    for init_blocks, local_blocks in [(count, 1), (0, count)]:
        ids, _, _ = _check(impl, scores, table, positions, requests, topk=16,
                           init_blocks=init_blocks, local_blocks=local_blocks)
        for t, p in enumerate(positions):
            valid = min(p // 128 + 1, NB) if p >= 0 else 0
            assert ids[0, t, :valid].tolist() == list(range(valid))
