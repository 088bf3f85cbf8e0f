"""Where GPU time goes: a device-session diagnostic (run by ``bench/gpu_session.sh diagnose``).

1. e4m3 rounding of a bf16 query by the reference lowering on the GPU vs numpy (ml_dtypes),
   with and without the optimization barrier (XLA's excess-precision pass).
2. The bench harness floor: a jit of 10 trivial ops timed exactly as the bench times a cell.
3. CUPTI kernel times (``jax.profiler`` trace) of selected bench cells by kernel, next to the
   bench's wall time per call.

``--probes`` instead times write_cache's kernel with and without its last-writer scan, and
the attention kernel at 4 and 8 warps (``--attention-variants``: that alone, at 1 and 2 pages
per split too); ``--index-variants`` the index scorer's decode tilings;
``--fold-variants`` its prefill tilings (group dots or folded keys, 64 or 128 rows);
``--select-variants`` select_blocks at several rows per program and warps;
``--split-plans`` the sparse-attention decode cells through the whole lowering (split kernel
and merge, CUPTI device time by kernel) at one and at two pages per split and at 4, 2 and 1
MXFP8 blocks per merge program, interleaved; ``--row-plans`` the S = 1 index cells at one
and at two blocks per one-row program and as the plan picks (``index_scores.ONE_ROW_PAIRS``),
interleaved.
"""

from __future__ import annotations

import functools
import sys
import time

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from jax_mxfp4._src.core.targets import CUDA, DEFAULT_UNITS
from jax_mxfp4._src.dispatch.backend import backend_scope
from jax_mxfp4._src.ops.index_scores.reference import scoring_query
from jax_mxfp4_tools import bench_gpu

H200_SMS = DEFAULT_UNITS[CUDA]


def e4m3_check() -> None:
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((4096, 128)) * np.exp(rng.normal(0, 3, (4096, 1)))).astype(
        ml_dtypes.bfloat16
    )
    want = np.clip(x.astype(np.float32), -448, 448).astype(ml_dtypes.float8_e4m3fn)
    want = want.astype(np.float32)
    plain = jax.jit(
        lambda x: jnp.clip(x.astype(jnp.float32), -448, 448).astype(jnp.float8_e4m3fn)
        .astype(jnp.float32))(x)
    barrier = jax.jit(lambda x: scoring_query(x[:, None, :], "e4m3")[:, 0])(x)
    for name, got in (("astype chain", plain), ("with barrier", barrier)):
        bad = np.sum(np.asarray(got).view(np.uint32) != want.view(np.uint32))
        print(f"e4m3 rounding on {jax.devices()[0].platform}, {name}: {bad} of {want.size} "
              "elements differ from numpy")


def _time(fn, args) -> float:
    """Median seconds of one blocking execution, as the bench times a cell."""
    return bench_gpu._time(fn, args, repeats=20, calls=1)


def harness_floor() -> None:
    xs = [jnp.full((4,), float(i)) for i in range(10)]
    many = jax.jit(lambda *a: [x + 1 for x in a])
    compiled = many.lower(*xs).compile()
    t_c, t_j = _time(compiled, xs), _time(many, xs)
    n = 50
    jax.block_until_ready(many(*xs))
    t0 = time.perf_counter()
    for _ in range(n):
        out = many(*xs)
    jax.block_until_ready(out)
    t_p = (time.perf_counter() - t0) / n
    print(f"harness floor, 10 trivial ops: Compiled call {t_c * 1e6:.1f} us, jit call "
          f"{t_j * 1e6:.1f} us, pipelined jit call {t_p * 1e6:.1f} us (per executable)")


def profile_cell(cell, calls=10) -> None:
    if PLAIN:  # under ncu, which owns CUPTI: just run the kernels
        rng = np.random.default_rng(0)
        fn, varying, shared = cell.make(rng, calls)
        args = (*varying[0], *shared)
        with backend_scope("auto"):
            compiled = jax.jit(fn).lower(*args).compile()
        print(f"== {cell.group} {cell.label}: wall {_time(compiled, args) * 1e6:.1f} us")
        return
    t = bench_gpu._measure(cell, np.random.default_rng(0), 20, calls, "auto")
    print(f"\n== {cell.group} {cell.label}: wall {t.wall * 1e6:.1f} us/call, GPU "
          f"{t.device * 1e6:.1f} us/call")
    for name, dur in sorted(t.kernels.items(), key=lambda kv: -kv[1])[:6]:
        print(f"   {dur * 1e6:9.2f} us/call  {name[:70]}")


def write_dedup_cost(tokens=(32, 4096, 16384), device: str = "cuda", timer=None) -> None:
    """write_cache's kernel with and without its last-writer scan (``DEDUP``), launched by
    Triton on torch tensors and timed with ``triton.testing.do_bench`` (distinct slots, so
    both variants write the same bytes)."""
    import torch
    import triton

    from jax_mxfp4._src.ops.write_cache import triton as kernels

    timer = timer or (lambda fn: triton.testing.do_bench(fn, warmup=10, rep=50) * 1e3)
    for t in tokens:
        pages = max(1024, t // 64)
        pool = torch.zeros((pages, 1, 8704), dtype=torch.uint8, device=device)
        x = torch.randn((t, 1, 128), device=device).to(torch.bfloat16)
        slots = torch.randperm(pages * 128, device=device)[:t].to(torch.int32)
        kernel = kernels.write_cache_kernel[kernels.grid(t)]
        args = (pool, x, slots, pool, t, 1, pages)
        times = [timer(functools.partial(kernel, *args, ROUND=0, ROWS=kernels.rows_per_program(t),
                                         SCAN=256, DEDUP=dedup)) for dedup in (True, False)]
        print(f"write_cache {t} tokens: {times[0]:.1f} us with the last-writer scan, "
              f"{times[1]:.1f} us without")


def attention_warps(device: str = "cuda", timer=None, sizes=(1, 8, 32, 256)) -> None:
    """attention_kernel at 4 and 8 warps and 1 or 2 pages per split, side by side (Triton
    launches on torch tensors, ``triton.testing.do_bench``): the split partials of 1 .. 256
    rows x 16 pages (the merge kernel not included)."""
    import torch
    import triton

    from jax_mxfp4._src.ops.sparse_attention import triton as kernels

    timer = timer or (lambda fn: triton.testing.do_bench(fn, warmup=10, rep=50) * 1e3)
    gen = torch.Generator().manual_seed(0)
    pages = 4096
    pool = torch.randint(0, 256, (pages, 1, 8704), dtype=torch.uint8, generator=gen)
    pool[..., 8192:] = torch.randint(120, 132, (pages, 1, 512), dtype=torch.uint8,
                                     generator=gen)
    pool = pool.to(device)
    for rows in sizes:
        q = torch.randn((rows, 16, 128), generator=gen).to(torch.bfloat16).to(device)
        table = torch.randint(0, pages, (rows, 16), dtype=torch.int32, generator=gen).to(device)
        ctx = torch.full((rows,), 16 * 128, dtype=torch.int32, device=device)
        parts = rows * 16 * 16
        o = torch.empty((parts * 128,), dtype=torch.bfloat16, device=device)
        m = torch.empty((parts,), dtype=torch.float32, device=device)
        l_ = torch.empty((parts,), dtype=torch.float32, device=device)
        results = []
        for per_split in (2, 1):
            splits = 16 // per_split
            for warps in (4, 8):
                kernel = kernels.attention_kernel[(rows, splits, 1)]
                t = timer(functools.partial(
                    kernel, q, pool, pool, table, ctx, o, o, m, l_, 1, pages, 16, 128**-0.5,
                    G=16, GP=16, PAGES=per_split, SPLITS=splits, Q_IS_FP8=False,
                    MXFP8=False, PTX=True, num_warps=warps))
                results.append(f"{per_split} pages/split {warps} warps {t:.1f} us")
        print(f"attention_kernel {rows} rows x 16 pages: " + ", ".join(results), flush=True)


def _index_inputs(b: int, s: int, nb: int, prefix: int, gen, device: str) -> dict:
    """Torch inputs of index_scores_kernel: ``b`` requests of ``s`` rows over ``nb`` blocks
    each (one index head, distinct pages, scale bytes 120..131); a request's rows sit at
    positions ``prefix ..`` or, with ``prefix = -1``, end at its context's end."""
    import torch

    t, pages = b * s, b * nb
    pool = torch.randint(0, 256, (pages, 8704), dtype=torch.uint8, generator=gen)
    pool[:, 8192:] = torch.randint(120, 132, (pages, 512), dtype=torch.uint8, generator=gen)
    local = torch.arange(t, dtype=torch.int32) % s
    return {
        "q": torch.randn((t, 1, 128), generator=gen).to(torch.bfloat16).to(device),
        "pool": pool.to(device),
        "table": torch.randperm(pages, generator=gen).to(torch.int32).reshape(b, nb).to(device),
        "pos": (local + (nb * 128 - s if prefix < 0 else prefix)).to(torch.int32).to(device),
        "req": (torch.arange(t, dtype=torch.int32) // s).to(device),
        "out": torch.empty((1, t, nb), dtype=torch.float32, device=device),
        "T": t, "B": b, "W": nb, "P": pages, "NB": nb,
    }


def _index_launch(plan, inputs: dict):
    """A zero-argument launch of index_scores_kernel with ``plan`` on ``inputs`` (bf16 query
    rounded to e4m3, fp16 dots)."""
    import triton.language as tl

    from jax_mxfp4._src.ops.index_scores import triton_kernel as kernels

    a = inputs
    return functools.partial(
        kernels.index_scores_kernel[plan.grid], a["q"], a["pool"], a["table"], a["pos"], a["req"],
        a["out"], a["T"], a["B"], a["W"], a["P"], a["NB"], 1.0, H=1, ROWS=plan.rows, M=plan.m,
        BLOCKS=plan.blocks, Q_IS_FP8=False, ROUND_Q=True, DOT_DTYPE=tl.float16,
        ONE_ROW=plan.one_row, FOLD=plan.fold, PTX=True, num_warps=plan.num_warps)


def index_variants(device: str = "cuda", timer=None,
                   shapes=((32, 1, 1024), (4, 1, 4096), (32, 1, 64), (8, 4, 1024))) -> None:
    """index_scores_kernel's decode tilings side by side (Triton launches on torch tensors,
    ``triton.testing.do_bench``): the 16-row tensor-core tile, and for one row per tile the
    CUDA-core scoring at 1, 2 or 4 blocks per program and 2, 4 or 8 warps. Shapes: (requests
    B, rows per request S, blocks per request); one index head, rows at the context's end."""
    import dataclasses

    import torch
    import triton

    from jax_mxfp4._src.ops.index_scores import triton as kernels

    timer = timer or (lambda fn: triton.testing.do_bench(fn, warmup=10, rep=50) * 1e3)
    gen = torch.Generator().manual_seed(0)
    for b, s, nb in shapes:
        inputs = _index_inputs(b, s, nb, -1, gen, device)
        t, pages = inputs["T"], inputs["P"]
        base = kernels.plan(t, 1, b, nb, H200_SMS)
        variants = {"tensor cores": dataclasses.replace(base.with_blocks(1, nb), one_row=False)}
        if base.one_row:
            for blocks in (1, 2, 4):
                for warps in (2, 4, 8):
                    variants[f"cuda cores {blocks} blk {warps} w"] = dataclasses.replace(
                        base.with_blocks(blocks, nb), num_warps=warps)
        times = [timer(_index_launch(plan, inputs)) for plan in variants.values()]
        gbs = [pages * 68 * 128 / (x * 1e-6) / 1e9 for x in times]
        rows = zip(variants, times, gbs, strict=True)
        print(f"index_scores b{b} S{s} {nb} blocks (plan: {base.blocks} blk): "
              + ", ".join(f"{name} {x:.1f} us ({g:.0f} GB/s)" for name, x, g in rows))


def index_fold_variants(device: str = "cuda", timer=None,
                        shapes=((1, 4096, 64, 4096), (4, 512, 64, 7680), (1, 4096, 64, 0),
                                (8, 2048, 128, 14336), (8, 4, 1024, -1))) -> None:
    """index_scores_kernel's prefill tilings side by side (Triton launches on torch tensors,
    ``triton.testing.do_bench``): four rescaled group dots on 64-row tiles (the tiling before
    folded keys), folded keys on 64-row and on 128-row tiles. Shapes: (requests B, rows per
    request, blocks per request, prefix: rows sit at positions prefix .. prefix + rows - 1, or
    -1: at the context's end); one index head."""
    import dataclasses

    import torch
    import triton

    from jax_mxfp4._src.ops.index_scores import triton as kernels

    timer = timer or (lambda fn: triton.testing.do_bench(fn, warmup=10, rep=50) * 1e3)
    gen = torch.Generator().manual_seed(0)
    for b, s, nb, prefix in shapes:
        inputs = _index_inputs(b, s, nb, prefix, gen, device)
        t = inputs["T"]
        planned = kernels.plan(t, 1, b, nb)
        plans = {}
        if planned.fold:
            rows = 64
            grid = (triton.cdiv(t, rows), planned.grid[1], 1)
            folded = dataclasses.replace(planned, rows=rows, m=rows, grid=grid)
            plans["groups 64 rows"] = dataclasses.replace(folded, fold=False)
            plans["folded 64 rows"] = folded
            plans[f"folded {planned.rows} rows (plan)"] = planned
        results = [f"{label} {timer(_index_launch(plan, inputs)):.1f} us"
                   for label, plan in plans.items()]
        print(f"index_scores b{b} rows/request {s} {nb} blocks prefix {prefix}: "
              + ", ".join(results), flush=True)


def select_variants(device: str = "cuda", timer=None,
                    shapes=((4096, 256, 16), (32, 1024, 16), (32, 4096, 16), (4096, 256, 64)),
                    old=None) -> None:
    """select_blocks_kernel at its plan and at other rows per program / warps (Triton launches
    on torch tensors, ``triton.testing.do_bench``); ``old``: a module holding an earlier
    ``select_blocks_kernel`` (one row per program, no ROWS) timed beside it. Shapes: (rows,
    blocks per row, topk); one head, every row at its context's end."""
    import torch
    import triton

    from jax_mxfp4._src.ops.select_blocks import triton as kernels

    timer = timer or (lambda fn: triton.testing.do_bench(fn, warmup=10, rep=50) * 1e3)
    gen = torch.Generator().manual_seed(0)
    for rows, nb, topk in shapes:
        scores = torch.randn((1, rows, nb), generator=gen).to(device)
        table = torch.randint(0, 1 << 20, (rows, nb), generator=gen, dtype=torch.int32).to(device)
        pos = torch.full((rows,), nb * 128 - 1, dtype=torch.int32, device=device)
        req = torch.arange(rows, dtype=torch.int32, device=device)
        outs = (torch.empty((1, rows, topk), dtype=torch.int32, device=device),
                torch.empty((rows, 1, topk), dtype=torch.int32, device=device),
                torch.empty((rows, 1), dtype=torch.int32, device=device))
        args = (scores, table, pos, req, *outs, rows, rows, nb, nb, 0, 1)
        plan = kernels.plan(rows, nb, topk)
        results = []
        if old is not None:
            fn = functools.partial(old.select_blocks_kernel[(rows, 1, 1)], *args, H=1,
                                   NBP=kernels.padded(nb), TOPK=topk, KP=kernels.padded(topk),
                                   num_warps=4 if nb <= 2048 else 8)
            results.append(f"arg-max passes {timer(fn):.1f} us")
        for per_program in sorted({plan.rows_per_program, max(1, plan.rows_per_program // 4),
                                   plan.rows_per_program * 2}):
            for warps in sorted({plan.num_warps, max(1, plan.num_warps // 2),
                                 min(8, plan.num_warps * 2)}):
                grid = (triton.cdiv(rows, per_program), 1, 1)
                fn = functools.partial(
                    kernels.select_blocks_kernel[grid], *args, H=1, NBP=plan.blocks, TOPK=topk,
                    KP=plan.selections, ROWS=per_program, num_warps=warps)
                mark = " (plan)" if (per_program, warps) == (plan.rows_per_program,
                                                              plan.num_warps) else ""
                results.append(f"{per_program} rows {warps} w{mark} {timer(fn):.1f} us")
        print(f"select_blocks {rows} rows x {nb} blocks top-{topk}: " + ", ".join(results),
              flush=True)


def _attention_cells(label: str, rows) -> None:
    """The bench's attention decode cells (rows x 16 pages), CUPTI time per kernel."""
    for n in rows:
        cell = bench_gpu.attention_cell(f"{n} rows x 16 pages", n)
        t = bench_gpu._measure(cell, np.random.default_rng(0), 10, 10, "auto")
        parts = ", ".join(f"{name.split('_kernel')[0]} {dur * 1e6:.1f}"
                          for name, dur in sorted(t.kernels.items()))
        print(f"{label} {n} rows: {t.device * 1e6:.1f} us ({parts})", flush=True)


def split_plans(per_split=(2, 1), blocks=(4, 2, 1), rounds: int = 2,
                rows=(1, 8, 32, 128, 256)) -> None:
    """The bench's sparse-attention decode cells (rows x 16 pages) lowered with
    ``plans.TRITON_PAGES_PER_SPLIT`` set to each of ``per_split`` and
    ``sparse_attention.REDUCE_BLOCKS`` to each of ``blocks`` in turn (the lowering reads both
    when a call is lowered, so each setting compiles its own kernels), ``rounds`` times
    interleaved: CUPTI device time per call by kernel, the split kernel and its merge side by
    side. The constants are restored afterwards."""
    from jax_mxfp4._src.core import plans
    from jax_mxfp4._src.ops.sparse_attention import triton as sparse_attention

    saved = plans.TRITON_PAGES_PER_SPLIT, sparse_attention.REDUCE_BLOCKS
    try:
        for r in range(rounds):
            for pages in per_split:
                for per_program in blocks:
                    plans.TRITON_PAGES_PER_SPLIT = pages
                    sparse_attention.REDUCE_BLOCKS = per_program
                    _attention_cells(f"round {r} {pages} pages/split, {per_program} blocks/"
                                     f"merge program,", rows)
    finally:
        plans.TRITON_PAGES_PER_SPLIT, sparse_attention.REDUCE_BLOCKS = saved


ROW_PLAN_CELLS = ((8, 8192), (16, 8192), (24, 8192), (28, 8192), (32, 8192), (32, 16384),
                  (32, 32768), (32, 40960), (32, 65536), (1, 131072), (32, 131072), (4, 524288),
                  (32, 524288))
"""(requests, context) of the S = 1 index cells ``row_plans`` times: 4 to 993 blocks per
SM on the H200, both ends of ``index_scores.ONE_ROW_PAIRS`` among them."""


def row_plans(rounds: int = 2) -> None:
    """The S = 1 index cells of :data:`ROW_PLAN_CELLS` with one block per one-row program
    everywhere, two everywhere, and as the plan picks (``index_scores.ONE_ROW_PAIRS``, read
    when a call is lowered), ``rounds`` times interleaved, CUPTI device time per call. The
    constant is restored afterwards."""
    from jax_mxfp4._src.ops.index_scores import triton as index_scores

    never, always = (1 << 30, 1 << 30), (0, 1 << 30)
    cells = [bench_gpu.index_cell(f"b{b} S1 H1 ctx {c // 1024}K", b, 1, c)
             for b, c in ROW_PLAN_CELLS]
    saved = index_scores.ONE_ROW_PAIRS
    try:
        for r in range(rounds):
            for name, pairs in (("one block", never), ("two blocks", always), ("plan", saved)):
                index_scores.ONE_ROW_PAIRS = pairs
                for cell in cells:
                    t = bench_gpu._measure(cell, np.random.default_rng(0), 10, 10, "auto")
                    print(f"round {r} {name} {cell.label}: {t.device * 1e6:.2f} us", flush=True)
    finally:
        index_scores.ONE_ROW_PAIRS = saved


PLAIN = "--plain" in sys.argv


def main() -> int:
    if "--probes" in sys.argv:
        write_dedup_cost()
        attention_warps()
        return 0
    variants = {"--attention-variants": attention_warps, "--index-variants": index_variants,
                "--fold-variants": index_fold_variants,
                "--split-plans": split_plans, "--row-plans": row_plans}
    for flag, run in variants.items():
        if flag in sys.argv:
            run()
            return 0
    if "--select-variants" in sys.argv:
        old = None
        if "--old-select" in sys.argv:  # a module file given after the flag
            import importlib.util
            path = sys.argv[sys.argv.index("--old-select") + 1]
            spec = importlib.util.spec_from_file_location("old_select", path)
            old = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(old)
        select_variants(old=old)
        return 0
    e4m3_check()
    harness_floor()
    wanted = {a for a in sys.argv[1:] if a != "--plain"} or {
        "32 tokens", "1 rows x 16 pages", "256 rows x 16 pages", "b32 S1 H1 ctx 128K",
        "b1 q4096 ctx 8K", "32 rows ctx 128K", "N=8 fused mxfp8", "N=8 bf16+quantize",
    }
    names = set()
    for cell in bench_gpu.cells():
        if cell.label in wanted and cell.label not in names:
            names.add(cell.label)
            profile_cell(cell)
    return 0


if __name__ == "__main__":
    sys.exit(main())
