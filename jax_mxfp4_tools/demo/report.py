"""The demo's report: cache bytes per token, accuracy and step times, as plain-text tables."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import jax
import numpy as np

import jax_mxfp4 as jm
from jax_mxfp4._src.core._table import format_table
from jax_mxfp4_tools.demo.accuracy import COMPARISONS
from jax_mxfp4_tools.demo.layer import (
    DENSE_LIMIT,
    HEAD_DIM,
    NUM_INDEX_HEADS,
    NUM_KV_HEADS,
    NUM_Q_HEADS,
    PAGE,
    TOPK,
)

if TYPE_CHECKING:
    from jax_mxfp4_tools.demo import DemoResult

GIB = 1 << 30

CACHE_FORMATS = (
    # name, K+V bytes per token per kv head, index-K bytes per token
    ("MXFP4 (this)", 2 * (HEAD_DIM // 2 + HEAD_DIM // 32), HEAD_DIM // 2 + HEAD_DIM // 32),
    ("fp8 e4m3", 2 * HEAD_DIM, HEAD_DIM),
    ("bf16", 2 * 2 * HEAD_DIM, 2 * HEAD_DIM),
)


def cache_table() -> str:
    rows = []
    bf16_total = sum(CACHE_FORMATS[-1][1:])
    for name, kv, idx in CACHE_FORMATS:
        total = kv + idx
        rows.append([name, str(kv), str(idx), str(total), f"{GIB // total:,}",
                     f"{bf16_total / total:.2f}x"])
    return format_table(
        ["cache format", "K+V B/token", "index B/token", "total B/token", "tokens/GiB",
         "vs bf16"],
        rows,
        right_aligned=range(1, 6),
    )


def accuracy_table(accuracy: Sequence[dict[str, Any]]) -> str:
    """One row per group of ``evaluate``'s accuracy list."""
    rows = []
    for a in accuracy:
        cells = [a["phase"], a["context"], str(a["rows"])]
        cells += [f"{a[name]['rel_l2']:.4f} / {a[name]['cos']:.4f}" for name, _ in COMPARISONS]
        cells.append(f"{a['total']['min_cos']:.4f}")
        rows.append(cells)
    header = ["phase", "context", "rows", *(title for _, title in COMPARISONS), "worst cos"]
    return format_table(header, rows, right_aligned=range(2, len(header)))


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def timing_table(result: DemoResult) -> str:
    pre, dec = result.prefill_step_s, result.decode_step_s
    tokens = sum(result.prefill_tokens)
    rows = [
        ["compile prefill step", f"{result.compile_s['prefill']:.2f} s", "once"],
        ["compile decode step", f"{result.compile_s['decode']:.2f} s", "once"],
        ["prefill step", f"{float(np.median(pre)) * 1e3:.1f} ms",
         f"median of {_plural(len(pre), 'step')} of {result.prefill_rows} rows "
         f"({tokens / sum(pre):,.0f} tokens/s)"],
        ["decode step", f"{float(np.median(dec)) * 1e3:.2f} ms",
         f"median of {_plural(len(dec), 'step')} of {result.config.num_requests} rows "
         "(1 token per request)"],
    ]
    return format_table(["step", "time", "note"], rows, right_aligned={1})


def _header(result: DemoResult) -> list[str]:
    """The report's first lines: the layer and the run."""
    cfg = result.config
    return [
        "jax_mxfp4 demo: one MiniMax-M3.1 sparse-attention layer of one rank at TP4, "
        "random weights",
        f"  {NUM_Q_HEADS} q heads, {NUM_KV_HEADS} kv head, {NUM_INDEX_HEADS} index head, "
        f"head dim {HEAD_DIM}, top-{TOPK} blocks of {PAGE} tokens,",
        f"  sm_scale 128**-0.5, hidden {cfg.hidden}, seed {cfg.seed}",
        f"  {cfg.num_requests} requests, prefill {list(cfg.prefill_lens)} tokens in steps of "
        f"{result.prefill_rows} rows, then {cfg.decode_steps} decode steps",
        f"  jax {jax.__version__} on {jax.devices()[0].platform}, jax_mxfp4 backend "
        f"{result.backend}",
    ]


def _cache_section(result: DemoResult) -> list[str]:
    pool_bytes = 3 * result.num_pages * jm.PAGE_BYTES
    in_place = ", ".join(f"{k} {v}/3" for k, v in result.aliased.items())
    return [
        "1. Cache per token per kv head, one layer (K and V pages + the shared index-K page)",
        cache_table(),
        f"   this run: K, V and index pools of {result.num_pages} pages x {jm.PAGE_BYTES} B = "
        f"{pool_bytes / 2**20:.2f} MiB for {result.num_pages * PAGE:,} token slots,",
        f"   updated in place (pool outputs aliased to donated inputs: {in_place})",
    ]


def _accuracy_section(result: DemoResult) -> list[str]:
    sp, sd = result.sparse_rows["prefill"], result.sparse_rows["decode"]
    return [
        "2. Accuracy of the attention output: relative L2 error / cosine similarity",
        accuracy_table(result.accuracy),
        "   dense          = causal attention, fp32 math, over every token's bf16 q/k/v",
        "   MXFP4 sparse   = the layer's output (MXFP4 K/V, top-16 blocks) vs dense",
        "   selection only = fp32 attention over the selected blocks (bf16 K/V) vs dense",
        "   MXFP4 only     = the layer's output vs fp32 attention over the same blocks (MXFP4 K/V",
        "                    and the kernel's e4m3 rounding of q)",
        "   fp8 KV dense   = dense attention over e4m3 K/V vs dense, for scale",
        "   worst cos      = the lowest cosine of one (row, q head) for MXFP4 sparse",
        f"   Rows with context > {DENSE_LIMIT} tokens are genuinely sparse (checked here: "
        f"prefill {sp[0]} of {sp[1]},",
        f"   decode {sd[0]} of {sd[1]}); the others attend to every token of their context.",
        "   With random weights the attention is flat and the index head knows nothing about",
        "   it, so the selection error here is pessimistic (a trained indexer is meant to pick",
        "   the blocks that carry the attention).",
    ]


def format_report(result: DemoResult) -> str:
    """The whole report: header, then sections 1 (cache), 2 (accuracy), 3 (step time)."""
    parts = [
        *_header(result),
        "",
        *_cache_section(result),
        "",
        *_accuracy_section(result),
        "",
        "3. Step time (compile excluded)",
        timing_table(result),
    ]
    return "\n".join(parts)
