"""Non-finite values (SPEC §9.2) on every backend here: the reference, the C++ handlers with
their SIMD kernels and with the portable ones, and the emulated ROCm backends (gfx950: the
FlyDSL kernels where they cover a call; gfx942: Triton), against the float64 oracle.

* index_scores: a live token whose logit is not finite (a NaN key scale byte, a NaN query
  element, an infinite one kept by ``q_round="none"``, a dot product past the fp32 range) makes
  the block's score NaN; an overflow is NaN whatever order a kernel sums in.
* sparse_attention: a live logit that is not finite makes its q head's whole output NaN; NaN
  and infinite V elements of live tokens reach their output elements by IEEE arithmetic.
* Garbage in tokens that are not live never reaches a result (SPEC §1.3).

Seen failing before the rule (reference and both C++ kernel flavours; this machine has no
AVX-512, so "native" ran the portable kernels): the poisoned-row and overflow cases of
sparse_attention (exact zeros for the poisoned q heads, their other keys discarded) and the
overflow case of index_scores (+inf or -inf scores where the summation order overflowed
without meeting the opposite infinity). The issue saw the AVX-512 scorer give +-inf where the
portable one gave NaN: one class now, NaN.

Mutation of the FlyDSL scorer (gfx950): folding its logits with NaN-dropping ``fmax`` /
``fmin`` in place of ``maximum`` / ``minimum`` failed
test_index_nan_key_scale_and_nan_query[emulated-gfx950] (finite scores for the NaN key
scale and the NaN query). The FlyDSL attention kernel's Markstein quotients without their
guard for an infinite numerator (``O / l`` gave NaN for a +inf dim) failed
test_attention_nonfinite_values_follow_ieee[emulated-gfx950].
"""

from __future__ import annotations

import numpy as np
import oracle
import pytest
from conftest import EMULATED, SM_SCALE, attention_case, call, decode_index_case

from jax_mxfp4._src import ffi_targets as ft

needs_ffi = pytest.mark.skipif(not ft.register_cpu_targets(),
                               reason="the C++ extension jax_mxfp4._ffi_cpu is not built")
IMPLS = ["reference", "native", "generic", *EMULATED]
"""Taken through conftest's ``impl`` fixture (``indirect``), which gives an emulated backend
the session's FlyDSL build."""


def run(impl, monkeypatch, fn, *args, **static):
    """``fn`` of the reference, of the public API with the SIMD (native) or portable
    (generic) kernels of the C++ handlers, or of the public API on an emulated backend."""
    if impl in EMULATED:
        return call(impl, fn, *args, **static)
    if impl == "generic":
        monkeypatch.setenv("JAX_MXFP4_CPU_ISA", "generic")
    else:
        monkeypatch.delenv("JAX_MXFP4_CPU_ISA", raising=False)
    return call("reference" if impl == "reference" else "public", fn, *args, **static)


def assert_same_values(got, want):
    """NaN exactly where ``want`` is NaN, equal infinities, bit-equal finite values."""
    got, want = np.asarray(got), np.asarray(want)
    same = oracle.bits_equal(got, want)
    bad = np.argwhere(~same)
    assert len(bad) == 0, f"{len(bad)} differ, e.g. at {bad[:4].tolist()}: {got[~same][:4]} " \
                          f"vs {want[~same][:4]}"


def assert_attention(got, want):
    """NaN and infinities exactly where ``want`` has them (with their signs); the finite rest
    within the SPEC §10 tolerance."""
    got = np.asarray(got).astype(np.float64)
    want = np.asarray(want).astype(np.float64)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    infinite = np.isinf(want)
    np.testing.assert_array_equal(got[infinite], want[infinite])
    finite = np.isfinite(want)
    assert np.isfinite(got[finite]).all()
    ok, why = oracle.attention_close(got[finite], want[finite])
    assert ok, why


# ---------------------------------------------------------------------------------------------
# index_scores
# ---------------------------------------------------------------------------------------------


def index_case(rng, q_dtype="e4m3"):
    """Exact data (one scale byte per token, e4m3-exact queries): 2 requests, 2 rows each."""
    case = decode_index_case(rng, [300, 200], 2, num_heads=2, num_blocks=3, table_width=3,
                             num_pages=8, q_dtype=q_dtype, per_token=True, scale_lo=120,
                             scale_hi=130)
    case.q = oracle.to_e4m3(case.q.astype(np.float64)).astype(case.q.dtype)
    return case


def index_scores(impl, monkeypatch, case, q_round="e4m3"):
    static = dict(num_blocks=case.num_blocks, sm_scale=SM_SCALE, q_round=q_round)
    got = run(impl, monkeypatch, "index_scores", *case.args(), **static)
    return got, oracle.index_scores(*case.args(), **static)


@needs_ffi
@pytest.mark.parametrize("impl", IMPLS, indirect=True)
def test_index_nan_key_scale_and_nan_query(impl, monkeypatch, rng):
    case = index_case(rng)
    case.pool[case.block_table[0, 1], 8192 + 4 * 5 + 1] = 255  # live token 5, block 1, req 0
    case.q[2, 1, 7] = np.nan  # row 2 (request 1), head 1
    got, want = index_scores(impl, monkeypatch, case)
    assert_same_values(got, want)
    assert np.isnan(want[:, 0:2, 1]).all() and np.isnan(want[1, 2, :2]).all()
    assert np.isfinite(want[0, 2, :2]).all()  # the other head of the row is untouched


@needs_ffi
@pytest.mark.parametrize("impl", IMPLS, indirect=True)
@pytest.mark.parametrize("q_round", ["e4m3", "none"])
def test_index_infinite_query(impl, q_round, monkeypatch, rng):
    """An infinite bf16 query element: kept by ``q_round="none"`` (NaN scores), saturated to
    448 by the e4m3 rounding (finite scores, SPEC §1.5)."""
    case = index_case(rng, "bf16")
    case.q[0, 0, 3] = np.inf
    got, want = index_scores(impl, monkeypatch, case, q_round)
    assert_same_values(got, want)
    assert np.isnan(want[0, 0, :3]).all() == (q_round == "none")


@needs_ffi
@pytest.mark.parametrize("impl", IMPLS, indirect=True)
def test_index_dot_product_overflow_is_nan(impl, monkeypatch, rng):
    """``q_round="none"``: bf16 queries near 2**120 against keys at scale byte 200 give dot
    products past FLT_MAX with both signs, so the summation order decides between +inf,
    -inf and NaN; every backend gives NaN. Rows that stay in range are exact."""
    case = index_case(rng, "bf16")
    big = case.q[:2].astype(np.float64)
    signs = np.where(np.arange(128) % 3 == 0, -1.0, 1.0)
    case.q[:2] = oracle.to_bf16(np.abs(big) * 2.0**118 * signs + 2.0**118)
    case.pool[:, 8192:] = 200
    got, want = index_scores(impl, monkeypatch, case, "none")
    live = np.isfinite(want) | np.isnan(want)
    assert np.isnan(want[:, :2][live[:, :2]]).all()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.isneginf(got), np.isneginf(want))


@needs_ffi
@pytest.mark.parametrize("impl", IMPLS, indirect=True)
def test_index_garbage_past_the_position_never_leaks(impl, monkeypatch, rng):
    """NaN and byte-255 tokens past every row's position change nothing."""
    case = index_case(rng)
    clean, _ = index_scores(impl, monkeypatch, case)
    page = case.pool[case.block_table[0, 2]]
    page[8192 + 4 * 44:] = 255  # tokens 44.. of request 0's block 2: past positions 298, 299
    page[44 * 64:8192] = 0xFF
    got, want = index_scores(impl, monkeypatch, case)
    assert_same_values(got, want)
    assert_same_values(got, clean)


# ---------------------------------------------------------------------------------------------
# sparse_attention
# ---------------------------------------------------------------------------------------------


def attn_case(rng, q_dtype="bf16"):
    """Rows (t, kv head) of 2 kv heads, G = 2, contexts over 2 pages; unused slots page 0."""
    ctx = np.array([[200, 130], [60, 256], [129, 1], [0, 90]], np.int32)
    return attention_case(rng, ctx, group=2, n_pages=2, q_dtype=q_dtype, unused="zero")


def attention(impl, monkeypatch, case, output="bf16"):
    static = dict(sm_scale=SM_SCALE, output=output)
    return run(impl, monkeypatch, "sparse_attention", *case.args(), **static)


def expected(case):
    return oracle.sparse_attention(*case.args(), sm_scale=SM_SCALE)


@needs_ffi
@pytest.mark.parametrize("impl", IMPLS, indirect=True)
def test_attention_poisoned_keys_and_queries_give_nan_rows(impl, monkeypatch, rng):
    case = attn_case(rng)
    page = case.page_table[0, 1, 1]  # row (0, kv 1): a live token of its second page
    case.k_pool[page, 1, 8192 + 4 * 1 + 3] = 255
    case.q[1, 0, 5] = np.nan  # token 1, q head 0 (kv head 0)
    case.q[2, 3, 9] = np.inf  # token 2, q head 3 (kv head 1): q_scale inf -> NaN
    got, want = attention(impl, monkeypatch, case), expected(case)
    assert_attention(got, want)
    nan_heads = np.isnan(want.astype(np.float64)).all(axis=-1)
    assert nan_heads.tolist() == [[False, False, True, True], [True, False, False, False],
                                  [False, False, False, True], [False] * 4]


@needs_ffi
@pytest.mark.parametrize("impl", IMPLS, indirect=True)
def test_attention_logit_overflow_is_nan(impl, monkeypatch, rng):
    """A bf16 query near 2**127 against keys at scale byte 250: logits past FLT_MAX."""
    case = attn_case(rng)
    case.q[0, :2] = oracle.to_bf16(case.q[0, :2].astype(np.float64) * 2.0**125)
    case.k_pool[case.page_table[0, 0, 0], 0, 8192:] = 250
    got, want = attention(impl, monkeypatch, case), expected(case)
    assert np.isnan(want[0, :2].astype(np.float64)).all()
    assert_attention(got, want)


@needs_ffi
@pytest.mark.parametrize("impl", IMPLS, indirect=True)
def test_attention_nonfinite_values_follow_ieee(impl, monkeypatch, rng):
    """A live V token with scale byte 255 makes its 32 output dims NaN; an element past the
    fp32 range (byte 254, code 4: 2**129) makes its dim +inf where every weight is positive."""
    case = attn_case(rng)
    case.q[:] = 0  # equal logits: every live weight positive (no underflow to 0)
    page = case.page_table[1, 1, 0]  # row (1, kv 1), context 256
    case.v_pool[page, 1, 8192 + 4 * 10 + 2] = 255  # token 10, dims 64..95
    row = case.page_table[2, 0, 0]  # row (2, kv 0), context 129
    v = case.v_pool[row, 0]
    v[8192 + 4 * 3] = 254  # token 3, group 0
    v[3 * 64:3 * 64 + 16] = 0  # the group's other elements 0,
    v[3 * 64] = 6  # element 0: e2m1 code 6 (4.0) -> 2**129
    got, want = attention(impl, monkeypatch, case), expected(case)
    assert_attention(got, want)
    w = want.astype(np.float64)
    assert np.isnan(w[1, 2:4, 64:96]).all() and np.isfinite(w[1, 2:4, :64]).all()
    assert np.isposinf(w[2, :2, 0]).all() and np.isfinite(w[2, :2, 1:]).all()


@needs_ffi
@pytest.mark.parametrize("impl", IMPLS, indirect=True)
def test_attention_garbage_past_the_context_never_leaks(impl, monkeypatch, rng):
    """NaN scales and NaN/inf-producing bytes in K and V past each row's context, in the
    tail of its last page and in the table slots past its pages, change nothing."""
    case = attn_case(rng)
    clean = attention(impl, monkeypatch, case)
    for t, h in np.ndindex(case.context_lens.shape):
        c = int(case.context_lens[t, h])
        if c % 128 == 0:
            continue  # no tail: the page is full (or the row empty)
        last = case.page_table[t, h, (c - 1) // 128]
        for pool in (case.k_pool, case.v_pool):
            pool[last, h, 8192 + 4 * (c % 128):] = 255
            pool[last, h, 64 * (c % 128):8192] = 0x77  # codes 7: 6.0
    got = attention(impl, monkeypatch, case)
    assert_attention(got, expected(case))
    assert_same_values(got, clean)


@needs_ffi
@pytest.mark.parametrize("impl", IMPLS, indirect=True)
def test_attention_mxfp8_of_a_nan_row(impl, monkeypatch, rng):
    """The MXFP8 output of a NaN row is the MXFP8 quantization of the bf16 output."""
    case = attn_case(rng)
    case.q[1, 0, 5] = np.nan
    bf16 = attention(impl, monkeypatch, case)
    values, scales = attention(impl, monkeypatch, case, "mxfp8")
    want_values, want_scales = call("reference", "quantize_mxfp8", bf16.reshape(len(bf16), -1))
    assert_same_values(values, want_values)
    np.testing.assert_array_equal(scales, want_scales)
