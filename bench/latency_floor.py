"""How short a sparse-attention call at 1-32 rows can be: probe kernels with the attention
lowering's dependent loads and launches but none of its arithmetic, through the same launcher,
timed as the bench times a cell (CUPTI device time per call, ``bench_gpu._timing``).

* ``empty``: one program storing one word: a launch's own duration.
* ``chain R``: R x 16 programs (one per page, as a one-page split would take them), each
  loading its row's context and its page id (in flight together, as ``page_offset`` loads
  them), then the page (8704 B across 4 warps: the dependent load), storing one word.
* ``chain+merge R``: the chain, then a second launch of R x 4 programs that each load 16 of
  the first's words and store one (the merge's dependent load on the partials).

The split-K attention at R rows is at least ``chain+merge R``; a target below it is out of
reach of a two-launch plan, and one below ``chain R`` of any plan that loads a page after its
page id. Run on the device (``bench/gpu_session.sh floor``)::

    python bench/latency_floor.py [--rows 1,8,32]
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import triton
import triton.language as tl

from jax_mxfp4 import formats

PAGES = 16  # a row's selected pages (MiniMax-M3.1's top-16 blocks)
WORDS = tl.constexpr(formats.PAGE_BYTES // 4)  # uint32 words of a page
CODE_WORDS = tl.constexpr(formats.PAGE_SCALE_OFFSET // 4)  # its code words; the scales follow
SCALE_WORDS = tl.constexpr(WORDS - CODE_WORDS)


@triton.jit
def empty_kernel(out_ptr):
    tl.store(out_ptr + tl.program_id(0), 1)


@triton.jit
def chain_kernel(ctx_ptr, table_ptr, pool_ptr, out_ptr, NPAGES):
    """Program ``(r, p)``: row ``r``'s context and page id, then page ``p``'s words (masked
    past the context), folded into one stored word so no load is dead."""
    r = tl.program_id(0)
    p = tl.program_id(1)
    ctx = tl.load(ctx_ptr + r)
    page = tl.load(table_ptr + r * NPAGES + p)
    ok = p * 128 < ctx
    base = pool_ptr.to(tl.pointer_type(tl.uint32)) + page.to(tl.int64) * WORDS
    codes = tl.load(base + tl.arange(0, CODE_WORDS), mask=ok, other=0)
    scales = tl.load(base + CODE_WORDS + tl.arange(0, SCALE_WORDS), mask=ok, other=0)
    folded = tl.reduce(codes, 0, _xor) ^ tl.reduce(scales, 0, _xor)
    tl.store(out_ptr + r * NPAGES + p, folded.to(tl.int32, bitcast=True))


@triton.jit
def merge_kernel(part_ptr, out_ptr, NPAGES: tl.constexpr):
    """Program ``(r, c)``: row ``r``'s ``NPAGES`` words from :func:`chain_kernel`, folded and
    stored (the reduce kernel's grid: four programs per row)."""
    r = tl.program_id(0)
    words = tl.load(part_ptr + r * NPAGES + tl.arange(0, NPAGES))
    tl.store(out_ptr + r * 4 + tl.program_id(1), tl.reduce(words, 0, _xor))


@triton.jit
def _xor(a, b):
    return a ^ b


def target(units: int = 132):
    from jax_mxfp4.targets import CUDA, Target

    return Target(CUDA, CUDA, "90", units)


def launches(rows: int, num_pages: int, tgt=None) -> dict:
    """The three probes' launches at ``rows`` rows over a pool of ``num_pages`` pages:
    ``{"empty": [...], "chain": [...], "chain+merge": [..., ...]}``, each step a ``(launch,
    result avals)`` pair that takes the previous step's results (the first: the probe's
    inputs)."""
    import jax.numpy as jnp
    from jax.core import ShapedArray

    from jax_mxfp4.gpu import triton_call

    tgt = tgt or target()
    i32 = jnp.int32
    ctx, table = ShapedArray((rows,), i32), ShapedArray((rows * PAGES,), i32)
    pool = ShapedArray((num_pages, formats.PAGE_BYTES), jnp.uint8)
    words, merged, one = (ShapedArray((rows * PAGES,), i32), ShapedArray((rows * 4,), i32),
                          ShapedArray((1,), i32))
    empty = triton_call.launch(empty_kernel, tgt, grid=(1, 1, 1), buffers=("out_ptr",),
                               avals=(one,), scalars={}, constants={})
    chain = triton_call.launch(
        chain_kernel, tgt, grid=(rows, PAGES, 1),
        buffers=("ctx_ptr", "table_ptr", "pool_ptr", "out_ptr"), avals=(ctx, table, pool, words),
        scalars={"NPAGES": np.int32(PAGES)}, constants={})
    merge = triton_call.launch(merge_kernel, tgt, grid=(rows, 4, 1),
                               buffers=("part_ptr", "out_ptr"), avals=(words, merged),
                               scalars={}, constants={"NPAGES": PAGES})
    return {"empty": [(empty, (one,))], "chain": [(chain, (words,))],
            "chain+merge": [(chain, (words,)), (merge, (merged,))]}


def run_steps(steps, inputs) -> list:
    """The results of one probe's launches on ``inputs``, each launch as a custom call of the
    launcher (``launch.call``) on the previous one's results."""
    from jax_mxfp4.gpu import launch as launcher

    values = inputs
    for launch, result_avals in steps:
        values = launcher.call(launch, values, result_avals)
    return values


def measure(rows_list=(1, 8, 32), calls: int = 10) -> list[tuple[str, float]]:
    """(probe, device us per call) for every probe and row count, on the default GPU."""
    import jax
    import jax.numpy as jnp

    from jax_mxfp4 import bench_gpu

    rng = np.random.default_rng(0)
    out = []
    for rows in rows_list:
        num_pages = max(rows * PAGES, 1024)
        pool = jnp.asarray(rng.integers(0, 256, (num_pages, formats.PAGE_BYTES)), jnp.uint8)
        table = jnp.asarray(rng.integers(0, num_pages, rows * PAGES), jnp.int32)
        ctx = jnp.full((rows,), PAGES * 128, jnp.int32)
        for name, steps in launches(rows, num_pages).items():
            if name == "empty" and rows != rows_list[0]:
                continue

            def many(*args, steps=steps):
                return [run_steps(steps, args) for _ in range(calls)]

            args = () if name == "empty" else (ctx, table, pool)
            timing = bench_gpu._timing(jax.jit(many), args, repeats=10, calls=calls)
            label = name if name == "empty" else f"{name} {rows}"
            out.append((label, timing.device * 1e6))
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", default="1,8,32")
    args = parser.parse_args(argv)
    rows = tuple(int(r) for r in args.rows.split(","))
    print("probe | device us per call (CUPTI)")
    for label, us in measure(rows):
        print(f"{label} | {us:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
