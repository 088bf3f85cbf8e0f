"""index_scores (SPEC §4, §4.1, §5, §5.1, §2.3) against the float64 oracle.

Exactness: with an e4m3 query (stored, or a bf16 query rounded to e4m3) and one scale byte per
token (bytes 100..150), every product is exact and every partial sum of a token's 128 products
is a multiple of 2**-10 below 2**14, so the fp32 scores must equal the oracle bit for bit.
Elsewhere (per-32-block bytes in [119, 133], bf16 queries kept as bf16) an fp32 accumulation
in another order legitimately differs from the correctly rounded sum, by up to ~30 ulp of a
cancelled score (measured), so the bound is a fraction of the score's magnitude (max over
live tokens of sum |q_d k_d|, times the folded scale): ``oracle.index_score_tolerance``,
2**-16 of it, what any order of fp32 sums keeps (docs/spec.md §10.1; measured worst cases
are a few ulp of the magnitude: bench/history/2026-12-03.md, fourteenth session, "How far
inexact index scores fall from the oracle").

Mutation check: each mutation below was applied to a copy of the package, one edit at a
time, and the tests named after it failed (count of failing parametrizations in brackets;
the listed tests are those that failed, not just the ones meant to catch it).

  * token scale exponent + 1 (every key doubled) -> test_scores_exact_per_token_scales [16],
    test_scores_ragged_prefill [18], test_scores_decode [18], test_sm_scale [4],
    test_scores_many_requests [2], test_out_of_range_page_ids [2],
    test_positions_beyond_table [2], test_e4m3_saturation [2].
  * each 32-block scaled by its neighbour's byte -> test_scores_ragged_prefill [18],
    test_scores_decode [18] (per-token-scale tests cannot see it, by design).
  * live mask ``<`` instead of ``<=`` -> test_scores_ragged_prefill [18], test_scores_decode
    [18], test_scores_exact_per_token_scales [16], test_sm_scale [4], test_e4m3_saturation [2].
  * folded scale computed as fp32(sm) * fp32(log2 e) -> test_sm_scale[0.08838845689631614] [2].
  * exact log2(e) instead of the truncated literal 1.4426950409
    -> test_sm_scale[0.08838845689631614] [2].
  * q_round ignored (bf16 query never rounded to e4m3) -> 32 failures incl.
    test_scores_exact_per_token_scales[bf16-e4m3] [8], test_e4m3_saturation [2].
  * e4m3 conversion without the +-448 clamp (NaN) -> test_e4m3_saturation [2].
  * out-of-range page ids clamped into the pool -> test_out_of_range_page_ids [2].
  * padding rows (position -1) scored as position 0 -> test_scores_decode [18] and 44 more.
  * token dots rounded to 14 significant bits (an fp8 tensor core's accumulator; with the
    tolerance of docs/spec.md §10.1, 2026-12-02) -> 15 tolerance checks, at 1.01-1.56 times
    the tolerance, incl. test_deep_scale_groups[reference-*] (and the exact tests).
"""

from __future__ import annotations

import re

import numpy as np
import oracle
import pytest
from conftest import (
    SM_SCALE,
    call,
    decode_index_case,
    deep_scale_index_case,
    prefill_index_case,
)

import jax_mxfp4 as jm

pytestmark = pytest.mark.emulated  # impl also takes emulated-gfx950 and -gfx942 (conftest)

QCONFIGS = {  # id -> (q dtype, q_round)
    "bf16-e4m3": ("bf16", "e4m3"),
    "bf16-none": ("bf16", "none"),
    "e4m3": ("e4m3", "e4m3"),
}


def run(impl, case, q_round, sm_scale=SM_SCALE, magnitudes=False):
    kw = dict(num_blocks=case.num_blocks, sm_scale=sm_scale, q_round=q_round)
    got = call(impl, "index_scores", *case.args(), **kw)
    want = oracle.index_scores(*case.args(), **kw)
    if magnitudes:
        return got, want, oracle.index_score_magnitudes(*case.args(), **kw)
    return got, want


def assert_scores(got, want, *, exact: bool, positions=None, magnitudes=None):
    assert got.dtype == np.float32 and got.shape == want.shape, (got.dtype, got.shape)
    assert not np.isnan(got).any(), "NaN score"
    inf_got, inf_want = np.isneginf(got), np.isneginf(want)
    bad_inf = np.argwhere(inf_got != inf_want)
    assert bad_inf.size == 0, f"-inf pattern differs at [h, t, j] = {bad_inf[:5].tolist()}"
    if exact:
        same = got.view(np.uint32) == want.view(np.uint32)
        assert same.all(), (
            f"{(~same).sum()} of {same.size} scores differ, e.g. at {np.argwhere(~same)[0]}: "
            f"got {got[~same][:3]} want {want[~same][:3]}"
        )
    else:
        fin = ~inf_want
        err = oracle.index_score_errors(got[fin], want[fin], magnitudes[fin])
        assert (err <= 1).all(), f"max error {err.max():.2f} of the tolerance"
    if positions is not None:  # SPEC §4.1: -inf for every block past the row's reach
        blocks = np.arange(got.shape[2])
        for t, p in enumerate(positions):
            reach = blocks > p // 128 if p >= 0 else np.ones_like(blocks, bool)
            assert np.isneginf(got[:, t, reach]).all(), f"row {t} (position {p})"


# Ragged prefill: prefix 100 + 5 rows, 0 + 3 rows, 250 + 4 rows, and a trailing empty request
# (prefix 300); 16 rows, the last 4 padding. Blocks 0..3 scored, table 6 wide.
PREFILL = {"q_lens": [5, 3, 4, 0], "prefix_lens": [100, 0, 250, 300]}


@pytest.mark.parametrize("heads", [1, 2, 4])
@pytest.mark.parametrize("qconf", list(QCONFIGS))
def test_scores_ragged_prefill(impl, heads, qconf, rng):
    q_dtype, q_round = QCONFIGS[qconf]
    case = prefill_index_case(rng, **PREFILL, num_heads=heads, q_dtype=q_dtype,
                              scale_lo=119, scale_hi=133)
    got, want, mag = run(impl, case, q_round, magnitudes=True)
    assert_scores(got, want, exact=False, positions=case.positions, magnitudes=mag)


@pytest.mark.parametrize("heads", [1, 2, 4])
@pytest.mark.parametrize("qconf", list(QCONFIGS))
def test_scores_decode(impl, heads, qconf, rng):
    # S = 4 tokens per request; seq 1 gives three padding rows (position -1).
    q_dtype, q_round = QCONFIGS[qconf]
    case = decode_index_case(rng, [130, 5, 1, 400], 4, num_heads=heads, q_dtype=q_dtype,
                             scale_lo=119, scale_hi=133)
    assert (case.positions == -1).sum() == 3
    got, want, mag = run(impl, case, q_round, magnitudes=True)
    assert_scores(got, want, exact=False, positions=case.positions, magnitudes=mag)


@pytest.mark.parametrize("qconf", ["bf16-e4m3", "e4m3"])
@pytest.mark.parametrize("layout", ["prefill", "decode"])
@pytest.mark.parametrize("heads", [1, 2])
def test_scores_exact_per_token_scales(impl, qconf, layout, heads, rng):
    """Scale bytes 100..150 (beyond the e4m3 window), one per token: bit-exact."""
    q_dtype, q_round = QCONFIGS[qconf]
    kw = dict(num_heads=heads, q_dtype=q_dtype, scale_lo=100, scale_hi=150, per_token=True)
    if layout == "prefill":
        case = prefill_index_case(rng, **PREFILL, **kw)
    else:
        case = decode_index_case(rng, [130, 5, 1, 400], 4, **kw)
    got, want = run(impl, case, q_round)
    assert_scores(got, want, exact=True, positions=case.positions)


def test_scores_many_requests(impl, rng):
    """Sixteen single-token decode requests (0..600 tokens each), some trailing empty."""
    seq = rng.integers(1, 600, 16)
    seq[[3, 14, 15]] = [0, 0, 0]
    seq[5] = 512
    seq[6] = 513
    case = decode_index_case(rng, seq, 1, num_heads=2, num_pages=96, q_dtype="bf16",
                             scale_lo=100, scale_hi=150, per_token=True)
    got, want = run(impl, case, "e4m3")
    assert_scores(got, want, exact=True, positions=case.positions)


def test_out_of_range_page_ids(impl, rng):
    """SPEC §2.3: a page id outside [0, P) reads as a page with no live tokens."""
    case = prefill_index_case(rng, **PREFILL, num_heads=2, scale_lo=100, scale_hi=150,
                              per_token=True)
    num_pages = case.pool.shape[0]
    case.block_table[0, 0] = -(2**31)
    case.block_table[1, 0] = num_pages
    case.block_table[2, 1] = num_pages + 7  # request 2 (positions 250..253) keeps block 0
    case.block_table[3, 0] = -1  # the trailing empty request: no rows
    got, want = run(impl, case, "e4m3")
    assert_scores(got, want, exact=True, positions=case.positions)
    req = case.requests
    live = case.positions >= 0
    assert np.isneginf(got[:, live & (req < 2), :]).all()
    assert np.isneginf(got[:, live & (req == 2), 1]).all()
    assert np.isfinite(got[:, live & (req == 2), 0]).all()


def test_positions_beyond_table(impl, rng):
    """A request longer than num_blocks * 128 tokens: the table is exactly num_blocks wide and
    every scored block is fully live for its rows (SPEC §2.3: clipped)."""
    case = prefill_index_case(rng, [3, 2], [690, 10], num_heads=2, table_width=4,
                              scale_lo=100, scale_hi=150, per_token=True)
    assert case.block_table.shape[1] == case.num_blocks == 4
    got, want = run(impl, case, "e4m3")
    assert_scores(got, want, exact=True, positions=case.positions)
    assert np.isfinite(got[:, :3, :]).all()


# 0.08838845689631614 is an sm_scale for which fp32(sm * 1.4426950409) differs from
# fp32(sm * log2(e)), from fp32(sm) * fp32(1.4426950409) and from fp32(fp32(sm) * 1.4426950409):
# it catches a wrong LOG2E literal or a folded scale computed in the wrong precision.
DISCRIMINATING_SM_SCALE = 0.08838845689631614


def test_discriminating_sm_scale_is_discriminating():
    f = np.float32
    sm, lit, log2e = DISCRIMINATING_SM_SCALE, 1.4426950409, float(np.log2(np.e))
    folded = f(sm * lit)
    assert folded != f(sm * log2e)
    assert folded != f(sm) * f(lit) and folded != f(f(sm) * lit)
    assert oracle.score_scale(sm) == folded


@pytest.mark.parametrize("sm_scale", [1.0, 0.0625, DISCRIMINATING_SM_SCALE])
def test_sm_scale(impl, sm_scale, rng):
    case = decode_index_case(rng, [130, 5, 1, 400], 4, num_heads=2, scale_lo=100,
                             scale_hi=150, per_token=True)
    got, want = run(impl, case, "e4m3", sm_scale=sm_scale)
    assert_scores(got, want, exact=True)


@pytest.mark.parametrize("layout", ["prefill", "decode"])
def test_deep_scale_groups(impl, layout, rng):
    """A token's groups up to 110 binades apart (and all-zero groups, byte 0); rows whose
    query lives in the deepest group alone (conftest.deep_scale_index_case)."""
    case = deep_scale_index_case(rng, layout)
    got, want, mags = run(impl, case, "e4m3", magnitudes=True)
    assert np.isfinite(got).sum() > 50
    assert_scores(got, want, exact=False, magnitudes=mags, positions=case.positions)


def test_e4m3_saturation(impl, rng):
    """SPEC §1.5: a bf16 query rounds to e4m3 with saturation: +-500, +-1e30 -> +-448."""
    case = decode_index_case(rng, [130, 5, 1, 400], 4, num_heads=2, scale_lo=127,
                             scale_hi=127, per_token=True)
    q = np.zeros(case.q.shape)
    q[:, 0, 0] = 500.0
    q[:, 0, 1] = -1e30
    q[:, 1, 2] = 1e30
    q[:, 1, 3] = -500.0
    q[::2, :, 4] = 0.5
    case.q = oracle.to_bf16(q)
    # K: code 2 (1.0) everywhere, scale byte 127: each head's dot is 448 - 448 (+ 0.5 on even
    # rows) for every token.
    case.pool[:, :8192] = 0x22
    case.pool[:, 8192:] = 127
    got, want = run(impl, case, "e4m3")
    assert_scores(got, want, exact=True)
    live = np.flatnonzero(case.positions >= 0)
    dot = np.where(live % 2 == 0, np.float32(0.5), np.float32(0.0))
    expect = dot * oracle.score_scale(SM_SCALE)
    for h in range(2):
        np.testing.assert_array_equal(got[h, live, 0], expect)


# ---------------------------------------------------------------------------------------------
# Rejections (public API)
# ---------------------------------------------------------------------------------------------


def _rejects(exc, name, *args, **kwargs):
    base = dict(num_blocks=4, sm_scale=SM_SCALE)
    base.update(kwargs)
    with pytest.raises(exc) as info:
        jm.index_scores(*args, **base)
    assert re.search(rf"\b{name}\b", str(info.value)), str(info.value)


def test_rejections(rng):
    case = decode_index_case(rng, [130, 5, 1, 400], 4, num_heads=2)
    q, pool, table, pos, req = case.args()
    _rejects(TypeError, "q", q.astype(np.float16), pool, table, pos, req)
    _rejects(TypeError, "q", q.astype(np.float32), pool, table, pos, req)
    _rejects(ValueError, "q", q[..., :64], pool, table, pos, req)
    _rejects(ValueError, "index_pool", q, pool[:, :8700], table, pos, req)
    _rejects(ValueError, "index_pool", q, pool[:, None, :], table, pos, req)
    _rejects(TypeError, "index_pool", q, pool.view(np.int8), table, pos, req)
    _rejects(ValueError, "block_table", q, pool, table[:, :3], pos, req)
    _rejects(TypeError, "block_table", q, pool, table.astype(np.float32), pos, req)
    _rejects(ValueError, "positions", q, pool, table, pos[:-1], req)
    _rejects(TypeError, "requests", q, pool, table, pos, req.astype(np.float32))
    _rejects(ValueError, "q_round", q, pool, table, pos, req, q_round="fp8")
    _rejects(ValueError, "sm_scale", q, pool, table, pos, req, sm_scale=-1.0)
    _rejects(ValueError, "sm_scale", q, pool, table, pos, req, sm_scale=float("inf"))
    _rejects(ValueError, "num_blocks", q, pool, table, pos, req, num_blocks=0)
