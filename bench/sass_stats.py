"""Static SASS profile of the GPU kernels, on a machine without a GPU.

Exports a few of the bench's shapes for CUDA sm_90 (``jax.export`` under
``jm.lowering_options(gpu_arch=90)``, as ``tests/test_gpu_compile.py`` does), records every
Triton kernel the lowering compiles, and disassembles each cubin with the ``nvdisasm`` and
``cuobjdump`` that ship with Triton. Per kernel: registers, stack and shared memory per
program, and the instruction mix. Counts are static (a loop body counts once), and fewer
instructions is not always faster (bench/history/2026-11-29.md has a counter-example: the page
as the dots' left operand, fewer SASS instructions and slower): use it to choose
what to time on the device, not instead of timing.

    python bench/sass_stats.py [CASE ...]      # default: every case
    python bench/sass_stats.py --tree REV [CASE ...]   # a prepared tree's kernels instead
                                                       # (bench/ab_trees.py prepare REV)
    python bench/sass_stats.py [--tree REV] --loads [CASE ...]  # each global load's place
"""

from __future__ import annotations

import collections
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp

import jax_mxfp4 as jm
from jax_mxfp4._src.gpu import launch
from jax_mxfp4._src.triton import compiler

SM = 128**-0.5
u8, i32 = jnp.uint8, jnp.int32


def _s(*shape, dtype=jnp.bfloat16):
    return jax.ShapeDtypeStruct(shape, dtype)


def _index(rows, per_request, blocks):
    requests = rows // per_request
    fn = lambda *a: jm.index_scores(*a, num_blocks=blocks, sm_scale=SM)  # noqa: E731
    return fn, (_s(rows, 1, 128), _s(requests * blocks, 8704, dtype=u8),
                _s(requests, blocks, dtype=i32), _s(rows, dtype=i32), _s(rows, dtype=i32))


def _attention(rows, output="bf16"):
    fn = lambda *a: jm.sparse_attention(*a, sm_scale=SM, output=output)  # noqa: E731
    kv = _s(4096, 1, 8704, dtype=u8)
    return fn, (_s(rows, 16, 128), kv, kv, _s(rows, 1, 16, dtype=i32), _s(rows, 1, dtype=i32))


CASES = {
    "index decode b32 S1 ctx 128K": _index(32, 1, 1024),
    "index decode b8 S4 ctx 128K": _index(32, 4, 1024),
    "index prefill b1 q4096 ctx 8K": _index(4096, 4096, 64),
    "attention 1 row": _attention(1),
    "attention 256 rows": _attention(256),
    "attention 256 rows mxfp8": _attention(256, "mxfp8"),
    "select_blocks 4096 rows ctx 32K": (
        lambda *a: jm.select_blocks(*a, topk=16),
        (_s(1, 4096, 256, dtype=jnp.float32), _s(1, 256, dtype=i32), _s(4096, dtype=i32),
         _s(4096, dtype=i32))),
    "write_cache 4096 tokens": (
        jm.write_cache, (_s(4096, 1, 8704, dtype=u8), _s(4096, 1, 128), _s(4096, dtype=i32))),
}


def _tool(name: str) -> str:
    from triton.backends.nvidia import compiler as nvidia

    return str(Path(nvidia.__file__).parent / "bin" / name)


def kernels_of(fn, args) -> list[compiler.Compiled]:
    """The kernels the GPU lowering of ``fn(*args)`` compiles for sm_90, in launch order."""
    seen: list[compiler.Compiled] = []
    compile_kernel = compiler.compile_kernel

    def recording(spec, target):
        seen.append(compile_kernel(spec, target))
        return seen[-1]

    compiler.compile_kernel = recording
    try:
        checks = [jax.export.DisabledSafetyCheck.custom_call(launch.TARGET)]
        with jm.lowering_options(gpu_arch=90):
            jax.export.export(jax.jit(fn), platforms=["cuda"], disabled_checks=checks)(*args)
    finally:
        compiler.compile_kernel = compile_kernel
    return seen


def _on_cubin(kernel: compiler.Compiled, tool: str, *args: str) -> str:
    """The output of one of Triton's CUDA tools (``nvdisasm``, ``cuobjdump``) on a cubin."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.code)
        f.flush()
        return subprocess.run([_tool(tool), *args, f.name], capture_output=True, text=True,
                              check=True).stdout


_PREDICATE = re.compile(r"^@!?U?P\w+\s+")


def sass(kernel: compiler.Compiled) -> list[str]:
    """The instructions of one cubin (nvdisasm), one string each, in program order, without
    their predicates (``@P0``, ``@!UP1``)."""
    text = _on_cubin(kernel, "nvdisasm", "-c")
    return [_PREDICATE.sub("", m.group(1).strip())
            for m in re.finditer(r"^\s+/\*[0-9a-f]+\*/\s+(.*?)\s*;", text, re.M)]


def profile(kernel: compiler.Compiled) -> tuple[dict[str, str], collections.Counter]:
    """Resource usage (REG, STACK, SHARED, ...) and opcode counts (the opcode without its
    ``.`` modifiers) of one cubin."""
    usage = _on_cubin(kernel, "cuobjdump", "--dump-resource-usage")
    resources = dict(re.findall(r"(REG|STACK|SHARED|LOCAL):(\d+)", usage))
    ops = collections.Counter(re.match(r"[A-Z0-9_]*", i).group(0) for i in sass(kernel))
    return resources, ops


_REG = re.compile(r"\bR(\d+)\b")
_WIDTH = {"64": 2, "128": 4}


def _written(instruction: str) -> set[int]:
    """Registers a load writes: its first operand and, for a 64- or 128-bit load, the ones
    after it."""
    op, _, operands = instruction.partition(" ")
    first = _REG.search(operands)
    if first is None:
        return set()
    size = next((n for bits, n in _WIDTH.items() if op.endswith("." + bits)), 1)
    return set(range(int(first.group(1)), int(first.group(1)) + size))


def load_schedule(instructions: list[str]) -> list[dict]:
    """Each global load (``LDG``) of a kernel: its index in the program, its text, and whether a
    shared-memory store of data an earlier global load brought (``STS``/``STSM`` of one of its
    registers, not overwritten since) comes before it. ptxas issues no load past such a store
    (its data must have arrived first), so a load flagged here waits one round trip for another
    load (docs/notes.md, "ptxas issues no global load ahead of a shared-memory store of loaded
    data"; bench/history/2026-12-04.md, twenty-fourth session). Static and approximate: a
    register is taken as loaded data from its load to its next write."""
    loaded: set[int] = set()
    stored_loaded = False
    out = []
    for i, instruction in enumerate(instructions):
        body = _PREDICATE.sub("", instruction)
        op = body.split(" ", 1)[0]
        if op.startswith("LDG"):
            out.append({"index": i, "text": body, "after_shared_store": stored_loaded})
            loaded |= _written(body)
        elif op.startswith(("STS", "STSM")):
            data = {int(r) for r in _REG.findall(body.split("]", 1)[-1])}
            stored_loaded = stored_loaded or bool(data & loaded)
        elif op not in ("BAR", "NOP") and (first := _REG.search(body.partition(" ")[2])):
            loaded.discard(int(first.group(1)))  # the register is written with other data
    return out


def main(argv: list[str]) -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import ab_trees

    modules = None  # ab_trees.lowering_from(None) leaves this tree's kernels in place
    if argv[:1] == ["--tree"]:
        modules, argv = ab_trees.tree_modules(argv[1]), argv[2:]
    loads = argv[:1] == ["--loads"]
    if loads:
        argv = argv[1:]
    names = argv or list(CASES)
    unknown = [n for n in names if n not in CASES]
    if unknown:
        print(f"unknown case(s) {unknown}; known: {list(CASES)}", file=sys.stderr)
        return 2
    header = f"{'case':32} {'kernel':22} {'warps':>5} {'regs':>4} {'stack':>5} {'smem':>6} " \
             f"{'instrs':>6}  top opcodes"
    if not loads:
        print(header)
        print("-" * len(header))
    for name in names:
        print(f"sass_stats: compiling {name}", file=sys.stderr)
        with ab_trees.lowering_from(modules):
            kernels = kernels_of(*CASES[name])
        for kernel in kernels:
            if loads:
                for load in load_schedule(sass(kernel)):
                    late = "  after a shared store of loaded data" \
                        if load["after_shared_store"] else ""
                    print(f"{name:32} {kernel.symbol[:22]:22} {load['index']:>6}  "
                          f"{load['text']}{late}")
                continue
            res, ops = profile(kernel)
            top = ", ".join(f"{op} {n}" for op, n in ops.most_common(6))
            print(f"{name:32} {kernel.symbol[:22]:22} {kernel.num_warps:>5} "
                  f"{res.get('REG', '?'):>4} {res.get('STACK', '?'):>5} {kernel.shared_mem:>6} "
                  f"{sum(ops.values()):>6}  {top}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
