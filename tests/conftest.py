"""Shared fixtures and case builders for the foundation test-suite.

Every operation is tested against the independent float64 oracle in ``tests/oracle.py``, for
both implementations: ``jm.reference`` (plain jnp) and the public ``jm`` functions (validated,
dispatched to the platform's backend).

Tests marked ``@pytest.mark.emulated`` also run their ``impl`` on the emulated ROCm backends
("emulated-gfx950", "emulated-gfx942"): the public functions, lowered as on an MI355X / MI300X
(FlyDSL and Triton code objects) and executed in the CDNA emulator, at the test's own sizes
(kept small: the emulator runs a small launch in a fraction of a second).

Compile time dominates the suite, so calls go through :func:`call`, which keeps one
``jax.jit`` per (implementation, function) and lets JAX's cache reuse compiled executables
across tests of the same shapes. Builders therefore use a few standard shapes.
"""

from __future__ import annotations

import functools
import math
import os
import sys
from dataclasses import dataclass

import jax
import ml_dtypes
import numpy as np
import oracle
import pytest
from installed import installed_package_problems

import jax_mxfp4 as jm

if os.environ.get("JAX_MXFP4_TEST_INSTALLED") == "1":  # make test (CI): the wheel, not sources
    import cdna_emulator
    import jax_mxfp4_tools

    _problems = installed_package_problems((jm, cdna_emulator, jax_mxfp4_tools), sys.path)
    assert not _problems, "make test must test the installed wheel: " + "; ".join(_problems)

BF16 = ml_dtypes.bfloat16
E4M3 = ml_dtypes.float8_e4m3fn
SM_SCALE = 128**-0.5

IMPLS = {"reference": jm.reference, "public": jm}
EMULATED = ("emulated-gfx950", "emulated-gfx942")
"""Backends an ``emulated``-marked test's ``impl`` also takes (the public functions under
``jm.backend_scope``)."""

# Static keyword arguments of each function (everything else is an array operand).
_STATIC = {
    "quantize_mxfp4": ("round_mode",),
    "dequantize_mxfp4": ("dtype",),
    "quantize_mxfp8": (),
    "dequantize_mxfp8": ("dtype",),
    "write_cache": ("round_mode",),
    "dequantize_pool": ("dtype",),
    "index_scores": ("num_blocks", "sm_scale", "q_round"),
    "select_blocks": ("topk", "init_blocks", "local_blocks"),
    "sparse_attention": ("sm_scale", "output"),
    "prefill_rows": ("num_rows",),
    "decode_rows": ("tokens_per_request",),
}


@functools.cache
def _jitted(impl_name: str, fn_name: str):
    fn = getattr(IMPLS[impl_name], fn_name)
    return jax.jit(fn, static_argnames=_STATIC[fn_name])


def call(impl_name: str, fn_name: str, *args, **kwargs):
    """``IMPLS[impl_name].<fn_name>(*args, **kwargs)`` under a cached ``jax.jit`` (for an
    emulated backend: ``jm.<fn_name>`` in its ``backend_scope``, which is part of the jit
    key); numpy results."""
    if impl_name in EMULATED:
        with jm.backend_scope(impl_name):
            out = _jitted("public", fn_name)(*args, **kwargs)
    else:
        out = _jitted(impl_name, fn_name)(*args, **kwargs)
    return jax.tree.map(np.asarray, out)


def _parametrizes_impl(metafunc) -> bool:
    """Whether the test chooses its own ``impl`` values (``@pytest.mark.parametrize``)."""
    for mark in metafunc.definition.iter_markers("parametrize"):
        names = mark.args[0]
        names = names.split(",") if isinstance(names, str) else names
        if "impl" in [n.strip() for n in names]:
            return True
    return False


def pytest_generate_tests(metafunc):
    """``impl``: "reference" and "public", plus the emulated backends for tests marked
    ``emulated``."""
    if "impl" in metafunc.fixturenames and not _parametrizes_impl(metafunc):
        names = list(IMPLS)
        if metafunc.definition.get_closest_marker("emulated"):
            names += list(EMULATED)
        metafunc.parametrize("impl", names, indirect=True)


def use_session_kernels(request, monkeypatch) -> None:
    """Let an emulated backend take the session's FlyDSL build as its code objects."""
    pytest.importorskip("triton")
    monkeypatch.setenv("JAX_MXFP4_KERNEL_DIR", str(request.getfixturevalue("built")[0]))


@pytest.fixture
def impl(request, monkeypatch) -> str:
    """Name of the implementation under test: "reference" (jm.reference), "public" (jm) or
    an emulated backend (jm on it, with the session's FlyDSL build as its code objects)."""
    if request.param in EMULATED:
        use_session_kernels(request, monkeypatch)
    return request.param


@pytest.fixture(params=["native", "generic"])
def isa(request, monkeypatch) -> str:
    """The CPU handlers' kernels: "native" (the SIMD ones where the CPU has them) or
    "generic" (the portable ones, ``JAX_MXFP4_CPU_ISA=generic``)."""
    if request.param == "generic":
        monkeypatch.setenv("JAX_MXFP4_CPU_ISA", "generic")
    else:
        monkeypatch.delenv("JAX_MXFP4_CPU_ISA", raising=False)
    return request.param


@pytest.fixture(params=("default", *EMULATED))
def backend(request, monkeypatch):
    """The public functions on this process's backend ("default") or on an emulated one, in
    scope for the whole test."""
    if request.param == "default":
        yield request.param
        return
    use_session_kernels(request, monkeypatch)
    with jm.backend_scope(request.param):
        yield request.param


@pytest.fixture
def rng(request) -> np.random.Generator:
    """A generator seeded from the test's name, so every test is reproducible on its own."""
    name = f"{request.node.module.__name__}::{request.node.name}"
    seed = int.from_bytes(name.encode(), "little") % (2**63)
    return np.random.default_rng(seed)


# ---------------------------------------------------------------------------------------------
# gfx950 FlyDSL kernels (test_flydsl_build.py, test_rocm_lowering.py)
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def built(tmp_path_factory):
    """``(out_dir, {symbol: CodeObject})`` of one build of every specialization."""
    from jax_mxfp4._src.flydsl.build import build_all

    out = tmp_path_factory.mktemp("gfx950-kernels")
    cache = tmp_path_factory.mktemp("kernel-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("JAX_MXFP4_CACHE_DIR", str(cache))
        mp.delenv("JAX_MXFP4_KERNEL_DIR", raising=False)
        objects = build_all("gfx950", out, progress=False)
    return out, {co.symbol: co for co in objects}


# ---------------------------------------------------------------------------------------------
# Pages
# ---------------------------------------------------------------------------------------------

GARBAGE_SCALES = np.array([0, 255, 0, 255, 1, 254, 127, 200], np.uint8)


def random_pages(rng, shape, scale_lo=120, scale_hi=130, per_token=False) -> np.ndarray:
    """uint8 pages ``[*shape, 8704]``: random e2m1 data, scale bytes in [scale_lo, scale_hi]
    (one byte per 32-block, or one per token when ``per_token``)."""
    pages = rng.integers(0, 256, (*shape, 8704), dtype=np.uint8)
    if per_token:
        s = rng.integers(scale_lo, scale_hi + 1, (*shape, 128, 1), dtype=np.uint8)
        s = np.repeat(s, 4, axis=-1)
    else:
        s = rng.integers(scale_lo, scale_hi + 1, (*shape, 128, 4), dtype=np.uint8)
    pages[..., 8192:] = s.reshape(*shape, 512)
    return pages


def garble(rng, pages: np.ndarray, token_start: int) -> None:
    """In place: tokens ``token_start..127`` of ``pages [..., 8704]`` become garbage (random
    data, scale bytes drawn from 0, 255 and a few others)."""
    if token_start >= 128:
        return
    lead = pages.shape[:-1]
    n = 128 - token_start
    pages[..., token_start * 64 : 8192] = rng.integers(0, 256, (*lead, n * 64), dtype=np.uint8)
    pages[..., 8192 + token_start * 4 :] = rng.choice(GARBAGE_SCALES, (*lead, n * 4))


def mxfp4_pages_from(codes_value_fn, scale_byte, shape) -> np.ndarray:
    """Pages whose every element has e2m1 code ``codes_value_fn`` (an int or a uint8 array
    [..., 128, 128] of codes) and scale byte ``scale_byte`` (int or array [..., 128, 4])."""
    codes = np.broadcast_to(np.asarray(codes_value_fn, np.uint8), (*shape, 128, 128))
    scales = np.broadcast_to(np.asarray(scale_byte, np.uint8), (*shape, 128, 4))
    pages = np.empty((*shape, 8704), np.uint8)
    pages[..., :8192] = oracle.pack(codes).reshape(*shape, 8192)
    pages[..., 8192:] = scales.reshape(*shape, 512)
    return pages


# ---------------------------------------------------------------------------------------------
# Index-scoring cases
# ---------------------------------------------------------------------------------------------


@dataclass
class IndexCase:
    q: np.ndarray  # bf16 | e4m3 [T, H, 128]
    pool: np.ndarray  # uint8 [P, 8704]
    block_table: np.ndarray  # int32 [B, W]
    positions: np.ndarray  # int32 [T]
    requests: np.ndarray  # int32 [T]
    num_blocks: int
    seq_lens: np.ndarray  # int32 [B]

    def args(self):
        return (self.q, self.pool, self.block_table, self.positions, self.requests)


def build_index_pool(rng, seq_lens, *, num_pages: int, table_width: int, scale_lo=120,
                     scale_hi=130, per_token=False, unused_ids=None):
    """An index pool and block table for requests of ``seq_lens`` tokens.

    Each request gets distinct random pages for its ``ceil(seq/128)`` blocks (at most
    ``table_width``); tokens at or past a request's end and the pages no request uses are
    garbage (scale bytes 0 and 255 included); table entries past a request's blocks point at
    random pages (they are past every row's reach), or at ids drawn from ``unused_ids`` when
    given (e.g. out-of-range ids).
    """
    seq_lens = np.asarray(seq_lens, np.int64)
    blocks = [min(math.ceil(s / 128), table_width) for s in seq_lens]
    assert sum(blocks) <= num_pages, (blocks, num_pages)
    pool = random_pages(rng, (num_pages,), scale_lo, scale_hi, per_token)
    perm = rng.permutation(num_pages)
    if unused_ids is None:
        table = rng.integers(0, num_pages, (len(seq_lens), table_width)).astype(np.int32)
    else:
        table = rng.choice(np.asarray(unused_ids), (len(seq_lens), table_width)).astype(np.int32)
    used = np.zeros(num_pages, bool)
    k = 0
    for b, nb in enumerate(blocks):
        for j in range(nb):
            page = perm[k]
            k += 1
            table[b, j] = page
            used[page] = True
            garble(rng, pool[page], int(min(max(seq_lens[b] - j * 128, 0), 128)))
    for page in np.flatnonzero(~used):
        garble(rng, pool[page], 0)
    return pool, table


def random_index_q(rng, num_rows, num_heads, q_dtype, scale=1.0) -> np.ndarray:
    q = rng.standard_normal((num_rows, num_heads, 128)) * scale
    if q_dtype == "e4m3":
        return oracle.to_e4m3(q)
    return oracle.to_bf16(q)


def widen_index_q(case: IndexCase) -> None:
    """Spread ``case``'s query over e4m3's whole range: every third element times ``2**-12``
    (e4m3 subnormals), every fifth times 300 (past 448, where e4m3 saturates). The one-row
    scorer's integer dots hold ``q * 2**9`` in three byte slices; ordinary queries leave the
    high slice's positive values unused."""
    x = np.asarray(case.q, np.float64).copy()
    x[..., ::3] *= 2.0**-12
    x[..., 1::5] *= 300.0
    case.q = oracle.to_e4m3(x) if str(case.q.dtype) == "float8_e4m3fn" else oracle.to_bf16(x)


def prefill_index_case(rng, q_lens, prefix_lens, *, num_rows=16, num_heads=2, num_blocks=4,
                       table_width=6, num_pages=12, q_dtype="bf16", q_scale=1.0,
                       **pool_kw) -> IndexCase:
    """A ragged prefill batch: request b has ``q_lens[b]`` query rows after
    ``prefix_lens[b]`` cached tokens; rows past the batch (up to ``num_rows``) are padding."""
    q_lens = np.asarray(q_lens, np.int64)
    prefix = np.asarray(prefix_lens, np.int64)
    cu = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    assert cu[-1] <= num_rows
    positions, requests = oracle.prefill_rows(cu, prefix, num_rows)
    seq = (prefix + q_lens).astype(np.int32)
    pool, table = build_index_pool(rng, seq, num_pages=num_pages, table_width=table_width,
                                   **pool_kw)
    q = random_index_q(rng, num_rows, num_heads, q_dtype, q_scale)
    return IndexCase(q, pool, table, positions, requests, num_blocks, seq)


def decode_index_case(rng, seq_lens, tokens_per_request, *, num_heads=2, num_blocks=4,
                      table_width=6, num_pages=12, q_dtype="bf16", q_scale=1.0,
                      **pool_kw) -> IndexCase:
    seq = np.asarray(seq_lens, np.int32)
    positions, requests = oracle.decode_rows(seq, tokens_per_request)
    pool, table = build_index_pool(rng, seq, num_pages=num_pages, table_width=table_width,
                                   **pool_kw)
    q = random_index_q(rng, len(positions), num_heads, q_dtype, q_scale)
    return IndexCase(q, pool, table, positions, requests, num_blocks, seq)


def ramp_index_keys(case: IndexCase) -> None:
    """Make every token's score grow with its position in its page, in place: token ``t`` of
    every page holds ``t + 1`` values of 1.0 (the rest 0.0, every scale byte 127) and every
    query element is 1.0, so each block's score is that of the last token a row may see. A
    token mask one token too wide or too narrow then changes the block's score for every row
    whose limit falls in the block (with random keys the boundary token is seldom the block's
    maximum, and such a mask error passes: issue 46's mutation runs). Scores are exact small
    integers times ``sm_scale``."""
    from jax_mxfp4._src.core.formats import PAGE_SCALE_OFFSET, PAGE_TOKENS, TOKEN_DATA_BYTES

    ones = np.arange(1, PAGE_TOKENS + 1)[:, None]  # values of 1.0 in token t: t + 1
    element = np.arange(2 * TOKEN_DATA_BYTES)[None, :]  # 128 nibbles, two a byte
    nibbles = np.where(element < ones, 0x2, 0x0).astype(np.uint8)  # e2m1 0x2 = 1.0
    data = nibbles[:, 0::2] | (nibbles[:, 1::2] << 4)
    case.pool[:, :PAGE_SCALE_OFFSET] = data.reshape(-1)
    case.pool[:, PAGE_SCALE_OFFSET:] = 127
    case.q[...] = 1


def ramp_index_case(tiling: str, heads: int, q_dtype: str = "bf16") -> IndexCase:
    """:func:`ramp_index_keys` over rows whose limits take every position of the first two
    pages (each buffer and lane group of both tilings sees every limit): prefill, one request
    of 272 rows from position 0 beside a request of 8; decode, 32 requests of 8 rows ending at
    8, 16, .., 256 tokens."""
    rng = np.random.default_rng(46)
    kw = dict(num_heads=heads, num_blocks=3, table_width=3, q_dtype=q_dtype)
    if tiling == "prefill":
        case = prefill_index_case(rng, [272, 8], [0, 300], num_rows=288, num_pages=6, **kw)
    else:
        seq = list(range(8, 257, 8))
        case = decode_index_case(rng, seq, 8, num_pages=2 * len(seq), **kw)
    ramp_index_keys(case)
    return case


def deep_scale_index_case(rng, layout: str) -> IndexCase:
    """An index case (one head, e4m3 queries; ``layout``: "prefill", "decode" with 8 rows per
    request, or "decode1" with 1) whose pages :func:`deepen_scale_groups` rewrites."""
    kw = dict(num_heads=1, num_blocks=5, table_width=6, num_pages=40, q_dtype="e4m3")
    if layout == "prefill":
        case = prefill_index_case(rng, [100, 3, 60], [10, 500, 0], num_rows=200, **kw)
    else:
        case = decode_index_case(rng, [600, 33, 128, 257], 8 if layout == "decode" else 1, **kw)
    deepen_scale_groups(rng, case)
    return case


def deepen_scale_groups(rng, case) -> None:
    """Scale group 3 of every page's tokens ``depth`` binades below groups 0-2 (one depth per
    page, up to 110), and group 1 of a fifth of the tokens all zero with byte 0; the even
    query rows keep only group 3 (so their scores come from the deep group alone). Every
    implementation must stay within the index score tolerance of the oracle (a lost band
    is the whole score of the rows that query only group 3): 110 binades keep the reference's
    token-normalized products above fp32's normal range."""
    pool = case.pool
    pages, tokens = pool.shape[0], 128
    top = rng.integers(170, 181, (pages, tokens))
    depth = rng.choice([0, 31, 32, 63, 64, 95, 96, 110], pages)
    scales = np.repeat(top[..., None], 4, axis=-1)
    scales[..., 3] = top - depth[:, None]
    zero = rng.random((pages, tokens)) < 0.2
    scales[..., 1][zero] = 0
    pool[:, 8192:] = scales.reshape(pages, 512).astype(np.uint8)
    data = pool[:, :8192].reshape(pages, tokens, 4, 16).copy()
    data[:, :, 1][zero] = 0
    pool[:, :8192] = data.reshape(pages, 8192)
    case.q[::2, :, :96] = 0


# ---------------------------------------------------------------------------------------------
# Sparse-attention cases
# ---------------------------------------------------------------------------------------------


@dataclass
class AttentionCase:
    q: np.ndarray  # bf16 | e4m3 [T, Hq, 128]
    k_pool: np.ndarray  # uint8 [P, Hkv, 8704]
    v_pool: np.ndarray
    page_table: np.ndarray  # int32 [T, Hkv, n]
    context_lens: np.ndarray  # int32 [T, Hkv]

    def args(self):
        return (self.q, self.k_pool, self.v_pool, self.page_table, self.context_lens)


def attention_case(rng, context_lens, *, group=4, n_pages=16, q_dtype="bf16", q_scale=1.0,
                   k_scales=(120, 126), v_scales=(120, 130), unused="mixed") -> AttentionCase:
    """Rows (t, h) with ``context_lens[t, h]`` tokens over distinct random pages.

    The tail of each row's last page is garbage (scale bytes 0/255), and page-table slots past
    a row's pages point (``unused``) at a page full of NaN scales ("poison"), at out-of-range
    ids ("oob"), at page 0 ("zero"), or a mix of the three ("mixed"); "extreme" mixes poison,
    -1, P + 3 and INT32_MAX.
    """
    ctx = np.asarray(context_lens, np.int32)
    num_rows, num_kv = ctx.shape
    num_pages = num_rows * n_pages + 1
    poison = num_pages - 1
    k_pool = random_pages(rng, (num_pages, num_kv), *k_scales)
    v_pool = random_pages(rng, (num_pages, num_kv), *v_scales)
    for pool in (k_pool, v_pool):
        pool[poison, :, 8192:] = 255
    table = np.zeros((num_rows, num_kv, n_pages), np.int32)
    perm = rng.permutation(num_pages - 1)
    for t in range(num_rows):
        pages = perm[t * n_pages : (t + 1) * n_pages]
        for h in range(num_kv):
            c = int(ctx[t, h])
            used = math.ceil(c / 128)
            table[t, h, :used] = pages[:used]
            if used:
                last = pages[used - 1]
                garble(rng, k_pool[last, h], c - (used - 1) * 128)
                garble(rng, v_pool[last, h], c - (used - 1) * 128)
            rest = n_pages - used
            if unused == "extreme":
                table[t, h, used:] = rng.choice([poison, -1, num_pages + 3, 2**31 - 1], rest)
                continue
            choices = {
                "poison": np.full(rest, poison),
                "oob": rng.choice([-1, -7, num_pages, num_pages + 5, 2**30], rest),
                "zero": np.zeros(rest),
                "mixed": rng.choice([poison, -1, num_pages + 3, 0], rest),
            }[unused]
            table[t, h, used:] = choices
    q = rng.standard_normal((num_rows, num_kv * group, 128)) * q_scale
    q = oracle.to_e4m3(q) if q_dtype == "e4m3" else oracle.to_bf16(q)
    return AttentionCase(q, k_pool, v_pool, table, ctx)


def non_finite_v(case: AttentionCase) -> None:
    """In place: the first token of the first page of row ``t`` (kv head 0) gets a NaN V block
    (scale byte 255) where ``t % 4`` is 0 or 3, and an infinite one (codes 6 * 2**127, past the
    bf16 range: SPEC §7 widens V to bf16 exactly) where ``t % 4`` is 1 or 3."""
    for t in range(case.page_table.shape[0]):
        page = case.page_table[t, 0, 0]
        if t % 4 in (0, 3):
            case.v_pool[page, 0, 8192 + 1] = 255
        if t % 4 in (1, 3):
            case.v_pool[page, 0, 32:48] = 0x77
            case.v_pool[page, 0, 8192 + 2] = 254


def large_value_case(rng, context_lens, *, group=4, n_pages=16) -> AttentionCase:
    """SPEC §7 "PV range": every live V element is +-2**127 or +-1.5 * 2**127 (scale bytes
    253/254, the largest finite bf16-exact MXFP4 values), so the output (a weighted mean of V)
    is finite (about 2e38) but an unnormalized fp32 sum of P.V over two tokens overflows."""
    case = attention_case(rng, context_lens, group=group, n_pages=n_pages, k_scales=(122, 126))
    num_rows, num_kv = case.context_lens.shape
    for t in range(num_rows):
        for h in range(num_kv):
            for page in case.page_table[t, h, : math.ceil(case.context_lens[t, h] / 128)]:
                big = rng.random((128, 4)) < 0.5  # byte 254: codes 1.0/1.5; 253: 2.0/3.0
                mags = np.where(np.repeat(big, 32, axis=1), rng.integers(2, 4, (128, 128)),
                                rng.integers(4, 6, (128, 128)))
                codes = mags | ((np.arange(128) % 2) << 3)  # one sign per dim: no cancelling
                case.v_pool[page, h] = mxfp4_pages_from(codes.astype(np.uint8),
                                                        np.where(big, 254, 253), ())
    return case
