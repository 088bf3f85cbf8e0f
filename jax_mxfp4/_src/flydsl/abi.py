"""The launch contract of every gfx950 FlyDSL kernel: specializations, kernarg layouts, grids.

This module is what a launcher packs against; it imports nothing heavy (no FlyDSL, no torch).
Each kernel's argument list is declared once, as ``ARGS`` in its kernel module
(:func:`args`).

Kernel arguments follow the AMDGPU HSA code-object ABI as FlyDSL emits it: each argument at
the next offset aligned to its own size, pointers 8 bytes (``global_buffer``), ``i32``/``f32``
4 bytes and ``i64`` 8 bytes (``by_value``), no hidden arguments; the segment size is the end of
the last argument. :func:`kernarg_layout` computes offsets from the argument list below, and
``tests/test_flydsl_build.py`` checks them against the code objects' own metadata.

Pointers are device addresses of the operands' first bytes (arrays row-major, as JAX lays them
out). ``P`` pages, ``T`` rows/tokens, ``B`` requests, ``W`` block-table width, ``NB`` scored
blocks, ``Hkv`` kv heads, ``G`` q heads per kv head, ``R = T * Hkv`` attention rows, ``n`` page
slots per attention row, ``NP`` split-K partitions.
"""

from __future__ import annotations

import dataclasses
import importlib

_SIZES = {"pointer": 8, "i32": 4, "f32": 4, "i64": 8}


@dataclasses.dataclass(frozen=True)
class Arg:
    """One kernel argument: name, kind (``pointer`` | ``i32`` | ``f32`` | ``i64``), meaning."""

    name: str
    kind: str
    doc: str


@dataclasses.dataclass(frozen=True)
class Slot:
    """An argument placed in the kernarg segment."""

    name: str
    kind: str
    offset: int
    size: int
    doc: str

    @property
    def value_kind(self) -> str:
        """The HSA metadata ``.value_kind`` this slot must have."""
        return "global_buffer" if self.kind == "pointer" else "by_value"


def kernarg_layout(args: tuple[Arg, ...]) -> tuple[tuple[Slot, ...], int]:
    """Offsets of ``args`` in the kernarg segment, and the segment size."""
    slots, offset = [], 0
    for arg in args:
        size = _SIZES[arg.kind]
        offset = -(-offset // size) * size
        slots.append(Slot(arg.name, arg.kind, offset, size, arg.doc))
        offset += size
    return tuple(slots), offset


BUILDERS = {
    "write_cache": "jax_mxfp4._src.ops.write_cache.flydsl_kernel",
    "index_scores": "jax_mxfp4._src.ops.index_scores.flydsl_kernel",
    "sparse_attention": "jax_mxfp4._src.ops.sparse_attention.flydsl_kernel",
    "attention_merge": "jax_mxfp4._src.ops.sparse_attention.flydsl_merge",
}
"""Each FlyDSL kernel and its builder module, beside its operation (imported by name: the
builders import this module, not it them)."""
KERNEL_OPS = tuple(BUILDERS)


def builder_module(op: str):
    """The builder module of kernel ``op`` (its ``ARGS`` and ``build(spec)``)."""
    if op not in KERNEL_OPS:
        raise ValueError(f"unknown op {op!r}; one of {KERNEL_OPS}")
    return importlib.import_module(BUILDERS[op])


def args(op: str) -> tuple[Arg, ...]:
    """The argument list of kernel ``op``: the ``ARGS`` its kernel module declares (the one
    declaration the kernel's signature, its launches and these layouts all derive from)."""
    return builder_module(op).ARGS


@dataclasses.dataclass(frozen=True)
class Specialization:
    """One compiled variant of an operation's kernel (compile-time parameters)."""

    op: str
    q: str = ""  # "bf16" | "e4m3" (index_scores, sparse_attention)
    heads: int = 0  # index heads H (index_scores)
    tiling: str = ""  # "prefill" | "decode" (index_scores)
    group: int = 0  # q heads per kv head G (sparse_attention, attention_merge)
    output: str = ""  # "bf16" | "mxfp8" (sparse_attention, attention_merge)
    path: str = ""  # "direct" | "split" (sparse_attention)

    def __post_init__(self) -> None:
        check(self)

    @property
    def symbol(self) -> str:
        """The kernel's symbol in its code object (``.kd`` is appended for the descriptor)."""
        parts = ["jax_mxfp4", self.op]
        if self.op == "index_scores":
            parts += [f"q{self.q}", f"h{self.heads}", self.tiling]
        elif self.op == "sparse_attention":
            parts += [f"q{self.q}", f"g{self.group}", self.output, self.path]
        elif self.op == "attention_merge":
            parts += [f"g{self.group}", self.output]
        return "_".join(parts)

    def params(self) -> dict:
        """The non-empty compile-time parameters."""
        return {k: v for k, v in dataclasses.asdict(self).items() if v not in ("", 0)}


def check(spec: Specialization) -> None:
    """Raise ValueError for a specialization no kernel implements."""
    if spec.op not in KERNEL_OPS:
        raise ValueError(f"unknown op {spec.op!r}; one of {KERNEL_OPS}")
    powers = (1, 2, 4, 8, 16)
    if spec.op == "index_scores":
        ok = spec.q in ("bf16", "e4m3") and spec.heads in powers and spec.tiling in TILINGS
    elif spec.op == "sparse_attention":
        ok = (spec.q in ("bf16", "e4m3") and spec.group in powers
              and spec.output in ("bf16", "mxfp8") and spec.path in ("direct", "split")
              and not (spec.path == "split" and spec.output != "bf16"))
    elif spec.op == "attention_merge":
        ok = spec.group in powers and spec.output in ("bf16", "mxfp8")
    else:
        ok = True
    if not ok:
        raise ValueError(f"unsupported specialization {spec}")


# --- index_scores tilings ---------------------------------------------------------------------

TILINGS = {
    # waves sharing one staged page (column tiles of 16 (row, head) columns), waves splitting
    # the blocks; 4 waves per workgroup either way.
    "prefill": (4, 1),
    "decode": (1, 4),
}
BLOCKS_PER_WAVE = 4  # consecutive blocks a wave scores before one merged 16-byte row store


def index_scores_tile(spec: Specialization) -> tuple[int, int]:
    """``(rows, blocks)`` one index_scores workgroup covers at most (its MFMA columns hold
    ``rows x H`` (row, head) pairs)."""
    col_tiles, block_waves = TILINGS[spec.tiling]
    return col_tiles * 16 // spec.heads, block_waves * BLOCKS_PER_WAVE


def index_scores_tile_rows(spec: Specialization, num_rows: int, num_requests: int) -> int:
    """The rows one index_scores workgroup takes (the ``tile_rows`` kernel argument).

    Prefill tiling: its full tile. Decode tiling: the rows per request ``T // B`` rounded down
    to a power of two, at most the tile's ``16 / H``. In the usual row order a workgroup then
    holds one request's rows, whose pages it reads once for all of them, and a one-row request
    (S = 1) gets a workgroup per ``16`` blocks: the grid spreads over the blocks and fills the
    machine instead of walking 16 requests in one workgroup. Any row order stays correct (a
    workgroup scores each request among its rows in turn); this only sets the speed.
    """
    most = index_scores_tile(spec)[0]
    if spec.tiling == "prefill":
        return most
    per_request = max(1, num_rows // max(1, num_requests))
    return min(most, 1 << (per_request.bit_length() - 1))


def waves_per_eu(spec: Specialization) -> int:
    """Waves per SIMD a kernel is compiled for (LLVM keeps VGPR + AGPR within 512 / this a
    wave): 2 (256 registers) for all but the prefill index scorer, whose waves wait at a
    barrier per page and need the 4 a SIMD that 128 registers allow (LLVM, asked for 2, gave
    one version 129; 5 or 6 make it spill)."""
    if spec.op == "index_scores" and spec.tiling == "prefill":
        return 4
    return 2


# --- grids --------------------------------------------------------------------------------------

BLOCK_THREADS = {"write_cache": 256, "index_scores": 256, "sparse_attention": 256,
                 "attention_merge": 64}


def grid(spec: Specialization, **dims: int) -> tuple[int, int, int]:
    """The launch grid (in workgroups) from static shapes.

    write_cache: ``num_tokens, num_heads``; index_scores: ``num_rows, num_blocks, tile_rows``
    (:func:`index_scores_tile_rows`);
    sparse_attention: ``num_rows`` (R) and ``num_partitions`` (1 for direct);
    attention_merge: ``num_rows``.
    """
    def cdiv(a: int, b: int) -> int:
        return max(1, -(-a // b))

    if spec.op == "write_cache":
        return cdiv(dims["num_tokens"] * dims["num_heads"] * 4, 256), 1, 1
    if spec.op == "index_scores":
        blocks = index_scores_tile(spec)[1]
        return cdiv(dims["num_rows"], dims["tile_rows"]), cdiv(dims["num_blocks"], blocks), 1
    if spec.op == "sparse_attention":
        parts = 1 if spec.path == "direct" else dims["num_partitions"]
        return max(1, dims["num_rows"]), parts, 1
    return max(1, dims["num_rows"]), 1, 1


def minimax_specializations() -> tuple[Specialization, ...]:
    """Every specialization the API reaches for the MiniMax-M3.1 shapes (SPEC §0): index heads
    1 (TP4) and 4 (TP1), G = 16 q heads per kv head, bf16 and e4m3 queries, prefill and decode
    tilings, bf16 and MXFP8 outputs, direct and split-K attention."""
    specs = [Specialization("write_cache")]
    specs += [Specialization("index_scores", q=q, heads=h, tiling=t)
              for t in ("prefill", "decode") for h in (1, 4) for q in ("bf16", "e4m3")]
    specs += [Specialization("sparse_attention", q=q, group=16, output=o, path="direct")
              for o in ("bf16", "mxfp8") for q in ("bf16", "e4m3")]
    # Split kernels write bf16 partials whatever the final output; the merge picks it.
    specs += [Specialization("sparse_attention", q=q, group=16, output="bf16", path="split")
              for q in ("bf16", "e4m3")]
    specs += [Specialization("attention_merge", group=16, output=o) for o in ("bf16", "mxfp8")]
    return tuple(specs)
