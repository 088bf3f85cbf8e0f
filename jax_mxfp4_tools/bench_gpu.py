"""``python -m jax_mxfp4 bench --device gpu``: the GPU table, kernels vs the reference lowering
side by side, with the ceilings (copy bandwidth, fp8 matmul rate) measured in the same run.

Method: each cell is one ``jax.jit`` holding ``R`` independent calls of the operation (distinct
query arrays, so nothing is shared or merged; the pools are shared; cache writes are chained
through one pool, as successive steps write it), compiled once per lowering. After a warm-up,
``runs`` executions are traced with ``jax.profiler`` (CUPTI): the **device time** per call is
the summed duration of every GPU kernel and copy of those executions divided by ``runs * R``.
The wall time per call (median of ``repeats`` blocking executions, divided by ``R``) is shown
beside it; it also holds the host's dispatch and synchronization (about 16 us per call with
``R = 10`` on the H200 machine: ``bench/gpu_diagnose.py`` measures it). Bytes count what the
operation must read and write at least; FLOPs count the live query-key products (2 per
multiply-add).
"""

from __future__ import annotations

import collections
import dataclasses
import gzip
import json
import pathlib
import statistics
import sys
import tempfile
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

import jax_mxfp4 as jm
from jax_mxfp4._src.core._table import format_table
from jax_mxfp4._src.core.formats import PAGE_BYTES
from jax_mxfp4._src.dispatch.backend import backend_scope
from jax_mxfp4_tools.bench_inputs import index_inputs, random_pool

SM = 128**-0.5
G, TOPK = 16, 16

# The seed's MI355X MXFP4 bf16-Q prefill scorer times (µs), SPEC §12.
SEED_PREFILL_US = {
    "b1 q4096 ctx 8K": 11.6, "b1 q4096 ctx 128K": 58.6, "b4 q512 ctx 8K": 8.5,
    "b8 q2048 ctx 16K": 34.0, "b32 q8 ctx 32K": 30.5, "chunk 32768 prefix 0": 93.2,
    "chunk 32768 prefix 100K": 430.1,
}


@dataclasses.dataclass
class Cell:
    group: str
    label: str
    make: Callable  # rng -> (fn(*varying, *shared), [varying args per call], shared args)
    bytes_moved: float = 0.0
    flops: float = 0.0
    reference: bool = True
    chained: bool = False  # the first shared argument is threaded through the calls


@dataclasses.dataclass
class Timing:
    device: float  # seconds of GPU kernels and copies per call
    wall: float  # seconds per call, host dispatch and synchronization included
    kernels: dict[str, float]  # GPU time per call by kernel name


def _time(fn, args, repeats: int, calls: int) -> float:
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t0)
    return statistics.median(times) / calls


def gpu_events(fn, args, runs: int = 3) -> list[dict]:
    """The GPU activity (kernels, copies) of ``runs`` executions of ``fn(*args)``, as trace
    events (``name``, ``ts``, ``dur`` in us) of a ``jax.profiler`` trace."""
    jax.block_until_ready(fn(*args))
    logdir = tempfile.mkdtemp(prefix="jax_mxfp4_trace_")
    with jax.profiler.trace(logdir):
        for _ in range(runs):
            jax.block_until_ready(fn(*args))
    path = next(pathlib.Path(logdir).rglob("*.trace.json.gz"))
    with gzip.open(path) as f:
        events = json.load(f)["traceEvents"]
    devices = {e["pid"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"
               and "/device:GPU" in e["args"]["name"]}
    return [e for e in events if e.get("ph") == "X" and e["pid"] in devices]


def _timing(fn, args, repeats: int, calls: int, runs: int = 3) -> Timing:
    wall = _time(fn, args, repeats, calls)
    events = gpu_events(fn, args, runs)
    per_name = collections.Counter()
    for e in events:
        per_name[e["name"]] += e["dur"] * 1e-6 / (runs * calls)
    return Timing(sum(per_name.values()), wall, dict(per_name))


def _measure(cell: Cell, rng, repeats: int, calls: int, backend: str) -> Timing:
    fn, varying, shared = cell.make(rng, calls)
    n = len(varying)

    def many(*args):
        if cell.chained:
            state, rest = args[n], args[n + 1:]
            for i in range(n):
                state = fn(*args[i], state, *rest)
            return state
        return [fn(*args[i], *args[n:]) for i in range(n)]

    with backend_scope(backend):
        compiled = jax.jit(many).lower(*varying, *shared).compile()
    return _timing(compiled, (*varying, *shared), repeats, n)


def index_cell(label, requests, rows_per_request, context, shape="decode"):
    blocks = -(-context // 128)
    rows = requests * rows_per_request

    def make(rng, calls):
        pool, table, positions, reqs = index_inputs(rng, shape, requests, rows_per_request,
                                                    context)
        qs = [(jnp.asarray(rng.standard_normal((rows, 1, 128)), jnp.bfloat16),)
              for _ in range(calls)]

        def fn(q, pool, table, positions, reqs):
            return jm.index_scores(q, pool, table, positions, reqs, num_blocks=blocks,
                                   sm_scale=SM)

        return fn, qs, (pool, table, positions, reqs)

    moved = requests * context * 68 + rows * (256 + 4 * blocks)
    first = context - rows_per_request
    live_tokens = rows_per_request * first + rows_per_request * (rows_per_request + 1) / 2
    flops = 2 * 128 * requests * live_tokens
    return Cell(f"index_scores {shape}", label, make, moved, flops,
                reference=requests * context <= 32 * 131072)


def attention_cell(label, rows, output="bf16", group="sparse_attention decode", quant=False):
    def make(rng, calls):
        pages = max(rows * TOPK, 1024)
        k, v = random_pool(rng, pages, 1), random_pool(rng, pages, 1)
        table = jnp.asarray(rng.integers(0, pages, (rows, 1, TOPK)), jnp.int32)
        ctx = jnp.full((rows, 1), TOPK * 128, jnp.int32)
        qs = [(jnp.asarray(rng.standard_normal((rows, G, 128)), jnp.bfloat16),)
              for _ in range(calls)]

        def fn(q, k, v, table, ctx):
            out = jm.sparse_attention(q, k, v, table, ctx, sm_scale=SM, output=output)
            if quant:
                return jm.quantize_mxfp8(out.reshape(rows, -1))
            return out

        return fn, qs, (k, v, table, ctx)

    moved = rows * TOPK * 2 * PAGE_BYTES + rows * G * 128 * 4
    flops = 4 * rows * G * TOPK * 128 * 128
    return Cell(group, label, make, moved, flops)


def write_cell(tokens):
    def make(rng, calls):
        pool = random_pool(rng, max(1024, tokens // 64), 1)
        xs = [(jnp.asarray(rng.standard_normal((tokens, 1, 128)), jnp.bfloat16),
               jnp.asarray(rng.permutation(pool.shape[0] * 128)[:tokens], jnp.int32))
              for _ in range(calls)]

        def fn(x, slots, pool):
            return jm.write_cache(pool, x, slots)

        return fn, xs, (pool,)

    return Cell("write_cache", f"{tokens} tokens", make, tokens * (256 + 68 + 4), chained=True)


def select_cell(rows, context):
    blocks = -(-context // 128)

    def make(rng, calls):
        table = jnp.asarray(rng.integers(0, rows * blocks, (rows, blocks)), jnp.int32)
        positions = jnp.full((rows,), context - 1, jnp.int32)
        reqs = jnp.arange(rows, dtype=jnp.int32)
        ss = [(jnp.asarray(rng.standard_normal((1, rows, blocks)), jnp.float32),)
              for _ in range(calls)]

        def fn(scores, table, positions, reqs):
            return tuple(jm.select_blocks(scores, table, positions, reqs, topk=TOPK))

        return fn, ss, (table, positions, reqs)

    return Cell("select_blocks", f"{rows} rows ctx {context // 1024}K", make,
                rows * (blocks * 4 + TOPK * 12 + 4))


def cells(quick: bool = False) -> list[Cell]:
    out = [
        index_cell("b32 S1 H1 ctx 8K", 32, 1, 8192),
        index_cell("b32 S1 H1 ctx 32K", 32, 1, 32768),
        index_cell("b32 S1 H1 ctx 128K", 32, 1, 131072),
        index_cell("b8 S4 H1 ctx 8K", 8, 4, 8192),
        index_cell("b8 S4 H1 ctx 128K", 8, 4, 131072),
        index_cell("b32 S8 H1 ctx 32K", 32, 8, 32768),
        index_cell("b4 S1 H1 ctx 512K", 4, 1, 524288),
        index_cell("b32 S1 H1 ctx 512K", 32, 1, 524288),
        index_cell("b1 q4096 ctx 8K", 1, 4096, 8192, shape="prefill"),
        index_cell("b1 q4096 ctx 128K", 1, 4096, 131072, shape="prefill"),
        index_cell("b4 q512 ctx 8K", 4, 512, 8192, shape="prefill"),
        index_cell("b8 q2048 ctx 16K", 8, 2048, 16384, shape="prefill"),
        index_cell("b32 q8 ctx 32K", 32, 8, 32768, shape="prefill"),
        index_cell("chunk 32768 prefix 0", 1, 32768, 32768, shape="prefill"),
        index_cell("chunk 32768 prefix 100K", 1, 32768, 32768 + 102400, shape="prefill"),
        # 96-row prompts in 128-row tiles: most tiles hold rows of two requests
        index_cell("b32 q96 ctx 8K", 32, 96, 8192, shape="prefill"),
    ]
    out += [attention_cell(f"{r} rows x 16 pages", r) for r in (1, 8, 32, 128, 192, 256)]
    for n in (1, 2, 4, 8, 16, 24):
        rows = 8 * n
        group = "mxfp8 epilogue"
        out += [attention_cell(f"N={n} bf16", rows, group=group),
                attention_cell(f"N={n} bf16+quantize", rows, group=group, quant=True),
                attention_cell(f"N={n} fused mxfp8", rows, "mxfp8", group=group)]
    out += [write_cell(32), write_cell(4096), write_cell(16384), select_cell(32, 131072),
            select_cell(4096, 32768)]
    if quick:
        return [c for c in out if c.label in QUICK]
    return out


QUICK = ("b32 S1 H1 ctx 8K", "b32 S1 H1 ctx 512K", "chunk 32768 prefix 100K", "N=1 bf16",
         "32 tokens")
"""The cells of ``cells(quick=True)``: one of each kind."""


def ceilings(repeats: int = 10) -> tuple[float, float]:
    """(copy TB/s counting read + write, fp8 matmul TFLOP/s) that XLA reaches, in device time."""
    x = jnp.ones((1 << 30,), jnp.float32)  # 4 GiB
    copy = jax.jit(lambda a: a * 1.0001)
    bandwidth = 2 * x.nbytes / _timing(copy, (x,), repeats, 1).device / 1e12
    del x
    n = 8192
    rng = np.random.default_rng(0)
    a = jnp.asarray(rng.standard_normal((n, n)), jnp.float8_e4m3fn)
    b = jnp.asarray(rng.standard_normal((n, n)), jnp.float8_e4m3fn)
    mm = jax.jit(lambda a, b: jnp.dot(a, b, preferred_element_type=jnp.float32))
    return bandwidth, 2 * n**3 / _timing(mm, (a, b), repeats, 1).device / 1e12


def run(quick: bool, repeats: int, reference: bool, only: str = "") -> str:
    bw, fp8 = ceilings()
    print(f"copy {bw:.2f} TB/s, fp8 {fp8:.0f} TFLOP/s", file=sys.stderr, flush=True)
    rng = np.random.default_rng(0)
    rows = []
    for cell in cells(quick):
        if only not in f"{cell.group} {cell.label}":
            continue
        kernel = _measure(cell, rng, repeats, 10, "auto")
        ref = None
        if reference and cell.reference:
            ref = _measure(cell, rng, max(2, repeats // 3), 1, "reference")
        rows.append(_row(cell, kernel, ref, bw, fp8))
        print(" | ".join(rows[-1]), file=sys.stderr, flush=True)  # partial results survive
    device = jax.devices()[0]
    head = (f"jax {jax.__version__} on {device.device_kind}; copy {bw:.2f} TB/s (read+write), "
            f"fp8 matmul {fp8:.0f} TFLOP/s (8192^3), measured in this run; times are device "
            "time per call (CUPTI), wall = with host dispatch")
    header = ("group", "cell", "kernel", "wall", "TB/s", "%copy", "TFLOP/s", "%fp8",
              "reference", "speedup", "seed MI355X")
    return head + "\n" + format_table(header, rows, right_aligned=range(2, len(header)))


def _row(cell: Cell, kernel: Timing, ref: Timing | None, bw: float, fp8: float):
    t = kernel.device
    tbs = cell.bytes_moved / t / 1e12
    tflops = cell.flops / t / 1e12 if cell.flops else 0.0
    seed = SEED_PREFILL_US.get(cell.label) if "prefill" in cell.group else None
    return (
        cell.group, cell.label, f"{t * 1e6:.1f} us", f"{kernel.wall * 1e6:.1f} us",
        f"{tbs:.2f}", f"{100 * tbs / bw:.0f}",
        f"{tflops:.0f}" if cell.flops else "-", f"{100 * tflops / fp8:.0f}" if cell.flops else "-",
        f"{ref.device * 1e6:.1f} us" if ref else "-", f"{ref.device / t:.0f}x" if ref else "-",
        f"{seed} us" if seed else "-",
    )
