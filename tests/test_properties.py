"""Property tests (hypothesis): pool write/read round trips and top-k invariants.

Shapes are fixed (only contents and static options vary) so that each property compiles a
handful of executables; ``max_examples`` stays modest to keep the suite fast.

Mutation check: each mutation below was applied to a copy of the package, one edit at a
time, and the tests named after it failed (count of failing parametrizations in brackets;
the listed tests are those that failed, not just the ones meant to catch it).

  * write_cache: scale bytes at +1, negative slots not skipped, slots >= P*128 clamped onto
    the last page -> test_write_read_round_trip (each).
  * select_blocks: NaN -> +1e30, local key 1e31, ties to the higher index, tail block first,
    tail context = n_selected*128, valid not clipped, padding rows selecting block 0
    -> test_topk_invariants (each). (These mutants predate the forced blocks by construction,
    SPEC §6; tests/test_select_blocks.py lists the ones checked since.)
"""

from __future__ import annotations

import numpy as np
import oracle
from conftest import call
from hypothesis import given, settings
from hypothesis import strategies as st

P = 4
T = 8
SETTINGS = settings(max_examples=25, deadline=None, derandomize=True)


@st.composite
def write_cases(draw):
    """Distinct in-range slots mixed with out-of-range ones (duplicates are unspecified)."""
    valid = draw(st.lists(st.integers(0, P * 128 - 1), min_size=0, max_size=T, unique=True))
    bad = st.one_of(st.integers(-(2**31), -1), st.integers(P * 128, 2**31 - 1))
    slots = valid + draw(st.lists(bad, min_size=T - len(valid), max_size=T - len(valid)))
    order = draw(st.permutations(list(range(T))))
    seed = draw(st.integers(0, 2**32 - 1))
    round_mode = draw(st.sampled_from(["up", "even", "down"]))
    heads = draw(st.sampled_from([None, 2]))
    return np.array(slots, np.int32)[order], seed, round_mode, heads


@SETTINGS
@given(case=write_cases())
def test_write_read_round_trip(case):
    slots, seed, round_mode, heads = case
    rng = np.random.default_rng(seed)
    shape = (P, 8704) if heads is None else (P, heads, 8704)
    pool = rng.integers(0, 256, shape, dtype=np.uint8)
    x_shape = (T, 128) if heads is None else (T, heads, 128)
    x = rng.standard_normal(x_shape) * np.exp2(rng.integers(-40, 40, (*x_shape[:-1], 1)))
    x = x.astype(np.float32)
    for impl in ("reference", "public"):
        out = call(impl, "write_cache", pool, x, slots, round_mode=round_mode)
        np.testing.assert_array_equal(out, oracle.write_cache(pool, x, slots, round_mode))
        back = call(impl, "dequantize_pool", out)
        packed, scales = oracle.quantize_mxfp4(x, round_mode)
        direct = oracle.dequant_mxfp4_as(packed, scales, np.float32)
        ok = (slots >= 0) & (slots < P * 128)
        s = slots[ok].astype(np.int64)
        if heads is None:
            got = back[s // 128, s % 128]
        else:
            got = back[s // 128, :, s % 128]
        assert oracle.bits_equal(got, direct[ok]).all()
        # every byte of a slot that was not written is unchanged
        written = np.zeros((P, 128), bool)
        written[s // 128, s % 128] = True
        data_keep = np.repeat(~written, 64, axis=1)
        scale_keep = np.repeat(~written, 4, axis=1)
        keep = np.concatenate([data_keep, scale_keep], axis=1)
        if heads is not None:
            keep = np.repeat(keep[:, None, :], heads, axis=1)
        np.testing.assert_array_equal(out[keep], pool[keep])


H, RT, NB, B = 2, 8, 6, 2


@st.composite
def topk_cases(draw):
    seed = draw(st.integers(0, 2**32 - 1))
    topk = draw(st.sampled_from([1, 3, 16]))
    init_blocks = draw(st.sampled_from([0, 1, 2]))
    local_blocks = draw(st.sampled_from([1, 2]))
    positions = draw(st.lists(st.integers(-1, NB * 128 + 200), min_size=RT, max_size=RT))
    tie_heavy = draw(st.booleans())
    return seed, topk, init_blocks, local_blocks, np.array(positions, np.int32), tie_heavy


@SETTINGS
@given(case=topk_cases())
def test_topk_invariants(case):
    seed, topk, init_blocks, local_blocks, positions, tie_heavy = case
    rng = np.random.default_rng(seed)
    if tie_heavy:
        scores = rng.integers(-1, 2, (H, RT, NB)).astype(np.float32)
    else:
        scores = rng.standard_normal((H, RT, NB)).astype(np.float32)
    scores[rng.random(scores.shape) < 0.1] = np.nan
    scores[rng.random(scores.shape) < 0.1] = -np.inf
    scores[rng.random(scores.shape) < 0.05] = np.inf  # cannot outrank the forced blocks
    scores[rng.random(scores.shape) < 0.05] = 1e30
    table = rng.integers(0, 100, (B, NB + 1)).astype(np.int32)
    requests = rng.integers(0, B, RT).astype(np.int32)
    kw = dict(topk=topk, init_blocks=init_blocks, local_blocks=local_blocks)
    want = oracle.select_blocks(scores, table, positions, requests, **kw)
    for impl in ("reference", "public"):
        ids, page_table, ctx = call(impl, "select_blocks", scores, table, positions, requests,
                                    **kw)
        np.testing.assert_array_equal(ids, want.block_ids)
        np.testing.assert_array_equal(page_table, want.page_table)
        np.testing.assert_array_equal(ctx, want.context_lens)
        for t, p in enumerate(positions):
            valid = min(p // 128 + 1, NB) if p >= 0 else 0
            self_blk = p // 128
            for h in range(H):
                sel = ids[h, t]
                chosen = sel[sel >= 0]
                n = min(topk, valid)
                assert len(chosen) == n and (sel[n:] == -1).all()
                assert len(set(chosen.tolist())) == n
                assert ((chosen >= 0) & (chosen < valid)).all()
                # forced blocks (init, then local) come first, whatever the scores
                init = min(init_blocks, valid)
                forced = list(range(init)) + list(range(max(valid - local_blocks, init), valid))
                assert chosen.tolist()[: len(forced)] == forced[:n]
                if valid > 0 and p < NB * 128 and local_blocks >= 1 and topk >= len(forced):
                    assert self_blk in chosen
                # the other selections outrank every candidate left out
                rest = np.setdiff1d(np.arange(valid), chosen)
                picked = chosen[len(forced):]
                if len(rest) and len(picked):
                    worst = min(oracle.score_order_key(scores[h, t, j]) for j in picked)
                    assert all(oracle.score_order_key(scores[h, t, j]) <= worst for j in rest)
                # page table / context consistent with the ids
                tail = self_blk in chosen
                full = [j for j in chosen if j != self_blk]
                order = full + ([self_blk] if tail else [])
                assert page_table[t, h, :n].tolist() == [table[requests[t], j] for j in order]
                assert (page_table[t, h, n:] == 0).all()
                expect_ctx = (len(full) * 128 + p + 1 - self_blk * 128) if tail else min(
                    n * 128, p + 1) if p >= 0 else 0
                assert ctx[t, h] == expect_ctx
