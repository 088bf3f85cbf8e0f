"""``python -m jax_mxfp4 bench --device gpu --step``: one MiniMax-M3.1 attention decode step
per rank, the MXFP4 sparse path against what a user would run instead, in the same run.

Per rank (TP4): 16 q heads, 1 kv head, 1 index head, head dim 128, top-16 blocks of 128
tokens. ``B`` requests of ``C`` cached tokens each decode one token per step:

* **mxfp4 sparse**: write K, V and index K (MXFP4 pages, pools donated), score every block
  (``index_scores``), select the top 16 (``select_blocks``), attend over them
  (``sparse_attention``, fused MXFP8 output);
* **dense bf16**: write K and V into bf16 pages, gather each request's pages through its block
  table and run ``jax.nn.dot_product_attention`` over the whole context (cuDNN where it runs);
* **plain jnp mxfp4**: the same MXFP4 pools, dequantized whole (``jm.dequantize_pool``) and
  attended with einsums: what MXFP4 costs without our kernels (skipped past 4M cached tokens).

Each executable runs ``STEPS`` decode steps under ``lax.scan`` (the pools are the carry). Device
time per step is the sum of GPU kernel and copy durations (CUPTI, ``bench_gpu.gpu_events``) over
an execution divided by ``STEPS``; wall time per step is the median of blocking executions
divided by ``STEPS`` (host dispatch, XLA's loop and synchronization included). The breakdown
names the largest kernels of the MXFP4 step.
"""

from __future__ import annotations

import collections
import dataclasses
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import jax_mxfp4 as jm
from jax_mxfp4._src.core._table import format_table
from jax_mxfp4._src.core.formats import PAGE_BYTES, PAGE_SCALE_OFFSET, PAGE_TOKENS
from jax_mxfp4_tools.bench_gpu import gpu_events

Q_HEADS, KV_HEADS, HEAD_DIM, TOPK = 16, 1, 128, 16
SM_SCALE = HEAD_DIM**-0.5
STEPS = 10
PLAIN_JNP_MAX_TOKENS = 4 << 20
SIZES = ((1, 8192), (8, 8192), (32, 8192), (128, 8192), (1, 32768), (8, 32768), (32, 32768),
         (128, 32768), (1, 131072), (8, 131072), (32, 131072), (128, 131072))
QUICK_SIZES = ((32, 131072), (8, 131072), (32, 32768))  # the cells issue 15 names


@dataclasses.dataclass
class Problem:
    """B requests of C cached tokens: a block table with one spare block each for the new
    tokens, and STEPS steps of new K, V, index K and queries."""

    requests: int
    context: int
    blocks: int  # per request: ceil((C + STEPS) / 128)
    block_table: jnp.ndarray  # int32[B, blocks]
    steps: dict  # per-step inputs, each stacked [STEPS, ...]

    @property
    def pages(self) -> int:
        return self.requests * self.blocks


def problem(rng, requests: int, context: int) -> Problem:
    blocks = -(-(context + STEPS) // PAGE_TOKENS)
    table = jnp.asarray(rng.permutation(requests * blocks).reshape(requests, blocks), jnp.int32)

    def normal(*shape):
        return jnp.asarray(rng.standard_normal((STEPS, *shape)), jnp.bfloat16)

    steps = {"q": normal(requests, Q_HEADS, HEAD_DIM), "k": normal(requests, KV_HEADS, HEAD_DIM),
             "v": normal(requests, KV_HEADS, HEAD_DIM), "q_index": normal(requests, 1, HEAD_DIM),
             "k_index": normal(requests, HEAD_DIM),
             "seq_lens": jnp.asarray(context + 1 + np.arange(STEPS)[:, None]
                                     + np.zeros((1, requests), np.int64), jnp.int32)}
    return Problem(requests, context, blocks, table, steps)


def mxfp4_step(table, num_blocks):
    """One decode step of the MXFP4 sparse path (the carry is the three pools)."""
    def step(pools, x):
        k_pool, v_pool, index_pool = pools
        positions, requests = jm.decode_rows(x["seq_lens"], 1)
        slots = jm.slot_mapping(table, positions, requests)
        k_pool, v_pool, index_pool = jm.write_kv_cache(
            k_pool, v_pool, index_pool, x["k"], x["v"], x["k_index"], slots)
        scores = jm.index_scores(x["q_index"], index_pool, table, positions, requests,
                                 num_blocks=num_blocks, sm_scale=SM_SCALE)
        sel = jm.select_blocks(scores, table, positions, requests, topk=TOPK)
        out = jm.sparse_attention(x["q"], k_pool, v_pool, sel.page_table, sel.context_lens,
                                  sm_scale=SM_SCALE, output="mxfp8")
        return (k_pool, v_pool, index_pool), out

    return step


def _attend_dense(q, k, v, lengths, implementation):
    """q ``[B, Hq, D]`` against k/v ``[B, L, Hkv, D]`` with each request's first ``lengths``
    tokens."""
    mask = jnp.arange(k.shape[1])[None, :] < lengths[:, None]
    return jax.nn.dot_product_attention(
        q[:, None], k, v, scale=SM_SCALE, implementation=implementation,
        key_value_seq_lengths=lengths if implementation == "cudnn" else None,
        mask=None if implementation == "cudnn" else mask[:, None, None, :])[:, 0]


def dense_step(table, implementation):
    """One decode step of dense bf16 paged attention (carry: bf16 K and V page pools)."""
    def step(pools, x):
        k_pages, v_pages = pools  # [P, 128, Hkv, D] bf16
        positions, requests = jm.decode_rows(x["seq_lens"], 1)
        page = table[requests, positions // PAGE_TOKENS]
        k_pages = k_pages.at[page, positions % PAGE_TOKENS].set(x["k"])
        v_pages = v_pages.at[page, positions % PAGE_TOKENS].set(x["v"])
        k = k_pages[table].reshape(table.shape[0], -1, KV_HEADS, HEAD_DIM)
        v = v_pages[table].reshape(table.shape[0], -1, KV_HEADS, HEAD_DIM)
        out = _attend_dense(x["q"], k, v, x["seq_lens"], implementation)
        return (k_pages, v_pages), out

    return step


def plain_mxfp4_step(table):
    """One decode step over MXFP4 pools without the kernels: quantize with jnp, dequantize the
    requests' pages whole, attend with einsums."""
    def step(pools, x):
        k_pool, v_pool = pools
        positions, requests = jm.decode_rows(x["seq_lens"], 1)
        slots = jm.slot_mapping(table, positions, requests)
        k_pool = jm.reference.write_cache(k_pool, x["k"], slots)
        v_pool = jm.reference.write_cache(v_pool, x["v"], slots)
        b = table.shape[0]
        pages = table.reshape(-1)  # Hkv = 1: [B * blocks, 1, 128, D] -> [B, tokens, D]
        k = jm.dequantize_pool(k_pool[pages], jnp.bfloat16).reshape(b, -1, HEAD_DIM)
        v = jm.dequantize_pool(v_pool[pages], jnp.bfloat16).reshape(b, -1, HEAD_DIM)
        logits = jnp.einsum("bhd,btd->bht", x["q"], k, preferred_element_type=jnp.float32)
        live = jnp.arange(k.shape[1])[None, None, :] < x["seq_lens"][:, None, None]
        weights = jax.nn.softmax(jnp.where(live, logits * SM_SCALE, -jnp.inf), axis=-1)
        out = jnp.einsum("bht,btd->bhd", weights.astype(jnp.bfloat16), v)
        return (k_pool, v_pool), out

    return step


@dataclasses.dataclass
class StepTiming:
    device: float  # GPU seconds per step
    wall: float  # seconds per step
    kernels: dict[str, float]


def _scan(step, carry, steps):
    return jax.lax.scan(step, carry, steps)


def time_steps(step, carry, steps, repeats: int) -> StepTiming:
    """Time ``STEPS`` scanned steps: CUPTI device time and blocking wall time, per step."""
    run = jax.jit(_scan, static_argnums=0, donate_argnums=1)
    state = [carry]

    def once():
        state[0], out = run(step, state[0], steps)
        return out

    jax.block_until_ready(once())
    walls = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(once())
        walls.append(time.perf_counter() - t0)
    events = gpu_events(lambda: once(), (), runs=1)
    per_name = collections.Counter()
    for e in events:
        per_name[e["name"]] += e["dur"] * 1e-6 / STEPS
    return StepTiming(sum(per_name.values()), statistics.median(walls) / STEPS, dict(per_name))


def _device_pool(key, pages: int, heads: int | None):
    """Random MXFP4 pages made on the device (a host copy of 128 x 128K-token pools takes
    longer than the benchmark): random codes, scale bytes 118..133 as ``random_pool``."""
    shape = (pages, PAGE_BYTES) if heads is None else (pages, heads, PAGE_BYTES)
    data_key, scale_key = jax.random.split(key)
    pool = jax.random.randint(data_key, shape, 0, 256, jnp.int32).astype(jnp.uint8)
    scales = jax.random.randint(scale_key, (*shape[:-1], PAGE_BYTES - PAGE_SCALE_OFFSET), 118,
                                134, jnp.int32).astype(jnp.uint8)
    return pool.at[..., PAGE_SCALE_OFFSET:].set(scales)


def _mxfp4_carry(rng, p: Problem):
    keys = jax.random.split(jax.random.key(int(rng.integers(1 << 31))), 3)
    return (_device_pool(keys[0], p.pages, KV_HEADS), _device_pool(keys[1], p.pages, KV_HEADS),
            _device_pool(keys[2], p.pages, None))


def _dense_carry(rng, p: Problem):
    keys = jax.random.split(jax.random.key(int(rng.integers(1 << 31))), 2)
    shape = (p.pages, PAGE_TOKENS, KV_HEADS, HEAD_DIM)
    return tuple(jax.random.normal(k, shape, jnp.bfloat16) for k in keys)


def _breakdown(kernels: dict[str, float], top: int = 4) -> str:
    ranked = sorted(kernels.items(), key=lambda kv: -kv[1])[:top]
    return ", ".join(f"{name[:28]} {t * 1e6:.0f}" for name, t in ranked)


def measure(rng, requests: int, context: int, repeats: int) -> tuple[str, ...]:
    p = problem(rng, requests, context)
    sparse = time_steps(mxfp4_step(p.block_table, p.blocks), _mxfp4_carry(rng, p), p.steps,
                        repeats)
    try:
        dense = time_steps(dense_step(p.block_table, "cudnn"), _dense_carry(rng, p), p.steps,
                           repeats)
        dense_name = "cudnn"
    except Exception:  # cuDNN refuses the shape: XLA's attention instead (named in the table)
        dense = time_steps(dense_step(p.block_table, "xla"), _dense_carry(rng, p), p.steps,
                           repeats)
        dense_name = "xla"
    plain = None
    if requests * context <= PLAIN_JNP_MAX_TOKENS:
        carry = _mxfp4_carry(rng, p)[:2]
        plain = time_steps(plain_mxfp4_step(p.block_table), carry, p.steps, max(2, repeats // 3))
    tokens = requests / sparse.wall
    return (f"B={requests}", f"{context // 1024}K", f"{sparse.device * 1e6:.0f}",
            f"{sparse.wall * 1e6:.0f}", f"{tokens:,.0f}",
            f"{dense.device * 1e6:.0f} ({dense_name})", f"{dense.wall * 1e6:.0f}",
            f"{dense.device / sparse.device:.1f}x",
            f"{plain.device * 1e6:.0f}" if plain else "-",
            f"{plain.device / sparse.device:.0f}x" if plain else "-",
            _breakdown(sparse.kernels))


def run(quick: bool, repeats: int) -> str:
    rng = np.random.default_rng(0)
    rows = []
    for requests, context in QUICK_SIZES if quick else SIZES:
        rows.append(measure(rng, requests, context, repeats))
        print(" | ".join(rows[-1]), file=sys.stderr, flush=True)  # partial results survive
    device = jax.devices()[0]
    head = (f"jax {jax.__version__} on {device.device_kind}: one decode step per rank "
            f"(16 q heads, 1 kv head, top-{TOPK}), {STEPS} steps per executable under "
            f"lax.scan; device = CUPTI kernel time per step, wall = per step with dispatch")
    header = ("B", "context", "mxfp4 us", "wall us", "tokens/s", "dense bf16 us", "wall us",
              "dense/mxfp4", "plain jnp us", "plain/mxfp4", "mxfp4 kernels (us per step)")
    return head + "\n" + format_table(header, rows, right_aligned=range(2, 10))


__all__ = ["measure", "mxfp4_step", "problem", "run"]
