"""``python -m jax_mxfp4 bench``: every operation at decode- and prefill-shaped sizes, the
platform's kernels against the reference lowering, side by side in one run.

Method: each cell builds its inputs once on the device, compiles the operation twice under
``jax.jit`` (traced once with the backend choice "auto", once with "reference"), runs each a
few times to warm up, then times ``repeats`` calls each (``block_until_ready`` after every
call) and reports the median. Bytes moved counts what the operation must read and write at
least (pages it reads, queries, outputs), so GB/s is comparable across implementations.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

import jax_mxfp4 as jm
from jax_mxfp4._src.core._table import format_table
from jax_mxfp4._src.core.formats import PAGE_BYTES, PAGE_TOKENS
from jax_mxfp4._src.core.progress import progress
from jax_mxfp4._src.dispatch.backend import backend_scope
from jax_mxfp4_tools.bench_inputs import index_inputs, random_pool

SM_SCALE = 128**-0.5
Q_HEADS, KV_HEADS, INDEX_HEADS, TOPK = 16, 1, 1, 16  # MiniMax-M3.1 per rank at TP4


@dataclasses.dataclass
class Cell:
    """One benchmark: an operation at one size."""

    op: str
    shape: str  # "decode" | "prefill"
    label: str
    make: Callable[[np.random.Generator], tuple[Callable, tuple]]  # -> (fn, args)
    bytes_moved: int
    donate_first: bool = False  # the first argument is a cache updated in place


@dataclasses.dataclass
class Timing:
    cell: Cell
    kernel_s: float
    reference_s: float | None


def _table(rng, requests: int, blocks: int, pages: int) -> jnp.ndarray:
    return jnp.asarray(rng.integers(0, pages, (requests, blocks)), jnp.int32)


def _write_cell(shape: str, tokens: int) -> Cell:
    def make(rng):
        pages = max(64, tokens // PAGE_TOKENS * 2)
        pool = random_pool(rng, pages, KV_HEADS)
        x = jnp.asarray(rng.standard_normal((tokens, KV_HEADS, 128)), jnp.bfloat16)
        slots = jnp.asarray(rng.permutation(pages * PAGE_TOKENS)[:tokens], jnp.int32)
        return (lambda p, x, s: jm.write_cache(p, x, s)), (pool, x, slots)

    moved = tokens * KV_HEADS * (128 * 2 + 68)
    return Cell("write_cache", shape, f"{tokens} tokens", make, moved, donate_first=True)


def _index_cell(shape: str, requests: int, rows_per_request: int, context: int) -> Cell:
    blocks = -(-context // PAGE_TOKENS)
    rows = requests * rows_per_request

    def make(rng):
        pool, table, positions, reqs = index_inputs(rng, shape, requests, rows_per_request,
                                                    context)
        q = jnp.asarray(rng.standard_normal((rows, INDEX_HEADS, 128)), jnp.bfloat16)

        def fn(q, pool, table, positions, reqs):
            return jm.index_scores(q, pool, table, positions, reqs, num_blocks=blocks,
                                   sm_scale=SM_SCALE)

        return fn, (q, pool, table, positions, reqs)

    moved = requests * context * 68 + rows * INDEX_HEADS * (256 + 4 * blocks)
    label = f"b{requests} x{rows_per_request} ctx {context // 1024}K"
    return Cell("index_scores", shape, label, make, moved)


def _select_cell(shape: str, rows: int, context: int) -> Cell:
    blocks = -(-context // PAGE_TOKENS)

    def make(rng):
        scores = jnp.asarray(rng.standard_normal((INDEX_HEADS, rows, blocks)), jnp.float32)
        table = _table(rng, rows, blocks, rows * blocks)
        positions = jnp.full((rows,), context - 1, jnp.int32)
        reqs = jnp.arange(rows, dtype=jnp.int32)

        def fn(scores, table, positions, reqs):
            return jm.select_blocks(scores, table, positions, reqs, topk=TOPK)

        return fn, (scores, table, positions, reqs)

    moved = rows * INDEX_HEADS * (blocks * 4 + TOPK * 12 + 4)
    return Cell("select_blocks", shape, f"{rows} rows ctx {context // 1024}K", make, moved)


def _attention_cell(shape: str, rows: int, output: str = "bf16") -> Cell:
    def make(rng):
        pages = rows * TOPK
        k_pool, v_pool = random_pool(rng, pages, KV_HEADS), random_pool(rng, pages, KV_HEADS)
        table = jnp.asarray(rng.permutation(pages).reshape(rows, KV_HEADS, TOPK), jnp.int32)
        context = jnp.full((rows, KV_HEADS), TOPK * PAGE_TOKENS, jnp.int32)
        q = jnp.asarray(rng.standard_normal((rows, Q_HEADS, 128)), jnp.bfloat16)

        def fn(q, k_pool, v_pool, table, context):
            return jm.sparse_attention(q, k_pool, v_pool, table, context, sm_scale=SM_SCALE,
                                       output=output)

        return fn, (q, k_pool, v_pool, table, context)

    moved = rows * KV_HEADS * TOPK * 2 * PAGE_BYTES + rows * Q_HEADS * 128 * 4
    label = f"{rows} rows x {TOPK} pages" + (" mxfp8" if output == "mxfp8" else "")
    return Cell("sparse_attention", shape, label, make, moved)


def cpu_cells(quick: bool = False) -> list[Cell]:
    """The CPU table: MiniMax-M3.1 per-rank shapes, sized for a small machine."""
    if quick:
        return [_write_cell("decode", 32), _index_cell("decode", 4, 1, 8192),
                _select_cell("decode", 8, 8192), _attention_cell("decode", 4)]
    return [
        _write_cell("decode", 32),
        _write_cell("prefill", 4096),
        _index_cell("decode", 1, 1, 32768),
        _index_cell("decode", 32, 1, 8192),
        _index_cell("decode", 32, 1, 32768),
        _index_cell("decode", 8, 4, 131072),
        _index_cell("prefill", 1, 1024, 8192),
        _index_cell("prefill", 1, 4096, 32768),
        _select_cell("decode", 32, 32768),
        _select_cell("decode", 32, 131072),
        _select_cell("prefill", 4096, 32768),
        _attention_cell("decode", 1),
        _attention_cell("decode", 32),
        _attention_cell("decode", 32, "mxfp8"),
        _attention_cell("prefill", 1024),
        _attention_cell("prefill", 4096),
    ]


def _compile(cell: Cell, fn: Callable, args: tuple, backend: str):
    with backend_scope(backend):
        donate = (0,) if cell.donate_first else ()
        return jax.jit(fn, donate_argnums=donate).lower(*args).compile()


def _time(cell: Cell, compiled, args: tuple, repeats: int, budget_s: float) -> float:
    """Median seconds per call; a donated cache is threaded from one call to the next."""
    args = list(args)
    if cell.donate_first:
        args[0] = args[0].copy()  # keep the caller's array alive for the other lowering

    def call() -> None:
        out = jax.block_until_ready(compiled(*args))
        if cell.donate_first:
            args[0] = out

    call()  # warm-up
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < repeats and (len(times) < 2 or time.perf_counter() - start < budget_s):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def run_cells(cells: list[Cell], *, repeats: int = 10, budget_s: float = 2.0,
              reference: bool = True, seed: int = 0) -> list[Timing]:
    rng = np.random.default_rng(seed)
    results = []
    for i, cell in enumerate(cells):
        progress(i, len(cells), f"{cell.op} {cell.shape} {cell.label}", what="bench",
                 log_lines=True)
        fn, args = cell.make(rng)
        kernel = _time(cell, _compile(cell, fn, args, "auto"), args, repeats, budget_s)
        ref = None
        if reference:
            compiled = _compile(cell, fn, args, "reference")
            ref = _time(cell, compiled, args, max(2, repeats // 3), budget_s)
        results.append(Timing(cell, kernel, ref))
    progress(len(cells), len(cells), "done", what="bench", log_lines=True)
    return results


def format_results(results: list[Timing]) -> str:
    header = ("operation", "shape", "size", "kernel", "GB/s", "reference", "GB/s", "speedup")
    rows = []
    for r in results:
        ref = r.reference_s
        rows.append((
            r.cell.op, r.cell.shape, r.cell.label, _fmt_time(r.kernel_s),
            f"{r.cell.bytes_moved / r.kernel_s / 1e9:.2f}",
            _fmt_time(ref) if ref else "-",
            f"{r.cell.bytes_moved / ref / 1e9:.2f}" if ref else "-",
            f"{ref / r.kernel_s:.1f}x" if ref else "-",
        ))
    return format_table(header, rows, right_aligned=range(3, len(header)))  # times, GB/s, speedup


def _fmt_time(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} us"
    if seconds < 1:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def add_arguments(parser) -> None:
    parser.add_argument("--device", choices=("cpu", "gpu"), default="cpu",
                        help="which device's table to run (default: cpu)")
    parser.add_argument("--quick", action="store_true", help="a few small cells only")
    parser.add_argument("--repeats", type=_positive_int, default=10,
                        help="timed calls per cell, at least 1 (default: 10)")
    parser.add_argument("--no-reference", action="store_true",
                        help="skip the reference lowering (kernels only)")
    parser.add_argument("--cells", default="",
                        help="with --device gpu: only the cells whose group or name holds "
                        "this text (e.g. 'prefill')")
    parser.add_argument("--step", action="store_true",
                        help="with --device gpu: one whole decode step against dense bf16 "
                        "attention and plain-jnp MXFP4 (bench_step)")


def gpu_unavailable_reason() -> str | None:
    """Why JAX sees no GPU here (None when it sees one)."""
    try:
        devices = jax.devices("gpu")
    except RuntimeError as exc:
        return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return None if devices else "no GPU device"


def run_from_args(args) -> int:
    if args.device == "gpu" and args.step:
        from jax_mxfp4_tools import bench_step

        print(bench_step.run(args.quick, args.repeats))
        return 0
    if args.device == "gpu":
        reason = gpu_unavailable_reason()
        if reason is not None:
            print(f"bench --device gpu: JAX sees no GPU here ({reason}); run it on a machine "
                  "with a CUDA or ROCm GPU and a jax built for it (README: Install)",
                  file=sys.stderr)
            return 2
        from jax_mxfp4_tools import bench_gpu

        print(bench_gpu.run(args.quick, args.repeats, not args.no_reference, args.cells))
        return 0
    with jax.default_device(jax.devices("cpu")[0]):
        results = run_cells(cpu_cells(args.quick), repeats=args.repeats,
                            reference=not args.no_reference)
    device = jax.devices("cpu")[0]
    print(f"jax {jax.__version__} on {device.platform} ({device.device_kind}); "
          f"median of up to {args.repeats} calls per cell")
    print(format_results(results))
    return 0
