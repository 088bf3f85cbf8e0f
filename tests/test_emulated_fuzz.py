"""The emulated ROCm backends survive the API (issue 43): hypothesis fuzzing of the public
functions on ``emulated-gfx950`` (both ``gfx950_kernels`` choices: the FlyDSL kernels, Triton
where none covers a call, and the Triton kernels alone) and ``emulated-gfx942``, each result
held to the CPU handlers' as SPEC §10 holds a GPU backend: the same bits where SPEC says
exact, its GPU tolerance elsewhere, and no emulator fault (a fault raises, failing the
example).

Cases, at small sizes (1-4 heads, 1-6 blocks, up to 8 rows):

* ``write``: ``write_cache`` of 0-8 rows, or 257-300 (past the short writes' slot scan: the
  claim kernel's slot table), slots anywhere, repeated ones included; pages bit for bit.
* ``step``: ``index_scores`` -> ``select_blocks`` -> ``sparse_attention`` over decode or prefill
  rows with per-request contexts 0 .. past the table (padding rows next to live ones), block
  tables with duplicate and out-of-range page ids, ``q_round`` "e4m3" and "none", ``topk``
  from 1 to the block count, bf16 and MXFP8 output, the same pool as ``k_pool`` and
  ``v_pool``. Scores bit for bit where SPEC says exact (an e4m3 query, stored or rounded,
  one scale byte per token, no page live twice), elsewhere within twice §10.1's bound;
  the selection (of the CPU's scores) bit for bit; attention within §10 with NaN where the
  CPU has it, and MXFP8 bit for bit ``quantize_mxfp8`` of the same backend's bf16 output.
* ``attention``: ``sparse_attention`` on page tables and contexts drawn anywhere.

A few derandomized examples per case run in ``make test``; ``pytest -m fuzz`` runs
``JAX_MXFP4_FUZZ_EXAMPLES`` per case (400 by default), randomized.

Mutation checks (by hand; each made this file fail, as its fault): ``v_pk_lshlrev_b16`` and
``ds_permute_b32`` unmodelled, ``lane_defined`` returning a view again, the word-select
definedness of ``v_cvt_pk_fp8_f32`` back to per lane, ``v_mad_u64_u32``'s low dword needing
the addend's high dword, and overlapping read-only regions refused (see
cdna_emulator/README.md, "Findings of the API fuzz").
"""

from __future__ import annotations

import contextlib
import functools
import os

import jax
import numpy as np
import oracle
import pytest
from conftest import GARBAGE_SCALES, SM_SCALE, random_pages, use_session_kernels
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import jax_mxfp4 as jm

pytest.importorskip("triton")

I32_MAX = 2**31 - 1
TARGETS = {
    "gfx950-flydsl": ("emulated-gfx950", "flydsl"),
    "gfx950-triton": ("emulated-gfx950", "triton"),
    "gfx942": ("emulated-gfx942", None),
}
"""name -> (backend, ``gfx950_kernels`` option; None: the backend's own kernels)."""

QUICK = settings(max_examples=3, deadline=None, derandomize=True, database=None,
                 suppress_health_check=[HealthCheck.function_scoped_fixture,
                                        HealthCheck.too_slow])
LONG = settings(max_examples=int(os.environ.get("JAX_MXFP4_FUZZ_EXAMPLES", "400")),
                deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                      HealthCheck.too_slow])

_STATIC = {"write_cache": ("round_mode",), "index_scores": ("num_blocks", "sm_scale", "q_round"),
           "select_blocks": ("topk", "init_blocks", "local_blocks"),
           "sparse_attention": ("sm_scale", "output")}


@functools.cache
def _jitted(name: str):
    return jax.jit(getattr(jm, name), static_argnames=_STATIC[name])


def on_cpu(name: str, *args, **static):
    """``jm.<name>`` on the process's own backend (the CPU handlers); numpy results."""
    return jax.tree.map(np.asarray, _jitted(name)(*args, **static))


def emulated(target: str, name: str, *args, **static):
    """``jm.<name>`` on the emulated ``target`` (a key of :data:`TARGETS`); numpy results.
    The backend and the lowering options are part of jit's key, so each target compiles its
    own program."""
    backend, kernels = TARGETS[target]
    options = (jm.lowering_options(gfx950_kernels=kernels) if kernels
               else contextlib.nullcontext())
    with jm.backend_scope(backend), options:
        return jax.tree.map(np.asarray, _jitted(name)(*args, **static))


@pytest.fixture(params=list(TARGETS))
def target(request, monkeypatch) -> str:
    """An emulated target, with the session's FlyDSL build as its code objects."""
    use_session_kernels(request, monkeypatch)
    return request.param


# ---------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------


def garble_tokens(rng, pages, start: int) -> None:
    """In place: tokens ``start..127`` of ``pages uint8[..., 8704]`` get random data and one
    garbage scale byte per token (0, 255 and others), so a page stays one-scale-per-token."""
    if start >= 128:
        return
    lead = pages.shape[:-1]
    n = 128 - start
    pages[..., start * 64:8192] = rng.integers(0, 256, (*lead, n * 64), dtype=np.uint8)
    scales = rng.choice(GARBAGE_SCALES, (*lead, n, 1))
    pages[..., 8192 + start * 4:] = np.repeat(scales, 4, axis=-1).reshape(*lead, n * 4)


def live_tokens(seq_lens, block_table, num_pages: int) -> dict:
    """``{page: live tokens}`` of the table's in-range pages (the most any request using the
    page reaches: SPEC §2.2, tokens ``t < seq_len``)."""
    live: dict = {}
    for b, row in enumerate(np.asarray(block_table)):
        for j, page in enumerate(row):
            if 0 <= page < num_pages:
                n = int(min(max(int(seq_lens[b]) - 128 * j, 0), 128))
                live[int(page)] = max(live.get(int(page), 0), n)
    return live


def pool_for(rng, shape, live: dict, per_token: bool) -> np.ndarray:
    """``uint8[*shape, 8704]`` pages (axis 0: page ids): random MXFP4 values, scale bytes
    118..130, tokens past each page's ``live`` count (every token of pages not in it) garbage
    (:func:`garble_tokens`)."""
    pool = random_pages(rng, shape, 118, 130, per_token=per_token)
    for page in range(shape[0]):
        garble_tokens(rng, pool[page], live.get(page, 0))
    return pool


def bf16(rng, *shape, scale=1.0) -> np.ndarray:
    return oracle.to_bf16(rng.standard_normal(shape) * scale)


def ids(num_pages: int):
    """A page id: in range (most of the time), or out of range (-1, P, P + 7, INT32_MAX)."""
    return st.one_of(st.integers(0, num_pages - 1), st.integers(0, num_pages - 1),
                     st.sampled_from([-1, num_pages, num_pages + 7, I32_MAX]))


# ---------------------------------------------------------------------------------------------
# write_cache
# ---------------------------------------------------------------------------------------------


def check_write(data, target: str) -> None:
    """``write_cache`` of ``x bf16 [T, H, 128]`` (or ``[T, 128]`` into an index pool) at
    ``slots int32 [T]``: the emulated pool ``uint8 [P, (H,) 8704]`` bit for bit the CPU's."""
    tokens = data.draw(st.one_of(st.integers(0, 8), st.integers(257, 300)), label="T")
    heads = data.draw(st.sampled_from([0, 1, 2]), label="heads (0: index pool)")
    pages = 3
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="seed"))
    lead = (pages,) if heads == 0 else (pages, heads)
    pool = rng.integers(0, 256, (*lead, 8704), dtype=np.uint8)
    x = bf16(rng, tokens, *((heads,) if heads else ()), 128,
             scale=data.draw(st.sampled_from([1e-3, 1.0, 300.0]), label="x scale"))
    x[rng.random(x.shape[:-1]) < 0.1] = 0  # all-zero rows: scale byte 0
    edge = [-1, 0, pages * 128 - 1, pages * 128, 2**31 - 1]
    slots = rng.integers(-2, pages * 128 + 2, tokens)
    at_edge = rng.random(tokens) < 0.2
    slots[at_edge] = rng.choice(edge, int(at_edge.sum()))
    if tokens > 1:  # repeated slots: the last row naming one wins (SPEC §3.1)
        dup = rng.random(tokens) < 0.3
        slots[dup] = rng.choice(slots, tokens)[dup]
    slots = slots.astype(np.int32)
    mode = data.draw(st.sampled_from(["up", "even", "down"]), label="round_mode")
    got = emulated(target, "write_cache", pool, x, slots, round_mode=mode)
    np.testing.assert_array_equal(got, on_cpu("write_cache", pool, x, slots, round_mode=mode))


# ---------------------------------------------------------------------------------------------
# index_scores -> select_blocks -> sparse_attention
# ---------------------------------------------------------------------------------------------


def contexts(num_blocks: int):
    """A request's tokens: 0, the page edges, the table's end and past it, or anything."""
    edges = [0, 1, 127, 128, 129, num_blocks * 128 - 1, num_blocks * 128,
             num_blocks * 128 + 5]
    return st.one_of(st.sampled_from(edges), st.integers(0, num_blocks * 128 + 10))


def draw_rows(data, num_blocks: int):
    """``(seq_lens int32 [B], positions int32 [T], requests int32 [T])``: decode rows (1-2
    per request) or ragged prefill rows (0-3 per request after a cached prefix, then 0-2
    padding rows); requests of 0 tokens and rows with position -1 included."""
    requests = data.draw(st.integers(1, 3), label="requests")
    if data.draw(st.booleans(), label="decode"):
        seq = np.array(data.draw(st.lists(contexts(num_blocks), min_size=requests,
                                          max_size=requests), label="seq_lens"), np.int32)
        s = data.draw(st.integers(1, 2), label="rows per request")
        return (seq, *oracle.decode_rows(seq, s))
    q_lens = np.array(data.draw(st.lists(st.integers(0, 3), min_size=requests,
                                         max_size=requests), label="q_lens"), np.int64)
    prefix = np.array(data.draw(st.lists(contexts(num_blocks), min_size=requests,
                                         max_size=requests), label="prefix"), np.int64)
    cu = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    rows = int(cu[-1]) + data.draw(st.integers(0, 2), label="padding rows")
    positions, row_requests = oracle.prefill_rows(cu, prefix, max(rows, 1))
    return (prefix + q_lens).astype(np.int32), positions, row_requests


def draw_table(data, requests: int, num_blocks: int):
    """``(block_table int32 [B, NB], pages P)``: distinct pages, then some entries replaced
    by another entry's page (a page live twice) or by an out-of-range id."""
    pages = requests * num_blocks + 2
    table = np.random.default_rng(data.draw(st.integers(0, 2**16), label="perm")).permutation(
        pages)[:requests * num_blocks].reshape(requests, num_blocks).astype(np.int32)
    flat = table.reshape(-1)
    edits = data.draw(st.lists(st.tuples(st.integers(0, flat.size - 1), ids(pages)),
                               max_size=3), label="table edits")
    for at, page in edits:
        flat[at] = page
    return table, pages


def check_scores(got, want, case, static) -> None:
    """Index scores ``f32 [H, T, NB]``: bit for bit where SPEC §10 says exact, else the same
    -inf and NaN and finite ones within twice §10.1's bound (two backends)."""
    if case["exact"]:
        assert oracle.bits_equal(got, want).all(), np.argwhere(~oracle.bits_equal(got, want))
        return
    for cls in (np.isnan, np.isneginf, np.isposinf):
        np.testing.assert_array_equal(cls(got), cls(want))
    fin = np.isfinite(want)
    q, pool, table, positions, requests = case["index_args"]
    magnitude = oracle.index_score_magnitudes(q, pool, table, positions, requests, **static)
    ok = np.isfinite(magnitude)
    err = oracle.index_score_errors(got[fin & ok], want[fin & ok], magnitude[fin & ok])
    assert err.size == 0 or err.max() <= 2, err.max()


def check_attention_outputs(target, args, sm_scale=SM_SCALE) -> None:
    """``sparse_attention(*args)`` (q ``[T, Hq, 128]``): bf16 output NaN where the CPU's is,
    the finite rest within SPEC §10 of it; the MXFP8 output (values e4m3 ``[T, Hq*128]``,
    scales uint8 ``[T, Hq*4]``) bit for bit ``quantize_mxfp8`` of the same target's bf16."""
    got = emulated(target, "sparse_attention", *args, sm_scale=sm_scale)
    want = on_cpu("sparse_attention", *args, sm_scale=sm_scale)
    g, w = got.astype(np.float64), want.astype(np.float64)
    np.testing.assert_array_equal(np.isnan(g), np.isnan(w))
    fin = ~np.isnan(w)
    ok, why = oracle.attention_close(g[fin], w[fin])
    assert ok, why
    values, scales = emulated(target, "sparse_attention", *args, sm_scale=sm_scale,
                              output="mxfp8")
    want_v, want_s = jax.tree.map(np.asarray, jm.quantize_mxfp8(got.reshape(got.shape[0], -1)))
    assert oracle.bits_equal(values, want_v).all()
    np.testing.assert_array_equal(scales, want_s)


def draw_step(data) -> dict:
    """One decode or prefill step's arrays and options (see :func:`check_step`)."""
    heads = data.draw(st.integers(1, 4), label="heads")
    num_blocks = data.draw(st.integers(1, 6), label="num_blocks")
    seq, positions, requests = draw_rows(data, num_blocks)
    table, pages = draw_table(data, seq.size, num_blocks)
    q_kind = data.draw(st.sampled_from(["bf16 e4m3", "bf16 none", "e4m3 e4m3"]), label="q")
    per_token = data.draw(st.booleans(), label="one scale byte per token")
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="seed"))
    live = live_tokens(seq, table, pages)
    in_range = table[(table >= 0) & (table < pages)]
    q_index = bf16(rng, positions.size, heads, 128)
    if q_kind.startswith("e4m3"):
        q_index = oracle.to_e4m3(q_index)
    case = dict(index_args=(q_index, pool_for(rng, (pages,), live, per_token), table,
                            positions, requests),
                q_round=q_kind.split()[1],
                exact=q_kind != "bf16 none" and per_token and in_range.size == np.unique(
                    in_range).size)
    group = data.draw(st.sampled_from([1, 4, 16]), label="q heads per kv head")
    q = bf16(rng, positions.size, heads * group, 128)
    if data.draw(st.booleans(), label="e4m3 attention query"):
        q = oracle.to_e4m3(q)
    k_pool = pool_for(rng, (pages, heads), live, False)
    same = data.draw(st.booleans(), label="k_pool is v_pool")
    case.update(q=q, k_pool=k_pool, v_pool=k_pool if same else pool_for(rng, (pages, heads),
                                                                         live, False))
    topk = data.draw(st.integers(1, num_blocks), label="topk")
    init = data.draw(st.integers(0, min(1, topk)), label="init_blocks")
    local = data.draw(st.integers(0 if init else 1, 1), label="local_blocks")
    case["select"] = dict(topk=topk, init_blocks=init, local_blocks=local)
    case["num_blocks"] = num_blocks
    return case


def check_step(data, target: str) -> None:
    """Scores (index q ``[T, H, 128]``, pool ``uint8 [P, 8704]``, table ``int32 [B, NB]``),
    then the selection ``SparseSelection`` of the CPU's scores, then attention (q ``[T,
    H*G, 128]``, pools ``uint8 [P, H, 8704]``) over the CPU's selection, each against the
    CPU handlers."""
    case = draw_step(data)
    static = dict(num_blocks=case["num_blocks"], sm_scale=SM_SCALE, q_round=case["q_round"])
    scores = on_cpu("index_scores", *case["index_args"], **static)
    check_scores(emulated(target, "index_scores", *case["index_args"], **static), scores,
                 case, static)
    _, _, table, positions, requests = case["index_args"]
    want = on_cpu("select_blocks", scores, table, positions, requests, **case["select"])
    got = emulated(target, "select_blocks", scores, table, positions, requests,
                   **case["select"])
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)
    check_attention_outputs(target, (case["q"], case["k_pool"], case["v_pool"],
                                     want.page_table, want.context_lens))


# ---------------------------------------------------------------------------------------------
# sparse_attention on any page table
# ---------------------------------------------------------------------------------------------


def check_attention(data, target: str) -> None:
    """``sparse_attention`` of q ``[T, H*G, 128]`` over pools ``uint8 [P, H, 8704]`` with a
    page table ``int32 [T, H, n]`` of ids anywhere (duplicates, out of range) and contexts
    ``int32 [T, H]`` from -3 to past the table."""
    rows = data.draw(st.integers(1, 6), label="rows")
    heads = data.draw(st.integers(1, 3), label="kv heads")
    width = data.draw(st.integers(1, 4), label="page slots")
    group = data.draw(st.sampled_from([1, 4, 16]), label="q heads per kv head")
    pages = 6
    table = np.array(data.draw(st.lists(ids(pages), min_size=rows * heads * width,
                                        max_size=rows * heads * width), label="page table"),
                     np.int32).reshape(rows, heads, width)
    ctx = np.array(data.draw(st.lists(st.one_of(st.sampled_from([0, 1, 128, width * 128]),
                                                st.integers(-3, width * 128 + 130)),
                                      min_size=rows * heads, max_size=rows * heads),
                             label="contexts"), np.int32).reshape(rows, heads)
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="seed"))
    live = {}  # the most tokens any row reads of each page: the rest is garbage
    for t, h, j in np.ndindex(table.shape):
        if 0 <= table[t, h, j] < pages:
            n = int(min(max(int(ctx[t, h]) - 128 * j, 0), 128))
            live[int(table[t, h, j])] = max(live.get(int(table[t, h, j]), 0), n)
    k_pool = pool_for(rng, (pages, heads), live, False)
    v_pool = k_pool if data.draw(st.booleans(), label="k_pool is v_pool") else pool_for(
        rng, (pages, heads), live, False)
    scale = data.draw(st.sampled_from([0.1, 1.0, 30.0]), label="q scale")
    q = bf16(rng, rows, heads * group, 128, scale=scale)
    check_attention_outputs(target, (q, k_pool, v_pool, table, ctx))


CHECKS = {"write": check_write, "step": check_step, "attention": check_attention}


class Pinned:
    """Stands in for hypothesis's ``data``: each labelled draw answered from ``values``."""

    def __init__(self, values: dict):
        self.values = values

    def draw(self, strategy, label: str):
        return self.values[label]


_STEP = {"num_blocks": 6, "requests": 2, "decode": True, "rows per request": 1, "perm": 0,
         "table edits": [], "one scale byte per token": True, "seed": 1,
         "q heads per kv head": 16, "e4m3 attention query": False, "k_pool is v_pool": False,
         "topk": 4, "init_blocks": 0, "local_blocks": 1}
REGRESSIONS = {
    # The README's decode step, shrunk, with q_round "none": select_blocks faulted on both
    # emulated backends (v_mad_u64_u32's low dword took the addend's never-written high dword
    # as undefined); Triton's index kernel (a bf16 query: gfx950 with q_round "none", gfx942)
    # met v_pk_lshlrev_b16 (unmodelled) at these two decode rows; a padding row (a request
    # of 0 tokens) next to a live one.
    "readme step": ("step", {**_STEP, "heads": 1, "seq_lens": [641, 0], "q": "bf16 none"}),
    # Two index heads (select_blocks faulted too), a duplicate and an out-of-range page id,
    # one pool as k_pool and v_pool (refused: "buffer 2 overlaps buffer 1").
    "two heads, one pool": ("step", {
        **_STEP, "heads": 2, "num_blocks": 4, "seq_lens": [300, 5], "q": "bf16 e4m3",
        "table edits": [(1, 0), (2, -1)], "one scale byte per token": False,
        "q heads per kv head": 4, "k_pool is v_pool": True, "topk": 2, "init_blocks": 1}),
    # Past the short writes' scan: Triton's claim kernel (buffer_wbl2, atomics, ds_permute,
    # v_mbcnt: all unmodelled).
    "write of 300 rows": ("write", {"T": 300, "heads (0: index pool)": 1, "seed": 3,
                                    "x scale": 1.0, "round_mode": "up"}),
    "index write of 257 rows": ("write", {"T": 257, "heads (0: index pool)": 0, "seed": 4,
                                          "x scale": 300.0, "round_mode": "even"}),
    # Rows of different contexts (a context-0 row next to a live one): Triton's gfx950
    # attention faulted ("the stored value v50 is undefined"), see the README's findings.
    "contexts 200 and 0": ("attention", {
        "rows": 2, "kv heads": 1, "page slots": 3, "q heads per kv head": 4,
        "page table": [0, 1, 2, 3, 4, 5], "contexts": [200, 0], "seed": 5,
        "k_pool is v_pool": False, "q scale": 1.0}),
}
"""The faults issue 43 reported, as fixed examples of the fuzz cases (each failed before its
fix on the targets it names in cdna_emulator/README.md's findings)."""


@pytest.mark.parametrize("case", list(REGRESSIONS))
def test_issue_43_regressions(target, case):
    check, values = REGRESSIONS[case]
    CHECKS[check](Pinned(values), target)


@pytest.mark.parametrize("check", list(CHECKS))
@QUICK
@given(data=st.data())
def test_emulated_fuzz(target, check, data):
    CHECKS[check](data, target)


@pytest.mark.fuzz
@pytest.mark.parametrize("check", list(CHECKS))
@LONG
@given(data=st.data())
def test_emulated_fuzz_long(target, check, data):
    CHECKS[check](data, target)
