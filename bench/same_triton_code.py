"""Compile every Triton kernel the library launches and write each one's assembly to a folder:
the check that a refactor leaves the generated code unchanged. No GPU needed.

    python bench/same_triton_code.py OUT [--targets sm90,gfx942,gfx950] [--kernels NAME,..]
    diff -r BEFORE/sm90/code AFTER/sm90/code     # one run per tree, then compare

Each target lowers the shapes of the bench cells (``jax_mxfp4_tools.bench_gpu.cells``: index
decode and prefill, attention, write and select cells, mirrored here as shapes: :data:`CASES`)
and of ``tests/test_gpu_compile.py``'s cases (e4m3 queries, ``q_round="none"``, the
512K-block selection, sorted slots), exported as ``tests/test_gpu_compile.py`` does
(``jax.export`` under ``jm.lowering_options(gpu_arch=...)``): sm_90 with the default kernels
(Triton and the Gluon index tiles) and with ``cuda_kernels="triton"``; gfx942; gfx950 with
``gfx950_kernels="triton"`` (the Triton kernels that run there: every operation on request,
``select_blocks`` and ``q_round="none"`` always). The lowerings compile nothing: a stand-in
code object records each kernel specialization they ask for; each distinct one (kernel,
signature, constants, launch options) is then compiled once by Triton, in a fresh Triton
cache, and written as

* ``OUT/<target>/raw/<kernel>-<spec>.ptx`` (``.amdgcn``): Triton's assembly as it is;
* ``OUT/<target>/code/<kernel>-<spec>.ptx``: the same without its line info (``.loc`` and
  ``.file`` directives, the ``$L__tmp``/``.Ltmp`` labels only they refer to, the debug
  sections), which names source files,
  lines and columns, so it differs between trees whose code is the same;
* ``OUT/<target>/specs.txt``: each spec's signature, constants and options, and the cases
  that reach it; ``OUT/<target>/tree.txt``: the ``jax_mxfp4`` that was compiled.

``<spec>`` hashes the specialization only (not the kernel's source), so the same kernel has
the same file name in both trees. Every target runs in a process of its own (Triton keeps
state from the first AMD architecture a process compiles for: ``_compile_here_or_isolated``
in ``jax_mxfp4._src.triton.compiler``). To compile another tree, put it first on
``PYTHONPATH`` (with an editable install, also drop its finder: a ``sitecustomize.py`` that
removes the ``_editable`` entries from ``sys.meta_path``); the child processes inherit it.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGETS = {  # name -> (JAX platform, gpu_arch, other lowering options, option sets)
    "sm90": ("cuda", "90", [{}, {"cuda_kernels": "triton"}]),
    "gfx942": ("rocm", "gfx942", [{}]),
    "gfx950": ("rocm", "gfx950", [{"gfx950_kernels": "triton"}]),
}
SM = 128**-0.5
G, TOPK = 16, 16  # bench_gpu's q heads per kv head and selected pages


def _cases() -> dict:
    """name -> (fn, abstract args[, a context to lower it in]): the bench cells' shapes, then
    test_gpu_compile's, then specializations neither reaches."""
    import jax
    import jax.numpy as jnp

    import jax_mxfp4 as jm

    u8, i32, bf16, e4m3 = jnp.uint8, jnp.int32, jnp.bfloat16, jnp.float8_e4m3fn

    def s(*shape, dtype=bf16):
        return jax.ShapeDtypeStruct(shape, dtype)

    def index(requests, per_request, context, dtype=bf16, heads=1, **kw):
        blocks = -(-context // 128)
        rows = requests * per_request
        fn = lambda *a: jm.index_scores(*a, num_blocks=blocks, sm_scale=SM, **kw)  # noqa: E731
        return fn, (s(rows, heads, 128, dtype=dtype), s(requests * blocks, 8704, dtype=u8),
                    s(requests, blocks, dtype=i32), s(rows, dtype=i32), s(rows, dtype=i32))

    def attention(rows, output="bf16", dtype=bf16, quant=False, pages=None, width=TOPK):
        pages = pages or max(rows * TOPK, 1024)

        def fn(*a):
            out = jm.sparse_attention(*a, sm_scale=SM, output=output)
            return jm.quantize_mxfp8(out.reshape(rows, -1)) if quant else out

        kv = s(pages, 1, 8704, dtype=u8)
        return fn, (s(rows, G, 128, dtype=dtype), kv, kv, s(rows, 1, width, dtype=i32),
                    s(rows, 1, dtype=i32))

    def write(tokens, pages=None):
        pages = pages or max(1024, tokens // 64)
        return jm.write_cache, (s(pages, 1, 8704, dtype=u8), s(tokens, 1, 128),
                                s(tokens, dtype=i32))

    def select(rows, context, topk=TOPK, requests=None):
        blocks = -(-context // 128)
        fn = lambda *a: tuple(jm.select_blocks(*a, topk=topk))  # noqa: E731
        return fn, (s(1, rows, blocks, dtype=jnp.float32),
                    s(requests or rows, blocks, dtype=i32), s(rows, dtype=i32),
                    s(rows, dtype=i32))

    cases = {}
    for label, requests, per_request, context in (  # bench_gpu.cells: index decode
            ("b32 S1 H1 ctx 8K", 32, 1, 8192), ("b32 S1 H1 ctx 128K", 32, 1, 131072),
            ("b8 S4 H1 ctx 8K", 8, 4, 8192), ("b8 S4 H1 ctx 128K", 8, 4, 131072),
            ("b32 S8 H1 ctx 32K", 32, 8, 32768), ("b4 S1 H1 ctx 512K", 4, 1, 524288),
            ("b32 S1 H1 ctx 512K", 32, 1, 524288)):
        cases[f"index decode {label}"] = index(requests, per_request, context)
    for label, requests, per_request, context in (  # index prefill
            ("b1 q4096 ctx 8K", 1, 4096, 8192), ("b1 q4096 ctx 128K", 1, 4096, 131072),
            ("b4 q512 ctx 8K", 4, 512, 8192), ("b8 q2048 ctx 16K", 8, 2048, 16384),
            ("b32 q8 ctx 32K", 32, 8, 32768), ("chunk 32768 prefix 0", 1, 32768, 32768),
            ("chunk 32768 prefix 100K", 1, 32768, 32768 + 102400),
            ("b32 q96 ctx 8K", 32, 96, 8192)):
        cases[f"index prefill {label}"] = index(requests, per_request, context)
    for rows in (1, 8, 32, 128, 256):
        cases[f"attention {rows} rows x 16 pages"] = attention(rows)
    for n in (1, 2, 4, 8, 16, 24):
        cases[f"attention N={n} bf16"] = attention(8 * n)
        cases[f"attention N={n} bf16+quantize"] = attention(8 * n, quant=True)
        cases[f"attention N={n} fused mxfp8"] = attention(8 * n, "mxfp8")
    for tokens in (32, 4096, 16384):
        cases[f"write_cache {tokens} tokens"] = write(tokens)
    cases["select_blocks 32 rows ctx 128K"] = select(32, 131072)
    cases["select_blocks 4096 rows ctx 32K"] = select(4096, 32768)
    # tests/test_gpu_compile.py's cases (64 pages)
    cases["test write_cache"] = write(8, pages=64)
    cases["test write_cache_sorted_slots"] = write(5000, pages=64)
    cases["test index_decode"] = index(8, 1, 16 * 128)
    cases["test index_prefill"] = index(1, 512, 16 * 128)
    cases["test index_e4m3_q"] = index(2, 4, 16 * 128, dtype=e4m3, heads=2)
    cases["test index_q_round_none"] = index(8, 1, 16 * 128, q_round="none")
    cases["test select_blocks"] = select(8, 16 * 128)
    cases["test select_blocks_512K"] = select(3, 4096 * 128, topk=64, requests=2)
    cases["test attention_split"] = attention(2, pages=64)
    cases["test attention_mxfp8_direct"] = attention(512, "mxfp8", pages=64)
    cases["test attention_e4m3_q"] = attention(4, dtype=e4m3, pages=64)
    # specializations no case above reaches: the direct (one-split) attention kernel, a merge
    # of more splits than it takes unrolled, a split of two pages (plans'
    # TRITON_PAGES_PER_SPLIT, read when called), the one-row scorer's e4m3 query, bf16 dots
    # (q_round="none") on group and folded tiles, an e4m3 prefill tile, the rounding modes
    cases["attention direct bf16"] = attention(8, pages=64, width=1)
    cases["attention direct mxfp8"] = attention(8, "mxfp8", pages=64, width=1)
    cases["attention 32 splits"] = attention(8, pages=64, width=32)
    cases["attention 2 pages per split"] = (*attention(8, pages=64), _pages_per_split(2))
    cases["index decode e4m3 S1"] = index(8, 1, 16 * 128, dtype=e4m3)
    cases["index decode q_round none S4"] = index(8, 4, 16 * 128, q_round="none")
    cases["index prefill q_round none"] = index(1, 512, 16 * 128, q_round="none")
    cases["index prefill e4m3 H4"] = index(1, 512, 16 * 128, dtype=e4m3, heads=4)
    for mode in ("even", "down"):
        cases[f"write_cache round {mode}"] = (
            lambda p, x, t, mode=mode: jm.write_cache(p, x, t, round_mode=mode),
            write(8, pages=64)[1])
    return cases


@contextlib.contextmanager
def _pages_per_split(pages: int):
    """The Triton attention plan at ``pages`` pages a split (``plans.TRITON_PAGES_PER_SPLIT``,
    which the plan reads when called)."""
    from jax_mxfp4._src.core import plans

    saved = plans.TRITON_PAGES_PER_SPLIT
    plans.TRITON_PAGES_PER_SPLIT = pages
    try:
        yield
    finally:
        plans.TRITON_PAGES_PER_SPLIT = saved


def spec_name(spec) -> str:
    """``<kernel>-<hash of the specialization>``: the same for the same spec in any tree."""
    text = json.dumps([spec.signature, [(k, repr(v)) for k, v in spec.constants],
                       [spec.num_warps, spec.num_stages, spec.max_registers]])
    return f"{spec.fn.__name__}-{hashlib.sha256(text.encode()).hexdigest()[:12]}"


def collect(target_name: str) -> dict:
    """spec name -> (spec, compile target, [case names]) of every kernel the cases lower to."""
    import jax

    import jax_mxfp4 as jm
    from jax_mxfp4._src.gpu import launch
    from jax_mxfp4._src.triton import compiler

    platform, arch, option_sets = TARGETS[target_name]
    specs: dict = {}
    current = [""]

    def stand_in(spec, target):
        entry = specs.setdefault(spec_name(spec), (spec, target, []))
        entry[2].append(current[0])
        params = (*[t for _, t in spec.runtime_args()], "*i8", "*i8")
        return compiler.Compiled(code=b"\0", symbol=spec.fn.__name__, shared_mem=0,
                                 num_warps=spec.num_warps, warp_size=target.warp_size,
                                 param_types=params, code_hash="0" * 64)

    checks = [jax.export.DisabledSafetyCheck.custom_call(launch.TARGET)]
    real = compiler.compile_kernel
    compiler.compile_kernel = stand_in
    try:
        for options in option_sets:
            for name, (fn, args, *scope) in _cases().items():
                current[0] = f"{name} {options}" if options else name
                with jm.lowering_options(gpu_arch=arch, **options), \
                        (scope[0] if scope else contextlib.nullcontext()):
                    jax.export.export(jax.jit(fn), platforms=[platform],
                                      disabled_checks=checks)(*args)
    finally:
        compiler.compile_kernel = real
    return specs


_LINE_INFO = (
    re.compile(r"^\s*\.loc\s.*\n", re.M),
    re.compile(r"^\s*\.file\s.*\n", re.M),
    re.compile(r"^(?:\$L__tmp|\.Ltmp)\d+:\n", re.M),  # labels only the line info refers to
    # PTX debug sections: .section .debug_xxx { ... }
    re.compile(r"^\s*\.section\s+\.debug_\w+\s*\{.*?^\s*\}\n", re.M | re.S),
    # AMDGPU debug sections: from .section .debug_xxx to the next section or the metadata
    re.compile(r"^\s*\.section\s+\.debug_\w+.*?(?=^\s*\.(?:section|amdgpu_metadata)\b|\Z)",
               re.M | re.S),
)


def without_line_info(text: str) -> str:
    """Assembly text without the directives and sections that name source lines and files."""
    for pattern in _LINE_INFO:
        text = pattern.sub("", text)
    return text


def assembly(spec, target) -> tuple[str, str]:
    """``(suffix, text)``: the PTX or AMDGPU assembly of ``spec`` as the library's compile
    (``triton_compile``) makes it, taken from the kernel that ``triton.compile`` returns."""
    import triton

    from jax_mxfp4._src.triton import triton_compile as tc

    real, kernels = triton.compile, []

    def capturing(*args, **kwargs):
        kernels.append(real(*args, **kwargs))
        return kernels[-1]

    triton.compile = capturing
    try:
        tc.triton_compile(spec, target)
    finally:
        triton.compile = real
    if target.backend == "cuda":
        return "ptx", kernels[-1].asm["ptx"]
    return "amdgcn", kernels[-1].asm["amdgcn"]


def compile_all(target_name: str, out: Path, kernels: list[str]) -> int:
    """Compile every spec of ``target_name`` (of the kernels named ``kernels``, if any) and
    write its assembly under ``out``."""
    import triton

    import jax_mxfp4

    specs = {name: entry for name, entry in collect(target_name).items()
             if not kernels or entry[0].fn.__name__ in kernels}
    root = out / target_name
    (root / "raw").mkdir(parents=True, exist_ok=True)
    (root / "code").mkdir(parents=True, exist_ok=True)
    (root / "tree.txt").write_text(f"{jax_mxfp4.__file__}\ntriton {triton.__version__}\n")
    lines = []
    print(f"{target_name}: {len(specs)} kernel specializations", file=sys.stderr, flush=True)
    for i, (name, (spec, target, cases)) in enumerate(sorted(specs.items())):
        start = time.monotonic()
        suffix, text = assembly(spec, target)
        (root / "raw" / f"{name}.{suffix}").write_text(text)
        (root / "code" / f"{name}.{suffix}").write_text(without_line_info(text))
        lines.append(f"{name}: {list(spec.signature)} {list(spec.constants)} warps "
                     f"{spec.num_warps} stages {spec.num_stages} registers "
                     f"{spec.max_registers}\n    cases: {', '.join(cases)}")
        print(f"{target_name} [{i + 1}/{len(specs)}] {name} {time.monotonic() - start:.0f} s",
              file=sys.stderr, flush=True)
    (root / "specs.txt").write_text("\n".join(lines) + "\n")
    return len(specs)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--targets", default=",".join(TARGETS))
    parser.add_argument("--kernels", default="", help="only these kernels (function names, "
                        "comma-separated), e.g. attention_kernel,reduce_kernel")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    targets = args.targets.split(",")
    unknown = set(targets) - set(TARGETS)
    if unknown:
        parser.error(f"unknown targets {sorted(unknown)}; known: {list(TARGETS)}")
    if args.one:  # a child process: one target, in fresh caches
        compile_all(targets[0], args.out, list(filter(None, args.kernels.split(","))))
        return 0
    for target in targets:
        with tempfile.TemporaryDirectory() as cache:
            env = {**os.environ, "TRITON_CACHE_DIR": str(Path(cache) / "triton"),
                   "JAX_MXFP4_CACHE_DIR": str(Path(cache) / "jax_mxfp4")}
            subprocess.run([sys.executable, __file__, str(args.out), "--targets", target,
                            "--kernels", args.kernels, "--one"], env=env, check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
