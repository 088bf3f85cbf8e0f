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
page id.

The one-row index scorer's grid (``--index B,NB``: B rows of one request each, NB blocks, one
warp a block, as ``index_scores.plan`` lays out a small decode grid) gets three more:

* ``index chain``: each program loads its row's position and request, then its block's page
  id, then the page (8704 B), folded into one stored word: the scorer's loads and launch;
* ``index pages``: the same pages by their ids alone (no metadata, no table);
* ``index pages x4``: the same pages, four warps a program, a page a warp.

Run on the device (``bench/gpu_session.sh floor``)::

    python bench/latency_floor.py [--rows 1,8,32] [--index 32,64]
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import triton
import triton.language as tl

from jax_mxfp4._src.core import formats

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
    folded = _folded_page(pool_ptr, page, ok)
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


@triton.jit
def _folded_page(pool_ptr, page, ok):
    """One page's words (codes, then scales; none where not ``ok``) folded by xor."""
    base = pool_ptr.to(tl.pointer_type(tl.uint32)) + page.to(tl.int64) * WORDS
    codes = tl.load(base + tl.arange(0, CODE_WORDS), mask=ok, other=0)
    scales = tl.load(base + CODE_WORDS + tl.arange(0, SCALE_WORDS), mask=ok, other=0)
    return tl.reduce(codes, 0, _xor) ^ tl.reduce(scales, 0, _xor)


@triton.jit
def index_chain_kernel(pos_ptr, req_ptr, table_ptr, pool_ptr, out_ptr, W, NB):
    """Program ``(r, j)``: row ``r``'s position and request (in flight together), then block
    ``j``'s page id in the request's table row, then the page (masked past the position), as
    the one-row index scorer loads them; the page folded into one stored word."""
    r = tl.program_id(0)
    j = tl.program_id(1)
    pos = tl.load(pos_ptr + r)
    req = tl.load(req_ptr + r)
    ok = j * 128 <= pos
    page = tl.load(table_ptr + req.to(tl.int64) * W + j, mask=ok, other=0)
    tl.store(out_ptr + r * NB + j, _folded_page(pool_ptr, page, ok).to(tl.int32, bitcast=True))


@triton.jit
def index_pages_kernel(pos_ptr, pool_ptr, out_ptr, NB, PAGES_PER_PROGRAM: tl.constexpr):
    """Program ``(r, b)``: pages ``r * NB + b * PAGES_PER_PROGRAM ..`` (one per warp) by id
    alone, each folded into one stored word. The row's position is loaded beside them and
    masks them (every test position reaches every block): a probe's calls then differ in an
    input, so XLA does not merge them into one."""
    first = tl.program_id(0) * NB + tl.program_id(1) * PAGES_PER_PROGRAM
    ok = tl.load(pos_ptr + tl.program_id(0)) >= 0
    page = first + tl.arange(0, PAGES_PER_PROGRAM)[:, None]
    base = pool_ptr.to(tl.pointer_type(tl.uint32)) + page.to(tl.int64) * WORDS
    codes = tl.load(base + tl.arange(0, CODE_WORDS)[None, :], mask=ok, other=0)
    scales = tl.load(base + CODE_WORDS + tl.arange(0, SCALE_WORDS)[None, :], mask=ok, other=0)
    folded = tl.reduce(codes, 1, _xor) ^ tl.reduce(scales, 1, _xor)
    tl.store(out_ptr + first + tl.arange(0, PAGES_PER_PROGRAM),
             folded.to(tl.int32, bitcast=True))


def target(units: int = 132):
    from jax_mxfp4._src.core.targets import CUDA, Target

    return Target(CUDA, CUDA, "90", units)


def launches(rows: int, num_pages: int, tgt=None) -> dict:
    """The three probes' launches at ``rows`` rows over a pool of ``num_pages`` pages:
    ``{"empty": [...], "chain": [...], "chain+merge": [..., ...]}``, each step a ``(launch,
    result avals)`` pair that takes the previous step's results (the first: the probe's
    inputs)."""
    import jax.numpy as jnp
    from jax.core import ShapedArray

    from jax_mxfp4._src.triton import triton_call

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


def index_launches(rows: int, blocks: int, tgt=None) -> dict:
    """The one-row index probes' launches (one each) for ``rows`` rows of one request each
    over ``blocks`` blocks, on a pool of ``rows * blocks`` pages: ``{"index chain": ...,
    "index pages": ..., "index pages x4": ...}`` as :func:`launches` gives them. The chain
    takes (positions, requests, table, pool), the others (positions, pool)."""
    import jax.numpy as jnp
    from jax.core import ShapedArray

    from jax_mxfp4._src.triton import triton_call

    tgt = tgt or target()
    i32 = jnp.int32
    rows_aval, table = ShapedArray((rows,), i32), ShapedArray((rows, blocks), i32)
    pool = ShapedArray((rows * blocks, formats.PAGE_BYTES), jnp.uint8)
    out = ShapedArray((rows * blocks,), i32)
    chain = triton_call.launch(
        index_chain_kernel, tgt, grid=(rows, blocks, 1),
        buffers=("pos_ptr", "req_ptr", "table_ptr", "pool_ptr", "out_ptr"),
        avals=(rows_aval, rows_aval, table, pool, out),
        scalars={"W": np.int32(blocks), "NB": np.int32(blocks)}, constants={}, num_warps=1)
    probes = {"index chain": [(chain, (out,))]}
    for name, per_program in (("index pages", 1), ("index pages x4", 4)):
        pages = triton_call.launch(
            index_pages_kernel, tgt, grid=(rows, blocks // per_program, 1),
            buffers=("pos_ptr", "pool_ptr", "out_ptr"), avals=(rows_aval, pool, out),
            scalars={"NB": np.int32(blocks)}, constants={"PAGES_PER_PROGRAM": per_program},
            num_warps=per_program)
        probes[name] = [(pages, (out,))]
    return probes


def run_steps(steps, inputs) -> list:
    """The results of one probe's launches on ``inputs``, each launch as a custom call of the
    launcher (``launch.call``) on the previous one's results."""
    from jax_mxfp4._src.gpu import launch as launcher

    values = inputs
    for launch, result_avals in steps:
        values = launcher.call(launch, values, result_avals)
    return values


def measure(rows_list=(1, 8, 32), calls: int = 10) -> list[tuple[str, float]]:
    """(probe, device us per call) for every probe and row count, on the default GPU."""
    import jax
    import jax.numpy as jnp

    from jax_mxfp4_tools import bench_gpu

    rng = np.random.default_rng(0)
    out = []
    for rows in rows_list:
        num_pages = max(rows * PAGES, 1024)
        pool = jnp.asarray(rng.integers(0, 256, (num_pages, formats.PAGE_BYTES)), jnp.uint8)
        table = jnp.asarray(rng.integers(0, num_pages, rows * PAGES), jnp.int32)
        # one context array per call: XLA merges launches on the same inputs into one
        per_call = [jnp.full((rows,), PAGES * 128, jnp.int32) for _ in range(calls)]
        for name, steps in launches(rows, num_pages).items():
            if name == "empty":  # no inputs to tell its calls apart: one launch a call
                if rows == rows_list[0]:
                    timing = bench_gpu._timing(jax.jit(lambda s=steps: run_steps(s, ())), (),
                                               repeats=10, calls=1)
                    out.append((name, timing.device * 1e6))
                continue

            def many(table, pool, *per_call, steps=steps):
                return [run_steps(steps, (ctx, table, pool)) for ctx in per_call]

            timing = bench_gpu._timing(jax.jit(many), (table, pool, *per_call), repeats=10,
                                       calls=calls)
            out.append((f"{name} {rows}", timing.device * 1e6))
    return out


def measure_index(rows: int, blocks: int, calls: int = 10) -> list[tuple[str, float]]:
    """(probe, device us per call) for the one-row index probes (:func:`index_launches`), and
    the one-row scorer itself on the same grid and pool (the bench's decode cell: row ``t`` in
    request ``t`` at the context's last position, a bf16 query), timed alike."""
    import jax
    import jax.numpy as jnp

    import jax_mxfp4 as jm
    from jax_mxfp4_tools import bench_gpu

    rng = np.random.default_rng(0)
    pool = jnp.asarray(rng.integers(0, 256, (rows * blocks, formats.PAGE_BYTES)), jnp.uint8)
    table = jnp.asarray(rng.permutation(rows * blocks).reshape(rows, blocks), jnp.int32)
    positions = jnp.full((rows,), blocks * 128 - 1, jnp.int32)
    requests = jnp.arange(rows, dtype=jnp.int32)
    # one positions array per call: calls on the same inputs would be merged by XLA
    per_call = [jnp.array(positions) for _ in range(calls)]
    out = []
    for name, steps in index_launches(rows, blocks).items():

        def many(requests, table, pool, *per_call, steps=steps, chain=name == "index chain"):
            return [run_steps(steps, (pos, requests, table, pool) if chain else (pos, pool))
                    for pos in per_call]

        timing = bench_gpu._timing(jax.jit(many), (requests, table, pool, *per_call),
                                   repeats=10, calls=calls)
        out.append((f"{name} {rows}x{blocks}", timing.device * 1e6))
    queries = [jnp.asarray(rng.standard_normal((rows, 1, 128)), jnp.bfloat16)
               for _ in range(calls)]

    def scores(pool, table, positions, requests, *queries):
        return [jm.index_scores(q, pool, table, positions, requests, num_blocks=blocks,
                                sm_scale=128**-0.5) for q in queries]

    timing = bench_gpu._timing(jax.jit(scores), (pool, table, positions, requests, *queries),
                               repeats=10, calls=calls)
    out.append((f"index_scores {rows}x{blocks}", timing.device * 1e6))
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", default="1,8,32")
    parser.add_argument("--index", default="", help="B,NB: the one-row index probes")
    args = parser.parse_args(argv)
    rows = tuple(int(r) for r in args.rows.split(",")) if args.rows else ()
    print("probe | device us per call (CUPTI)")
    results = measure(rows) if rows else []
    if args.index:
        results += measure_index(*(int(n) for n in args.index.split(",")))
    for label, us in results:
        print(f"{label} | {us:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
