"""Every operation's Triton kernel against the reference lowering on the same GPU (SPEC §10):
bit for bit for write_cache, select_blocks and the MXFP8 epilogue (against quantize_mxfp8 of
the kernel's own bf16 output), bit for bit for index_scores on exact data and elsewhere within
``oracle.index_score_tolerance`` of the float64 oracle (and twice it of the reference), and
the attention tolerance against the oracle for sparse_attention (large-V range included)."""

from __future__ import annotations

import gpu_env
import jax
import numpy as np
import oracle
import pytest
from conftest import (
    SM_SCALE,
    attention_case,
    decode_index_case,
    deep_scale_index_case,
    large_value_case,
    non_finite_v,
    prefill_index_case,
    random_pages,
    widen_index_q,
)

import jax_mxfp4 as jm
from jax_mxfp4._src.dispatch.backend import backend_scope
from jax_mxfp4._src.ops.index_scores.reference import scoring_query

pytestmark = gpu_env.required()
UNITS = gpu_env.units()  # SMs the lowering plans for


def both(fn, *args, **static):
    """``fn(*args, **static)`` jitted with our kernels and with the reference lowering."""
    out = []
    for backend in ("auto", "reference"):
        with backend_scope(backend):
            jitted = jax.jit(lambda *a: fn(*a, **static))
            out.append(jax.tree.map(np.asarray, jitted(*args)))
    return out


def bits(x):
    x = np.asarray(x)
    return x.view(f"u{x.dtype.itemsize}") if x.dtype.kind in "fV" else x


def assert_bits(a, b):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(bits(x), bits(y))


def test_every_operation_lowers_to_triton():
    """``jm.explain`` of a decode step on this GPU: every operation takes its Triton kernel."""
    s = jax.ShapeDtypeStruct
    u8, i32, bf16 = np.uint8, np.int32, jax.numpy.bfloat16

    def step(k_pool, index_pool, k, k_index, slots, q, q_index, table, positions, requests):
        k_pool = jm.write_cache(k_pool, k, slots)
        index_pool = jm.write_cache(index_pool, k_index, slots)
        scores = jm.index_scores(q_index, index_pool, table, positions, requests,
                                 num_blocks=4, sm_scale=SM_SCALE)
        sel = jm.select_blocks(scores, table, positions, requests, topk=2)
        return jm.sparse_attention(q, k_pool, k_pool, sel.page_table, sel.context_lens,
                                   sm_scale=SM_SCALE, output="mxfp8")

    args = (s((8, 1, 8704), u8), s((8, 8704), u8), s((2, 1, 128), bf16), s((2, 128), bf16),
            s((2,), i32), s((2, 16, 128), bf16), s((2, 1, 128), bf16), s((2, 4), i32),
            s((2,), i32), s((2,), i32))
    found = jm.explain(step, *args)
    assert len(found) == 5 and all(e.lowering.startswith("triton:") for e in found), found


@pytest.mark.parametrize("round_mode", ["up", "even", "down"])
@pytest.mark.parametrize("heads", [2, None], ids=["kv_pool", "index_pool"])
def test_write_cache(rng, round_mode, heads):
    lead = (64,) if heads is None else (64, heads)
    pool = random_pages(rng, lead)
    rows = 300
    x = rng.standard_normal((rows, *lead[1:], 128)) * np.exp(rng.normal(0, 8, (rows, 1, 1)
                                                                        if heads else (rows, 1)))
    x = oracle.to_bf16(x)
    x[0, ..., :32] = 0  # an all-zero block: byte 0
    slots = rng.permutation(64 * 128 + 40)[:rows].astype(np.int32) - 20  # some skipped
    kernel, ref = both(jm.write_cache, pool, x, slots, round_mode=round_mode)
    np.testing.assert_array_equal(kernel, ref)


@pytest.mark.parametrize("rows", [40, 5000, 20000])
def test_write_cache_duplicate_slots_keep_the_last_row(rng, rows):
    """Duplicated slots keep their last row: the slot table's winner (an atomic max of the
    row index per slot) is the only row written, however the programs interleave."""
    pool = random_pages(rng, (8, 1))
    x = oracle.to_bf16(rng.standard_normal((rows, 1, 128)))
    slots = rng.integers(-5, 8 * 128 + 5, rows).astype(np.int32)
    slots[: rows // 2] = slots[rows // 2:][: rows // 2]  # every slot of the first half recurs
    out = np.asarray(jax.jit(jm.write_cache)(pool, x, slots))
    np.testing.assert_array_equal(out, oracle.write_cache(pool, x, slots))


def test_reference_query_rounding_survives_excess_precision(rng):
    """XLA's GPU compiler folds ``f32 -> e4m3 -> f32`` conversion chains away (excess
    precision is allowed by default): the reference's e4m3 query rounding must still round,
    bit for bit as numpy does. (Mutation: without the optimization barrier in
    ``_bits.widen_rounded`` 486080 of these 524288 elements differ on the H200.)"""
    x = (rng.standard_normal((4096, 1, 128)) * np.exp(rng.normal(0, 3, (4096, 1, 1))))
    x = oracle.to_bf16(x)
    want = oracle.to_e4m3(np.asarray(x, np.float64)).astype(np.float32)
    with backend_scope("reference"):
        got = jax.jit(lambda q: scoring_query(q, "e4m3"))(jax.device_put(x, gpu_env.gpu()))
    np.testing.assert_array_equal(np.asarray(got).view(np.uint32), want.view(np.uint32))


def _index(case, q_round="e4m3", kernels="auto"):
    with jm.lowering_options(cuda_kernels=kernels):
        return both(jm.index_scores, *case.args(), num_blocks=case.num_blocks,
                    sm_scale=SM_SCALE, q_round=q_round)


# Index tilings: "decode" (S = 4, H = 2: 8 dot rows): the Gluon rows tile, and under
# cuda_kernels="triton" ("decode-triton") a 16-row Triton tile; "decode1" (S = 1, H = 1): one
# row per tile, scored on the CUDA cores; "prefill": folded keys on the sm_90 Gluon prefill
# tile (128 dot rows a tile, two warpgroups' MMAs; here 32 rows x 2 heads: 64 of them live).
@pytest.mark.parametrize("shape", ["decode", "decode-triton", "decode1", "prefill"])
def test_index_scores_exact_data(rng, shape):
    """e4m3 queries, one scale byte per token: every product and sum is exact -> bit equal."""
    kw = dict(num_heads=2, num_blocks=6, table_width=8, num_pages=40, q_dtype="e4m3",
              per_token=True, scale_lo=124, scale_hi=130)
    if shape.startswith("decode") and shape != "decode1":
        case = decode_index_case(rng, [700, 40, 129, 1], 4, **kw)
    elif shape == "decode1":
        case = decode_index_case(rng, [700, 40, 129, 1, 0], 1, **{**kw, "num_heads": 1})
    else:
        case = prefill_index_case(rng, [37, 90], [300, 0], num_rows=160, **kw)
    kernel, ref = _index(case, kernels="triton" if shape == "decode-triton" else "auto")
    assert_bits(kernel, ref)


def _force_blocks(monkeypatch, blocks: int) -> None:
    """Make ``index_scores.plan`` give every tile ``blocks`` blocks per program."""
    from jax_mxfp4._src.ops.index_scores import triton as index_scores

    planned = index_scores.plan

    def forced(*args, **kwargs):
        return planned(*args, **kwargs).with_blocks(blocks, args[3])

    monkeypatch.setattr(index_scores, "plan", forced)


def _force_prefill_blocks(monkeypatch, blocks: int) -> None:
    """Make ``index_scores.prefill_tile_blocks`` (the Gluon prefill tile's, which e4m3 dots on
    sm_90 take) give every program ``blocks`` blocks."""
    from jax_mxfp4._src.ops.index_scores import triton as index_scores

    monkeypatch.setattr(index_scores, "prefill_tile_blocks", lambda *shape: blocks)


@pytest.mark.parametrize("q_round", ["e4m3", "none"])
@pytest.mark.parametrize("shape", ["decode", "decode4", "ragged", "decode1", "decode1-wide",
                                   "decode1-long", "prefill", "prefill64", "prefill-3-blocks",
                                   "prefill-9-blocks"])
def test_index_scores_within_tolerance(rng, shape, q_round, monkeypatch):
    """decode: S = 8, H = 4 (a 32-row Triton tile). decode4: S = 4, H = 2, the Gluon rows tile
    (e4m3 rounding; a bf16 query kept as is takes the Triton tile's bf16 dots), its walk
    over one request's blocks with the next page in flight. ragged: tiles of 4 rows whose rows
    belong to two requests (the rows tile's walk over each request's page in turn). Both
    with 3 blocks per program forced (these small grids plan one), the last program's blocks
    past the end not scored.
    decode1-wide: decode1's rows with queries over e4m3's whole range (``widen_index_q``: the
    one-row scorer's integer dots use every query slice). decode1-long: 8 single-row
    requests over 601 blocks, with the plan forced to two blocks per program (what it takes
    past 65535 blocks, the grid's y limit), so the grid's last
    program has one block past the end. prefill-3-blocks: the prefill case with three blocks
    per program (the prefetching walk of a prefill tile: each block scored from its own page,
    the last program's blocks past the end not scored; these small grids plan one block per
    program). prefill-9-blocks: a context of 11 blocks, nine blocks a Gluon prefill program
    (past the plan's eight), the second program's last six past the end. prefill /
    prefill64: folded keys on the Triton tile's 128- and 64-row tiles (bf16 queries kept as
    bf16: bf16 dots) and the Gluon prefill tile's 128 rows (e4m3 rounding; its
    tiles across requests take each request's page in turn); the first request's rows straddle
    block 0's end, so a tile's last row sees block 0 whole and its first rows do not (the whole-
    block shortcut must not fire). prefill64's scale bytes are 60..70 under garbage tails with
    byte 255: the page's exponent must come from its live tokens alone. (On the H200: the
    shortcut taken whenever the last row sees the block fails both prefill shapes; the exponent
    taken over every token fails prefill64.)"""
    kw = dict(num_heads=1 if shape != "decode" else 4, num_blocks=5, table_width=6,
              num_pages=40, scale_lo=110, scale_hi=140)
    if shape == "decode":
        case = decode_index_case(rng, [600, 33, 128, 257], 8, **kw)
    elif shape == "decode4":
        kw.update(num_heads=2, num_blocks=40, table_width=40, num_pages=4 * 40)
        case = decode_index_case(rng, [40 * 128, 33, 3000, 4097], 4, **kw)
    elif shape == "ragged":
        case = prefill_index_case(rng, [3, 5, 2, 6], [100, 300, 0, 400], num_rows=16, **kw)
    elif shape in ("decode1", "decode1-wide"):
        case = decode_index_case(rng, [600, 33, 128, 257, 0, 1], 1, **kw)
        if shape == "decode1-wide":
            widen_index_q(case)
    elif shape == "decode1-long":
        seq = [601 * 128, 77000, 1, 0, 129, 40000, 601 * 128 - 1, 5000]
        kw.update(num_blocks=601, table_width=601, num_pages=8 * 601)
        case = decode_index_case(rng, seq, 1, **kw)
        from jax_mxfp4._src.ops.index_scores import triton as index_scores

        _force_blocks(monkeypatch, 2)
        assert index_scores.plan(8, 1, 8, 601, UNITS).one_row
    elif shape == "prefill64":
        kw.update(scale_lo=60, scale_hi=70)
        case = prefill_index_case(rng, [64, 64, 40], [96, 500, 0], num_rows=168, **kw)
    elif shape == "prefill-9-blocks":
        kw.update(num_blocks=12, table_width=12, num_pages=40)
        case = prefill_index_case(rng, [100, 3, 60], [64, 1400, 0], num_rows=200, **kw)
        _force_prefill_blocks(monkeypatch, 9)
    else:
        case = prefill_index_case(rng, [100, 3, 60], [64, 500, 0], num_rows=200, **kw)
        if shape == "prefill-3-blocks":
            _force_blocks(monkeypatch, 3)
            _force_prefill_blocks(monkeypatch, 3)
    if shape in ("decode4", "ragged"):
        from jax_mxfp4._src.ops.index_scores import triton as index_scores

        rows, heads = case.q.shape[:2]
        tile = index_scores.plan(rows, heads, len(case.block_table), case.num_blocks, UNITS)
        assert tile.rows * heads in (4, 8) and not tile.fold, tile
        monkeypatch.setattr(index_scores, "rows_tile_blocks", lambda *shape: 3)
    if shape.startswith("prefill"):
        from jax_mxfp4._src.ops.index_scores import triton as index_scores

        tile = index_scores.plan(len(case.positions), 1, 3, case.num_blocks, UNITS)
        assert tile.fold and tile.m == (64 if shape == "prefill64" else 128), tile
        assert tile.blocks == (3 if shape == "prefill-3-blocks" else 1), tile
    kernel, ref = _index(case, q_round)
    assert np.array_equal(np.isneginf(kernel), np.isneginf(ref))
    static = dict(num_blocks=case.num_blocks, sm_scale=SM_SCALE, q_round=q_round)
    truth = oracle.index_scores(*case.args(), **static).astype(np.float64)
    live = np.isfinite(ref)
    magnitude = oracle.index_score_magnitudes(*case.args(), **static)[live]
    # docs/spec.md §10: within oracle.index_score_tolerance of the float64 oracle, so the two
    # lowerings agree within twice that.
    kernel_err = oracle.index_score_errors(kernel[live], truth[live], magnitude)
    assert kernel_err.max() <= 1, kernel_err.max()
    assert oracle.index_score_errors(kernel[live], ref[live], magnitude).max() <= 2


@pytest.mark.parametrize("shape", ["decode", "decode1", "prefill"])
def test_index_scores_deep_scale_groups(rng, shape):
    """Scale groups 31-110 binades below their token's largest, and all-zero groups (byte 0):
    prefill tiles take the folded keys' extra exponent bands (``mxfp4.folded_page_logits``),
    decode tiles their group dots. Rows whose query lives only in the deep group score it
    within the index score tolerance, so a lost band fails (on the H200, one band only: the
    prefill case fails)."""
    case = deep_scale_index_case(rng, shape)
    kernel, ref = _index(case)
    static = dict(num_blocks=case.num_blocks, sm_scale=SM_SCALE, q_round="e4m3")
    truth = oracle.index_scores(*case.args(), **static).astype(np.float64)
    live = np.isfinite(ref)
    assert np.array_equal(np.isneginf(kernel), np.isneginf(ref))
    assert live.sum() > 8
    magnitude = oracle.index_score_magnitudes(*case.args(), **static)[live]
    assert oracle.index_score_errors(kernel[live], truth[live], magnitude).max() <= 1
    assert oracle.index_score_errors(ref[live], truth[live], magnitude).max() <= 1


@pytest.mark.parametrize("topk,init,local", [(16, 0, 1), (4, 1, 1), (3, 2, 2)])
def test_select_blocks(rng, topk, init, local):
    case = decode_index_case(rng, [3000, 40, 129, 1, 0], 2, num_heads=2, num_blocks=30,
                             table_width=32, num_pages=60)
    scores = np.round(rng.standard_normal((2, len(case.positions), 30)) * 2) / 2  # ties
    scores = scores.astype(np.float32)
    scores[0, 1, 3] = np.nan
    scores[1, 2, :] = -np.inf
    kernel, ref = both(jm.select_blocks, scores, case.block_table, case.positions,
                       case.requests, topk=topk, init_blocks=init, local_blocks=local)
    assert_bits(kernel, ref)


@pytest.mark.parametrize("num_blocks,topk,rows", [(1024, 16, 37), (4096, 64, 5), (200, 128, 300)],
                         ids=["128K", "512K", "short-rows"])
def test_select_blocks_long_rows(rng, num_blocks, topk, rows):
    """Rows of 128K and 512K contexts (several rows per program, or one program spanning 8
    warps), scores with ties, NaN and infinities: bit-equal to the reference lowering."""
    table = rng.integers(0, 10_000, (4, num_blocks)).astype(np.int32)
    positions = rng.integers(-1, num_blocks * 128, rows).astype(np.int32)
    positions[0] = num_blocks * 128 - 1
    requests = rng.integers(0, 5, rows).astype(np.int32)  # 4: a padding row
    scores = (np.round(rng.standard_normal((2, rows, num_blocks)) * 4) / 4).astype(np.float32)
    poison = rng.random(scores.shape) < 0.01
    scores[poison] = rng.choice(np.array([np.nan, np.inf, -np.inf], np.float32), poison.sum())
    kernel, ref = both(jm.select_blocks, scores, table, positions, requests, topk=topk,
                       init_blocks=2, local_blocks=3)
    assert (ref.block_ids >= 0).sum() > rows  # most rows select something
    assert_bits(kernel, ref)


@pytest.mark.parametrize("rows", [1, 7, 600], ids=["split", "split7", "direct"])
@pytest.mark.parametrize("q_dtype", ["bf16", "e4m3"])
def test_sparse_attention(rng, rows, q_dtype):
    ctx = rng.integers(0, 16 * 128 + 1, (rows, 1))
    ctx[0, 0] = 0  # an empty row: zeros
    case = attention_case(rng, ctx, group=16, n_pages=16, q_dtype=q_dtype)
    with backend_scope("auto"):
        out = np.asarray(jax.jit(lambda *a: jm.sparse_attention(*a, sm_scale=SM_SCALE))(
            *case.args()))
    expected = oracle.sparse_attention(*case.args(), sm_scale=SM_SCALE)
    ok, why = oracle.attention_close(out, expected)
    assert ok, why
    assert np.all(out[0].astype(np.float32) == 0)


@pytest.mark.parametrize("rows,pages", [(1, 16), (600, 1)], ids=["split", "direct"])
def test_sparse_attention_pv_range(rng, rows, pages):
    """SPEC §7 "PV range": |V| up to 1.5 * 2**127 stays finite, through the split-K merge
    (16 pages: 16 partitions of 1) and the direct path (a page table 1 page wide)."""
    from jax_mxfp4._src.ops.sparse_attention.triton import plan

    assert (plan(16, pages).splits == 1) == (pages == 1)
    ctx = np.full((rows, 1), pages * 128, np.int32)
    ctx[-1, 0] = pages * 128 - 49
    case = large_value_case(rng, ctx, group=16, n_pages=pages)
    with backend_scope("auto"):
        out = np.asarray(jax.jit(lambda *a: jm.sparse_attention(*a, sm_scale=SM_SCALE))(
            *case.args()))
    expected = oracle.sparse_attention(*case.args(), sm_scale=SM_SCALE)
    assert np.abs(expected.astype(np.float64)).min() > 1e38
    ok, why = oracle.attention_close(out, expected)
    assert ok, why


@pytest.mark.parametrize("rows", [1, 24, 300])
def test_mxfp8_epilogue_is_quantize_of_the_bf16_output(rng, rows):
    case = attention_case(rng, rng.integers(1, 16 * 128 + 1, (rows, 1)), group=16, n_pages=16,
                          q_scale=30.0)

    def run(output):
        fn = jax.jit(lambda *a: jm.sparse_attention(*a, sm_scale=SM_SCALE, output=output))
        return jax.tree.map(np.asarray, fn(*case.args()))

    values, scales = run("mxfp8")
    bf16 = run("bf16")
    ref_values, ref_scales = jax.tree.map(
        np.asarray, jm.quantize_mxfp8(bf16.reshape(rows, -1)))
    np.testing.assert_array_equal(scales, ref_scales)
    np.testing.assert_array_equal(bits(values), bits(ref_values))


@pytest.mark.parametrize("rows,pages", [(1, 16), (300, 2), (300, 1)],
                         ids=["split", "split-2-pages", "direct"])
def test_mxfp8_epilogue_non_finite_blocks(rng, rows, pages):
    """SPEC §1.9: an output block holding Inf or NaN (a NaN or infinite V token) gets scale
    byte 255 and NaN values, through the split-K merge and the direct store (a page table 1
    page wide). Rows ``t % 4 == 2`` get no non-finite V (``non_finite_v``)."""
    case = attention_case(rng, rng.integers(1, pages * 128 + 1, (rows, 1)), group=16,
                          n_pages=pages)
    non_finite_v(case)

    def run(output):
        fn = jax.jit(lambda *a: jm.sparse_attention(*a, sm_scale=SM_SCALE, output=output))
        return jax.tree.map(np.asarray, fn(*case.args()))

    values, scales = run("mxfp8")
    bf16 = run("bf16").reshape(rows, -1)
    non_finite = ~np.isfinite(bf16.astype(np.float32).reshape(rows, -1, 32)).all(-1)
    poisoned = np.arange(rows) % 4 != 2
    assert (non_finite.any(-1) == poisoned).all()
    np.testing.assert_array_equal(scales == 255, non_finite)
    want_values, want_scales = oracle.quantize_mxfp8(bf16)
    np.testing.assert_array_equal(scales, want_scales)
    np.testing.assert_array_equal(bits(values), bits(want_values))

def test_kv_heads_and_groups(rng):
    case = attention_case(rng, rng.integers(0, 700, (5, 2)), group=4, n_pages=6)
    out = np.asarray(jax.jit(lambda *a: jm.sparse_attention(*a, sm_scale=SM_SCALE))(
        *case.args()))
    ok, why = oracle.attention_close(out, oracle.sparse_attention(*case.args(),
                                                                  sm_scale=SM_SCALE))
    assert ok, why
