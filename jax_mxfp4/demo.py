"""``python -m jax_mxfp4 demo``: one MiniMax-M3.1 sparse-attention layer, end to end.

The demo builds the attention layer of one tensor-parallel rank (TP4: 16 q heads, 1 kv head,
1 index head, head dim 128, 128-token pages, top-16 blocks, ``sm_scale = 128**-0.5``) with random
weights, and serves a few requests through the public API only:

* chunked prefill (a token budget per step, several requests per step), then
* a few decode steps (one token per request per step),

each step one ``jax.jit``-compiled function with the three MXFP4 pools donated:
projections -> RMSNorm + partial RoPE -> ``write_cache`` (K, V, index K) -> ``index_scores`` ->
``select_blocks`` -> ``sparse_attention``.

It then prints what MXFP4 buys (cache bytes per token), what it costs in accuracy (against dense
causal attention over the unquantized bf16 K/V, with the error split into the part that comes from
block selection and the part that comes from MXFP4 quantization), and how long the steps take.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import re
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import jax_mxfp4 as jm

# --- the layer (per rank, MiniMax-M3.1 at TP4; SPEC §0) -------------------------------------------

NUM_Q_HEADS = 16
NUM_KV_HEADS = 1
NUM_INDEX_HEADS = 1  # index head h drives kv head h
HEAD_DIM = 128
ROTARY_DIM = 64  # partial rotary factor 0.5, NeoX style
ROPE_THETA = 10000.0
PAGE = 128
TOPK = 16
SM_SCALE = HEAD_DIM**-0.5
DENSE_LIMIT = TOPK * PAGE  # contexts up to this many tokens are attended in full

DEFAULT_PREFILL_LENS = (1500, 2500, 700)
GIB = 1 << 30


@dataclasses.dataclass(frozen=True)
class DemoConfig:
    """What the demo runs. ``prefill_lens`` has one entry per request."""

    prefill_lens: tuple[int, ...] = DEFAULT_PREFILL_LENS
    decode_steps: int = 4
    prefill_chunk: int = 2048
    hidden: int = 1024
    seed: int = 0
    eval_rows: int = 128

    def __post_init__(self):
        if not self.prefill_lens or min(self.prefill_lens) < 1:
            raise ValueError(f"every prefill length must be >= 1, got {self.prefill_lens}")
        if self.decode_steps < 1:
            raise ValueError(f"decode_steps must be >= 1, got {self.decode_steps}")
        if self.prefill_chunk < 1:
            raise ValueError(f"prefill_chunk must be >= 1, got {self.prefill_chunk}")
        if self.hidden < 1:
            raise ValueError(f"hidden must be >= 1, got {self.hidden}")
        if self.eval_rows < 1:
            raise ValueError(f"eval_rows must be >= 1, got {self.eval_rows}")

    @property
    def num_requests(self) -> int:
        return len(self.prefill_lens)


# --- weights and the layer's math around the MXFP4 operations -------------------------------------

_PROJ_SPLITS = (
    NUM_Q_HEADS * HEAD_DIM,  # q
    NUM_KV_HEADS * HEAD_DIM,  # k
    NUM_KV_HEADS * HEAD_DIM,  # v
    NUM_INDEX_HEADS * HEAD_DIM,  # index q
    HEAD_DIM,  # index k (one shared index-K head)
)


def init_params(key: jax.Array, hidden: int) -> dict[str, jax.Array]:
    """Random bf16 weights: one fused [hidden, q|k|v|index q|index k] projection."""
    width = sum(_PROJ_SPLITS)
    w = jax.random.normal(key, (hidden, width), jnp.float32) * hidden**-0.5
    return {"w_qkv_idx": w.astype(jnp.bfloat16)}


def _rms_norm(x: jax.Array, eps: float = 1e-6) -> jax.Array:
    x = x.astype(jnp.float32)
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps)


def _rope(x: jax.Array, positions: jax.Array) -> jax.Array:
    """NeoX-style rotary embedding on the first ROTARY_DIM dims of ``x[T, heads, D]``."""
    half = ROTARY_DIM // 2
    inv_freq = ROPE_THETA ** (-jnp.arange(half, dtype=jnp.float32) / half)
    angle = jnp.maximum(positions, 0).astype(jnp.float32)[:, None] * inv_freq[None, :]
    cos, sin = jnp.cos(angle)[:, None, :], jnp.sin(angle)[:, None, :]
    x1, x2, rest = x[..., :half], x[..., half:ROTARY_DIM], x[..., ROTARY_DIM:]
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest], axis=-1)


def project(params, x: jax.Array, positions: jax.Array):
    """Hidden states ``x[T, hidden]`` -> bf16 q, k, v, index q, index k (normed and roped)."""
    y = jnp.dot(x, params["w_qkv_idx"], preferred_element_type=jnp.float32)
    cuts = np.cumsum(_PROJ_SPLITS)[:-1].tolist()
    q, k, v, iq, ik = jnp.split(y, cuts, axis=-1)
    t = x.shape[0]
    q = _rope(_rms_norm(q.reshape(t, NUM_Q_HEADS, HEAD_DIM)), positions)
    k = _rope(_rms_norm(k.reshape(t, NUM_KV_HEADS, HEAD_DIM)), positions)
    v = v.reshape(t, NUM_KV_HEADS, HEAD_DIM)
    iq = _rope(_rms_norm(iq.reshape(t, NUM_INDEX_HEADS, HEAD_DIM)), positions)
    ik = _rope(_rms_norm(ik.reshape(t, 1, HEAD_DIM)), positions)[:, 0]
    bf = jnp.bfloat16
    return q.astype(bf), k.astype(bf), v.astype(bf), iq.astype(bf), ik.astype(bf)


def _slots(block_table: jax.Array, positions: jax.Array, requests: jax.Array) -> jax.Array:
    """Cache slot (page * 128 + offset) of each row; -1 (not written) for padding rows."""
    blocks = jnp.clip(positions // PAGE, 0, block_table.shape[1] - 1)
    pages = block_table[requests, blocks]
    return jnp.where(positions >= 0, pages * PAGE + positions % PAGE, -1).astype(jnp.int32)


def _layer(params, k_pool, v_pool, index_pool, x, positions, requests, block_table, num_blocks):
    """The sparse-attention layer on query rows with the given positions/requests."""
    q, k, v, iq, ik = project(params, x, positions)
    slots = _slots(block_table, positions, requests)
    k_pool = jm.write_cache(k_pool, k, slots)
    v_pool = jm.write_cache(v_pool, v, slots)
    index_pool = jm.write_cache(index_pool, ik, slots)
    scores = jm.index_scores(
        iq, index_pool, block_table, positions, requests, num_blocks=num_blocks, sm_scale=SM_SCALE
    )
    sel = jm.select_blocks(scores, block_table, positions, requests, topk=TOPK)
    out = jm.sparse_attention(
        q, k_pool, v_pool, sel.page_table, sel.context_lens, sm_scale=SM_SCALE
    )
    # q, k, v and the selected blocks come back too, only so the demo can check the accuracy.
    extras = {"q": q, "k": k[:, 0], "v": v[:, 0], "block_ids": sel.block_ids[0]}
    return (k_pool, v_pool, index_pool), out, extras


def make_step_functions(num_rows: int, num_blocks: int):
    """The two jitted steps; pools (arguments 1-3) are donated and updated in place."""

    def prefill_step(params, k_pool, v_pool, index_pool, x, cu_seqlens_q, prefix_lens, block_table):
        positions, requests = jm.prefill_rows(cu_seqlens_q, prefix_lens, num_rows)
        return _layer(
            params, k_pool, v_pool, index_pool, x, positions, requests, block_table, num_blocks
        )

    def decode_step(params, k_pool, v_pool, index_pool, x, seq_lens, block_table):
        positions, requests = jm.decode_rows(seq_lens, 1)
        return _layer(
            params, k_pool, v_pool, index_pool, x, positions, requests, block_table, num_blocks
        )

    donate = (1, 2, 3)
    return (
        jax.jit(prefill_step, donate_argnums=donate),
        jax.jit(decode_step, donate_argnums=donate),
    )


# --- serving loop ---------------------------------------------------------------------------------


def schedule_prefill(lens: Sequence[int], budget: int) -> list[tuple[list[int], list[int]]]:
    """Chunked prefill: each step takes up to ``budget`` tokens, requests in order.

    Returns one ``(prefix_lens, q_lens)`` pair per step.
    """
    done = [0] * len(lens)
    steps = []
    while any(d < n for d, n in zip(done, lens, strict=True)):
        left = budget
        q_lens = []
        for b, n in enumerate(lens):
            take = min(n - done[b], left)
            q_lens.append(take)
            left -= take
        steps.append((list(done), q_lens))
        done = [d + q for d, q in zip(done, q_lens, strict=True)]
    return steps


@dataclasses.dataclass
class _RequestLog:
    """What one request saw, token by token (host copies, for the accuracy check)."""

    q: np.ndarray  # float32 [L, Hq, D] (bf16 values)
    k: np.ndarray  # float32 [L, D]
    v: np.ndarray  # float32 [L, D]
    out: np.ndarray  # float32 [L, Hq, D] (bf16 values): the MXFP4 sparse attention output
    block_ids: np.ndarray  # int32 [L, topk]
    decode_from: int  # positions >= decode_from were decode steps


def _host(x) -> np.ndarray:
    return np.asarray(jax.device_get(x)).astype(np.float32)


def _record(logs, positions, requests, extras, out) -> None:
    q, k, v = _host(extras["q"]), _host(extras["k"]), _host(extras["v"])
    ids = np.asarray(extras["block_ids"])
    out = _host(out)
    for row, (p, b) in enumerate(zip(positions, requests, strict=True)):
        if p < 0:
            continue
        log = logs[b]
        log.q[p], log.k[p], log.v[p], log.out[p], log.block_ids[p] = (
            q[row], k[row], v[row], out[row], ids[row]
        )


def _timed(fn: Callable[..., Any], *args) -> tuple[Any, float]:
    """``fn(*args)`` and its wall time, results ready."""
    t0 = time.perf_counter()
    result = fn(*args)
    jax.block_until_ready(result)
    return result, time.perf_counter() - t0


def _compile(jitted, *args) -> tuple[Any, float, int]:
    """Compile ``jitted`` for ``args``: the executable, seconds, and how many of its outputs
    alias (reuse the buffers of) donated inputs, read from the compiled HLO."""
    exe, seconds = _timed(lambda: jitted.lower(*args).compile())
    text = exe.as_text() or ""
    start = text.find("input_output_alias={")
    aliased = 0
    if start >= 0:
        line = text[start : text.find("\n", start)]
        line = line.split("entry_computation_layout")[0]
        aliased = len(re.findall(r"\{[0-9, ]*\}: \(", line))
    return exe, seconds, aliased


@dataclasses.dataclass
class DemoResult:
    config: DemoConfig
    num_pages: int
    num_blocks: int
    prefill_rows: int
    backend: str
    compile_s: dict[str, float]
    aliased: dict[str, int]
    prefill_step_s: list[float]
    decode_step_s: list[float]
    prefill_tokens: list[int]
    accuracy: list[dict[str, Any]]
    sparse_rows: dict[str, tuple[int, int]]
    total_s: float = 0.0


def _backend_name() -> str:
    for name in ("get_backend", "backend"):
        fn = getattr(jm, name, None)
        if callable(fn):
            try:
                return str(fn())
            except Exception:  # pragma: no cover - informational only
                break
    return "default"


def run_demo(config: DemoConfig, log: Callable[[str], None] | None = None) -> DemoResult:
    """Serve the requests of ``config``; returns timings and accuracy (see ``format_report``)."""
    if log is None:
        log = _stderr_log
    t_start = time.perf_counter()
    lens = list(config.prefill_lens)
    steps = config.decode_steps
    total = [n + steps for n in lens]
    rng = np.random.default_rng(config.seed)

    # Paged cache: pages handed out in a shuffled order; page 0 is never used (a null page).
    pages_per_request = [math.ceil(n / PAGE) for n in total]
    num_blocks = max(pages_per_request)
    num_pages = 1 + sum(pages_per_request)
    free = list(rng.permutation(np.arange(1, num_pages)))
    block_table = np.zeros((len(lens), num_blocks), np.int32)
    for b, n in enumerate(pages_per_request):
        block_table[b, :n] = [free.pop() for _ in range(n)]

    log(
        f"layer: hidden {config.hidden}, {NUM_Q_HEADS} q heads, {NUM_KV_HEADS} kv head, "
        f"{NUM_INDEX_HEADS} index head, head dim {HEAD_DIM}, top-{TOPK} of {PAGE}-token blocks; "
        f"{len(lens)} requests, prefill {lens}, {steps} decode steps; "
        f"pools 3 x {num_pages} pages; backend {_backend_name()}"
    )
    params = init_params(jax.random.key(config.seed), config.hidden)
    hidden_states = [
        jnp.asarray(rng.standard_normal((n, config.hidden), np.float32), jnp.bfloat16)
        for n in total
    ]
    k_pool = jm.new_pool(num_pages, NUM_KV_HEADS)
    v_pool = jm.new_pool(num_pages, NUM_KV_HEADS)
    index_pool = jm.new_pool(num_pages)
    block_table_dev = jnp.asarray(block_table)

    schedule = schedule_prefill(lens, config.prefill_chunk)
    num_rows = min(config.prefill_chunk, sum(lens))
    prefill_step, decode_step = make_step_functions(num_rows, num_blocks)

    logs = [
        _RequestLog(
            q=np.zeros((n, NUM_Q_HEADS, HEAD_DIM), np.float32),
            k=np.zeros((n, HEAD_DIM), np.float32),
            v=np.zeros((n, HEAD_DIM), np.float32),
            out=np.zeros((n, NUM_Q_HEADS, HEAD_DIM), np.float32),
            block_ids=np.full((n, TOPK), -1, np.int32),
            decode_from=lens[b],
        )
        for b, n in enumerate(total)
    ]

    def prefill_inputs(prefix, q_lens):
        parts = [
            hidden_states[b][p : p + q]
            for b, (p, q) in enumerate(zip(prefix, q_lens, strict=True))
        ]
        x = jnp.concatenate(parts, axis=0)
        x = jnp.pad(x, ((0, num_rows - x.shape[0]), (0, 0)))
        cu = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
        return x, jnp.asarray(cu), jnp.asarray(prefix, jnp.int32)

    compile_s, aliased = {}, {}
    x0, cu0, pre0 = prefill_inputs(*schedule[0])
    log(f"compiling the prefill step ({num_rows} rows, {num_blocks} blocks per request)...")
    prefill_exe, compile_s["prefill"], aliased["prefill"] = _compile(
        prefill_step, params, k_pool, v_pool, index_pool, x0, cu0, pre0, block_table_dev
    )
    log(f"  compiled in {compile_s['prefill']:.2f} s")

    prefill_times, prefill_tokens = [], []
    for i, (prefix, q_lens) in enumerate(schedule):
        x, cu, pre = prefill_inputs(prefix, q_lens)
        (pools, out, extras), dt = _timed(
            prefill_exe, params, k_pool, v_pool, index_pool, x, cu, pre, block_table_dev
        )
        k_pool, v_pool, index_pool = pools
        prefill_times.append(dt)
        prefill_tokens.append(sum(q_lens))
        log(f"prefill step {i + 1}/{len(schedule)}: {sum(q_lens)} tokens {q_lens}, "
            f"{dt * 1e3:.0f} ms")
        positions = np.full(num_rows, -1, np.int64)
        requests = np.zeros(num_rows, np.int64)
        row = 0
        for b, (p, q) in enumerate(zip(prefix, q_lens, strict=True)):
            positions[row : row + q] = np.arange(p, p + q)
            requests[row : row + q] = b
            row += q
        _record(logs, positions, requests, extras, out)

    seq_lens = np.array(lens, np.int32)
    decode_times = []
    decode_exe = None
    for i in range(steps):
        seq_lens = seq_lens + 1
        x = jnp.stack([hidden_states[b][seq_lens[b] - 1] for b in range(len(lens))])
        seq_dev = jnp.asarray(seq_lens)
        if decode_exe is None:
            log(f"compiling the decode step ({len(lens)} rows)...")
            decode_exe, compile_s["decode"], aliased["decode"] = _compile(
                decode_step, params, k_pool, v_pool, index_pool, x, seq_dev, block_table_dev
            )
            log(f"  compiled in {compile_s['decode']:.2f} s")
        (pools, out, extras), dt = _timed(
            decode_exe, params, k_pool, v_pool, index_pool, x, seq_dev, block_table_dev
        )
        k_pool, v_pool, index_pool = pools
        decode_times.append(dt)
        log(f"decode step {i + 1}/{steps}: {len(lens)} tokens, {dt * 1e3:.1f} ms")
        _record(logs, seq_lens - 1, np.arange(len(lens)), extras, out)

    log("checking accuracy against dense attention over the unquantized K/V...")
    accuracy, sparse_rows = evaluate(logs, num_blocks, config.eval_rows, rng)
    result = DemoResult(
        config=config,
        num_pages=num_pages,
        num_blocks=num_blocks,
        prefill_rows=num_rows,
        backend=_backend_name(),
        compile_s=compile_s,
        aliased=aliased,
        prefill_step_s=prefill_times,
        decode_step_s=decode_times,
        prefill_tokens=prefill_tokens,
        accuracy=accuracy,
        sparse_rows=sparse_rows,
    )
    result.total_s = time.perf_counter() - t_start
    log(f"done in {result.total_s:.1f} s")
    return result


# --- accuracy -------------------------------------------------------------------------------------

_EVAL_CHUNK = 64  # query rows per reference call (one compiled shape)


@jax.jit
def _reference_attention(q, k, v, positions, allowed_blocks):
    """Dense causal attention, fp32 math, for query rows ``q[R, Hq, D]`` of one request.

    Returns ``(dense, selected, dense_fp8)``: full causal attention over ``k, v [L, D]``; the same
    restricted to the blocks in ``allowed_blocks[R, NB]`` (the sparse selection, unquantized); and
    full attention over K/V rounded to fp8 e4m3 (unit scale), for scale.
    """
    length = k.shape[0]
    t = jnp.arange(length)
    causal = t[None, :] <= positions[:, None]
    selected = causal & jnp.take(allowed_blocks, t // PAGE, axis=1)

    def attend(kk, vv, mask):
        s = jnp.einsum("rhd,ld->rhl", q, kk, precision="highest") * SM_SCALE
        s = jnp.where(mask[:, None, :], s, -jnp.inf)
        m = jnp.max(s, axis=-1, keepdims=True)
        p = jnp.exp(s - jnp.where(jnp.isfinite(m), m, 0.0))
        p = p / jnp.maximum(jnp.sum(p, axis=-1, keepdims=True), 1e-30)
        return jnp.einsum("rhl,ld->rhd", p, vv, precision="highest")

    def fp8(x):
        return jnp.clip(x, -448, 448).astype(jnp.float8_e4m3fn).astype(jnp.float32)

    return attend(k, v, causal), attend(k, v, selected), attend(fp8(k), fp8(v), causal)


def _eval_positions(log: _RequestLog, n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Prefill rows to check (up to ``n`` per request and context class); all decode rows."""
    prefill = np.arange(log.decode_from)
    picked = []
    for part in (prefill[prefill < DENSE_LIMIT], prefill[prefill >= DENSE_LIMIT]):
        if part.size > n:
            part = np.sort(rng.choice(part, n, replace=False))
        picked.append(part)
    return {
        "prefill": np.concatenate(picked),
        "decode": np.arange(log.decode_from, log.q.shape[0]),
    }


class _Stats:
    """Accumulates relative L2 error and cosine similarity of ``a`` against ``ref``."""

    def __init__(self):
        self.err2 = self.ref2 = self.a2 = self.dot = 0.0
        self.min_cos = 1.0

    def add(self, a: np.ndarray, ref: np.ndarray) -> None:
        a, ref = a.astype(np.float64), ref.astype(np.float64)
        self.err2 += float(np.sum((a - ref) ** 2))
        self.ref2 += float(np.sum(ref**2))
        self.a2 += float(np.sum(a**2))
        self.dot += float(np.sum(a * ref))
        rows_dot = np.sum(a * ref, axis=-1)
        rows_norm = np.linalg.norm(a, axis=-1) * np.linalg.norm(ref, axis=-1)
        ok = rows_norm > 0
        if ok.any():
            self.min_cos = min(self.min_cos, float(np.min(rows_dot[ok] / rows_norm[ok])))

    def summary(self) -> dict[str, float]:
        rel = math.sqrt(self.err2 / self.ref2) if self.ref2 else float("nan")
        denom = math.sqrt(self.a2 * self.ref2)
        return {"rel_l2": rel, "cos": self.dot / denom if denom else float("nan"),
                "min_cos": self.min_cos}


COMPARISONS = (
    # key, column title; every comparison is "this output vs that reference"
    ("total", "MXFP4 sparse"),  # the layer's output vs dense
    ("selection", "selection only"),  # fp32 attention over the selected blocks vs dense
    ("quantization", "MXFP4 only"),  # the layer's output vs fp32 over the selected blocks
    ("fp8", "fp8 KV dense"),  # dense attention over fp8 e4m3 K/V vs dense, for scale
)


def evaluate(logs: Sequence[_RequestLog], num_blocks: int, eval_rows: int, rng):
    """Accuracy of the recorded outputs per (phase, context class)."""
    groups: dict[tuple[str, str], dict[str, _Stats]] = {}
    counts: dict[tuple[str, str], int] = {}
    sparse_rows = {"prefill": [0, 0], "decode": [0, 0]}
    length = num_blocks * PAGE
    for log in logs:
        n = log.q.shape[0]
        k = np.zeros((length, HEAD_DIM), np.float32)
        v = np.zeros((length, HEAD_DIM), np.float32)
        k[:n], v[:n] = log.k, log.v
        k_dev, v_dev = jnp.asarray(k), jnp.asarray(v)
        for phase, pos in _eval_positions(log, eval_rows, rng).items():
            ctx = pos + 1
            sparse_rows[phase][0] += int(np.sum(ctx > DENSE_LIMIT))
            sparse_rows[phase][1] += pos.size
            for start in range(0, pos.size, _EVAL_CHUNK):
                p = pos[start : start + _EVAL_CHUNK]
                pad = _EVAL_CHUNK - p.size
                p_pad = np.pad(p, (0, pad), constant_values=0)
                allowed = np.zeros((_EVAL_CHUNK, num_blocks), bool)
                ids = log.block_ids[p_pad]
                rows = np.nonzero(ids >= 0)
                allowed[rows[0], ids[rows]] = True
                dense, selected, dense_fp8 = jax.device_get(
                    _reference_attention(
                        jnp.asarray(log.q[p_pad]), k_dev, v_dev, jnp.asarray(p_pad),
                        jnp.asarray(allowed)
                    )
                )
                live = slice(0, p.size)
                out = log.out[p]
                for sparse in (False, True):
                    m = (p + 1 > DENSE_LIMIT) == sparse
                    if not m.any():
                        continue
                    key = (phase, "> 2048" if sparse else "<= 2048")
                    stats = groups.setdefault(key, {c: _Stats() for c, _ in COMPARISONS})
                    counts[key] = counts.get(key, 0) + int(m.sum())
                    d, s = dense[live][m], selected[live][m]
                    stats["total"].add(out[m], d)
                    stats["selection"].add(s, d)
                    stats["quantization"].add(out[m], s)
                    stats["fp8"].add(dense_fp8[live][m], d)
    order = [(ph, c) for ph in ("prefill", "decode") for c in ("<= 2048", "> 2048")]
    accuracy = [
        {"phase": ph, "context": c, "rows": counts[(ph, c)],
         **{name: groups[(ph, c)][name].summary() for name, _ in COMPARISONS}}
        for ph, c in order
        if (ph, c) in groups
    ]
    return accuracy, {k: (a, b) for k, (a, b) in sparse_rows.items()}


# --- report ---------------------------------------------------------------------------------------


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[bool]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(cells):
        return "  ".join(
            c.rjust(w) if r else c.ljust(w) for c, w, r in zip(cells, widths, right, strict=True)
        ).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(header), rule, *(line(r) for r in rows)])


CACHE_FORMATS = (
    # name, K+V bytes per token per kv head, index-K bytes per token
    ("MXFP4 (this)", 2 * (HEAD_DIM // 2 + HEAD_DIM // 32), HEAD_DIM // 2 + HEAD_DIM // 32),
    ("fp8 e4m3", 2 * HEAD_DIM, HEAD_DIM),
    ("bf16", 2 * 2 * HEAD_DIM, 2 * HEAD_DIM),
)


def cache_table() -> str:
    rows = []
    bf16_total = sum(CACHE_FORMATS[-1][1:])
    for name, kv, idx in CACHE_FORMATS:
        total = kv + idx
        rows.append([name, str(kv), str(idx), str(total), f"{GIB // total:,}",
                     f"{bf16_total / total:.2f}x"])
    return _table(
        ["cache format", "K+V B/token", "index B/token", "total B/token", "tokens/GiB",
         "vs bf16"],
        rows,
        [False, True, True, True, True, True],
    )


def accuracy_table(accuracy: Sequence[dict[str, Any]]) -> str:
    rows = []
    for a in accuracy:
        cells = [a["phase"], a["context"], str(a["rows"])]
        cells += [f"{a[name]['rel_l2']:.4f} / {a[name]['cos']:.4f}" for name, _ in COMPARISONS]
        cells.append(f"{a['total']['min_cos']:.4f}")
        rows.append(cells)
    header = ["phase", "context", "rows", *(title for _, title in COMPARISONS), "worst cos"]
    return _table(header, rows, [False, False, True, True, True, True, True, True])


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def timing_table(result: DemoResult) -> str:
    pre, dec = result.prefill_step_s, result.decode_step_s
    tokens = sum(result.prefill_tokens)
    rows = [
        ["compile prefill step", f"{result.compile_s['prefill']:.2f} s", "once"],
        ["compile decode step", f"{result.compile_s['decode']:.2f} s", "once"],
        ["prefill step", f"{float(np.median(pre)) * 1e3:.1f} ms",
         f"median of {_plural(len(pre), 'step')} of {result.prefill_rows} rows "
         f"({tokens / sum(pre):,.0f} tokens/s)"],
        ["decode step", f"{float(np.median(dec)) * 1e3:.2f} ms",
         f"median of {_plural(len(dec), 'step')} of {result.config.num_requests} rows "
         "(1 token per request)"],
    ]
    return _table(["step", "time", "note"], rows, [False, True, False])


def format_report(result: DemoResult) -> str:
    cfg = result.config
    sp, sd = result.sparse_rows["prefill"], result.sparse_rows["decode"]
    pool_bytes = 3 * result.num_pages * jm.PAGE_BYTES
    in_place = ", ".join(f"{k} {v}/3" for k, v in result.aliased.items())
    parts = [
        "jax_mxfp4 demo: one MiniMax-M3.1 sparse-attention layer of one rank at TP4, "
        "random weights",
        f"  {NUM_Q_HEADS} q heads, {NUM_KV_HEADS} kv head, {NUM_INDEX_HEADS} index head, "
        f"head dim {HEAD_DIM}, top-{TOPK} blocks of {PAGE} tokens,",
        f"  sm_scale 128**-0.5, hidden {cfg.hidden}, seed {cfg.seed}",
        f"  {cfg.num_requests} requests, prefill {list(cfg.prefill_lens)} tokens in steps of "
        f"{result.prefill_rows} rows, then {cfg.decode_steps} decode steps",
        f"  jax {jax.__version__} on {jax.devices()[0].platform}, jax_mxfp4 backend "
        f"{result.backend}",
        "",
        "1. Cache per token per kv head, one layer (K and V pages + the shared index-K page)",
        cache_table(),
        f"   this run: K, V and index pools of {result.num_pages} pages x {jm.PAGE_BYTES} B = "
        f"{pool_bytes / 2**20:.2f} MiB for {result.num_pages * PAGE:,} token slots,",
        f"   updated in place (pool outputs aliased to donated inputs: {in_place})",
        "",
        "2. Accuracy of the attention output: relative L2 error / cosine similarity",
        accuracy_table(result.accuracy),
        "   dense          = causal attention, fp32 math, over every token's bf16 q/k/v",
        "   MXFP4 sparse   = the layer's output (MXFP4 K/V, top-16 blocks) vs dense",
        "   selection only = fp32 attention over the selected blocks (bf16 K/V) vs dense",
        "   MXFP4 only     = the layer's output vs fp32 attention over the same blocks (MXFP4 K/V",
        "                    and the kernel's e4m3 rounding of q)",
        "   fp8 KV dense   = dense attention over e4m3 K/V vs dense, for scale",
        "   worst cos      = the lowest cosine of one (row, q head) for MXFP4 sparse",
        f"   Rows with context > {DENSE_LIMIT} tokens are genuinely sparse (checked here: "
        f"prefill {sp[0]} of {sp[1]},",
        f"   decode {sd[0]} of {sd[1]}); the others attend to every token of their context.",
        "   With random weights the attention is flat and the index head knows nothing about",
        "   it, so the selection error here is pessimistic (a trained indexer is meant to pick",
        "   the blocks that carry the attention).",
        "",
        "3. Step time (compile excluded)",
        timing_table(result),
    ]
    return "\n".join(parts)


# --- command line ---------------------------------------------------------------------------------


def _stderr_log(msg: str) -> None:
    print(f"[demo] {msg}", file=sys.stderr, flush=True)


def _int_list(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.replace(",", " ").split())
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from e
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


_DEFAULT_LENS = ",".join(map(str, DEFAULT_PREFILL_LENS))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    lens = parser.add_mutually_exclusive_group()
    lens.add_argument(
        "--prefill-lens", type=_int_list, metavar="N,N,...",
        help=f"prefill tokens per request (default: {_DEFAULT_LENS}, cycled to --requests)",
    )
    lens.add_argument("--context", type=int, metavar="N",
                      help="give every request a prefill of N tokens")
    parser.add_argument("--requests", type=int, metavar="B",
                        help="number of requests (default: 3, or len(--prefill-lens))")
    parser.add_argument("--decode-steps", type=int, default=4, metavar="S",
                        help="decode steps after the prefill (default: 4)")
    parser.add_argument("--prefill-chunk", type=int, default=2048, metavar="T",
                        help="tokens per prefill step (chunked prefill; default: 2048)")
    parser.add_argument("--hidden", type=int, default=1024, help="hidden size (default: 1024)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    parser.add_argument("--eval-rows", type=int, default=128, metavar="N",
                        help="prefill rows checked per request and context class (default: 128)")


def config_from_args(args: argparse.Namespace) -> DemoConfig:
    if args.prefill_lens is not None:
        lens = args.prefill_lens
        if args.requests is not None and args.requests != len(lens):
            raise ValueError(
                f"--requests {args.requests} does not match {len(lens)} --prefill-lens values"
            )
    else:
        count = 3 if args.requests is None else args.requests
        if count < 1:
            raise ValueError(f"--requests must be >= 1, got {count}")
        if args.context is not None:
            lens = (args.context,) * count
        else:
            lens = tuple(DEFAULT_PREFILL_LENS[i % len(DEFAULT_PREFILL_LENS)] for i in range(count))
    return DemoConfig(
        prefill_lens=tuple(lens),
        decode_steps=args.decode_steps,
        prefill_chunk=args.prefill_chunk,
        hidden=args.hidden,
        seed=args.seed,
        eval_rows=args.eval_rows,
    )


def run_from_args(args: argparse.Namespace) -> int:
    try:
        config = config_from_args(args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(format_report(run_demo(config)))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m jax_mxfp4 demo [options]`` without the ``demo``."""
    parser = argparse.ArgumentParser(prog="python -m jax_mxfp4 demo", description=__doc__)
    add_arguments(parser)
    return run_from_args(parser.parse_args(argv))
