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
from jax_mxfp4_tools.demo.accuracy import COMPARISONS, RequestLog, evaluate, record
from jax_mxfp4_tools.demo.layer import (
    DENSE_LIMIT,
    HEAD_DIM,
    NUM_INDEX_HEADS,
    NUM_KV_HEADS,
    NUM_Q_HEADS,
    PAGE,
    ROPE_THETA,
    ROTARY_DIM,
    SM_SCALE,
    TOPK,
    Pools,
    init_params,
    make_step_functions,
    project,
)
from jax_mxfp4_tools.demo.report import (
    CACHE_FORMATS,
    GIB,
    accuracy_table,
    cache_table,
    format_report,
    timing_table,
)

__all__ = [
    "CACHE_FORMATS",
    "COMPARISONS",
    "DEFAULT_PREFILL_LENS",
    "DENSE_LIMIT",
    "GIB",
    "HEAD_DIM",
    "NUM_INDEX_HEADS",
    "NUM_KV_HEADS",
    "NUM_Q_HEADS",
    "PAGE",
    "ROPE_THETA",
    "ROTARY_DIM",
    "SM_SCALE",
    "TOPK",
    "DemoConfig",
    "DemoResult",
    "accuracy_table",
    "add_arguments",
    "cache_table",
    "config_from_args",
    "evaluate",
    "format_report",
    "init_params",
    "main",
    "make_step_functions",
    "project",
    "run_demo",
    "run_from_args",
    "schedule_prefill",
    "timing_table",
]

DEFAULT_PREFILL_LENS = (1500, 2500, 700)


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


@dataclasses.dataclass
class DemoResult:
    """What one run measured: sizes, compile and step times (seconds), and ``evaluate``'s
    accuracy list and sparse-row counts. ``aliased`` counts, per step, the pool outputs that
    reuse the donated input buffers (3 when all are updated in place)."""

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


def _backend_name() -> str:
    for name in ("get_backend", "backend"):
        fn = getattr(jm, name, None)
        if callable(fn):
            try:
                return str(fn())
            except Exception:  # pragma: no cover - informational only
                break
    return "default"


@dataclasses.dataclass
class _Run:
    """One run's state between steps; every step donates ``pools`` and they are replaced by its
    outputs."""

    config: DemoConfig
    log: Callable[[str], None]
    params: dict[str, jax.Array]
    hidden_states: list[jax.Array]  # per request: bf16 [prefill len + decode steps, hidden]
    pools: Pools
    block_table: jax.Array  # int32 [requests, num_blocks]
    num_pages: int
    num_rows: int  # query rows of one prefill step
    logs: list[RequestLog]
    compile_s: dict[str, float] = dataclasses.field(default_factory=dict)
    aliased: dict[str, int] = dataclasses.field(default_factory=dict)

    @property
    def num_blocks(self) -> int:
        return self.block_table.shape[1]


def _allocate_pages(total: Sequence[int], rng: np.random.Generator) -> tuple[np.ndarray, int]:
    """Block table int32 ``[len(total), max blocks]`` for requests of ``total`` tokens, and the
    number of pages. Pages are handed out in a shuffled order; page 0 is never used (a null
    page)."""
    pages_per_request = [math.ceil(n / PAGE) for n in total]
    num_blocks = max(pages_per_request)
    num_pages = 1 + sum(pages_per_request)
    free = list(rng.permutation(np.arange(1, num_pages)))
    block_table = np.zeros((len(total), num_blocks), np.int32)
    for b, n in enumerate(pages_per_request):
        block_table[b, :n] = [free.pop() for _ in range(n)]
    return block_table, num_pages


def _start(config: DemoConfig, rng: np.random.Generator, log: Callable[[str], None]) -> _Run:
    """Paged cache, weights and every request's hidden states (prefill and decode tokens)."""
    lens = list(config.prefill_lens)
    steps = config.decode_steps
    total = [n + steps for n in lens]
    block_table, num_pages = _allocate_pages(total, rng)
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
    pools = (
        jm.new_pool(num_pages, NUM_KV_HEADS),
        jm.new_pool(num_pages, NUM_KV_HEADS),
        jm.new_pool(num_pages),
    )
    return _Run(
        config=config,
        log=log,
        params=params,
        hidden_states=hidden_states,
        pools=pools,
        block_table=jnp.asarray(block_table),
        num_pages=num_pages,
        num_rows=min(config.prefill_chunk, sum(lens)),
        logs=[RequestLog.empty(n, lens[b]) for b, n in enumerate(total)],
    )


def _prefill_inputs(
    run: _Run, prefix: Sequence[int], q_lens: Sequence[int]
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """One prefill step's inputs: bf16 ``x[num_rows, hidden]`` (the requests' new tokens in
    order, zero-padded), int32 ``cu_seqlens_q[B + 1]`` and int32 ``prefix_lens[B]``."""
    parts = [
        run.hidden_states[b][p : p + q]
        for b, (p, q) in enumerate(zip(prefix, q_lens, strict=True))
    ]
    x = jnp.concatenate(parts, axis=0)
    x = jnp.pad(x, ((0, run.num_rows - x.shape[0]), (0, 0)))
    cu = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    return x, jnp.asarray(cu), jnp.asarray(prefix, jnp.int32)


def _prefill_rows(
    prefix: Sequence[int], q_lens: Sequence[int], num_rows: int
) -> tuple[np.ndarray, np.ndarray]:
    """Host copies of a prefill step's row positions (-1: padding) and requests, int64
    ``[num_rows]`` each, as ``_prefill_inputs`` lays the rows out."""
    positions = np.full(num_rows, -1, np.int64)
    requests = np.zeros(num_rows, np.int64)
    row = 0
    for b, (p, q) in enumerate(zip(prefix, q_lens, strict=True)):
        positions[row : row + q] = np.arange(p, p + q)
        requests[row : row + q] = b
        row += q
    return positions, requests


def _prefill(run: _Run, prefill_step: Callable) -> tuple[list[float], list[int]]:
    """Compile the prefill step, then run the whole chunked prefill; returns each step's time
    (seconds) and tokens."""
    schedule = schedule_prefill(list(run.config.prefill_lens), run.config.prefill_chunk)
    x0, cu0, pre0 = _prefill_inputs(run, *schedule[0])
    run.log(f"compiling the prefill step ({run.num_rows} rows, {run.num_blocks} blocks per "
            "request)...")
    exe, run.compile_s["prefill"], run.aliased["prefill"] = _compile(
        prefill_step, run.params, *run.pools, x0, cu0, pre0, run.block_table
    )
    run.log(f"  compiled in {run.compile_s['prefill']:.2f} s")

    times, tokens = [], []
    for i, (prefix, q_lens) in enumerate(schedule):
        x, cu, pre = _prefill_inputs(run, prefix, q_lens)
        (run.pools, out, extras), dt = _timed(
            exe, run.params, *run.pools, x, cu, pre, run.block_table
        )
        times.append(dt)
        tokens.append(sum(q_lens))
        run.log(f"prefill step {i + 1}/{len(schedule)}: {sum(q_lens)} tokens {q_lens}, "
                f"{dt * 1e3:.0f} ms")
        record(run.logs, *_prefill_rows(prefix, q_lens, run.num_rows), extras, out)
    return times, tokens


def _decode(run: _Run, decode_step: Callable) -> list[float]:
    """The decode steps, one token per request each (compiled before the first); returns each
    step's time (seconds)."""
    num_requests = run.config.num_requests
    steps = run.config.decode_steps
    seq_lens = np.array(run.config.prefill_lens, np.int32)
    times = []
    exe = None
    for i in range(steps):
        seq_lens = seq_lens + 1
        x = jnp.stack([run.hidden_states[b][seq_lens[b] - 1] for b in range(num_requests)])
        seq_dev = jnp.asarray(seq_lens)
        if exe is None:
            run.log(f"compiling the decode step ({num_requests} rows)...")
            exe, run.compile_s["decode"], run.aliased["decode"] = _compile(
                decode_step, run.params, *run.pools, x, seq_dev, run.block_table
            )
            run.log(f"  compiled in {run.compile_s['decode']:.2f} s")
        (run.pools, out, extras), dt = _timed(
            exe, run.params, *run.pools, x, seq_dev, run.block_table
        )
        times.append(dt)
        run.log(f"decode step {i + 1}/{steps}: {num_requests} tokens, {dt * 1e3:.1f} ms")
        record(run.logs, seq_lens - 1, np.arange(num_requests), extras, out)
    return times


def run_demo(config: DemoConfig, log: Callable[[str], None] | None = None) -> DemoResult:
    """Serve the requests of ``config``; returns timings and accuracy (see ``format_report``)."""
    if log is None:
        log = _stderr_log
    t_start = time.perf_counter()
    rng = np.random.default_rng(config.seed)
    run = _start(config, rng, log)
    prefill_step, decode_step = make_step_functions(run.num_rows, run.num_blocks)
    prefill_times, prefill_tokens = _prefill(run, prefill_step)
    decode_times = _decode(run, decode_step)

    log("checking accuracy against dense attention over the unquantized K/V...")
    accuracy, sparse_rows = evaluate(run.logs, run.num_blocks, config.eval_rows, rng)
    result = DemoResult(
        config=config,
        num_pages=run.num_pages,
        num_blocks=run.num_blocks,
        prefill_rows=run.num_rows,
        backend=_backend_name(),
        compile_s=run.compile_s,
        aliased=run.aliased,
        prefill_step_s=prefill_times,
        decode_step_s=decode_times,
        prefill_tokens=prefill_tokens,
        accuracy=accuracy,
        sparse_rows=sparse_rows,
    )
    result.total_s = time.perf_counter() - t_start
    log(f"done in {result.total_s:.1f} s")
    return result


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
