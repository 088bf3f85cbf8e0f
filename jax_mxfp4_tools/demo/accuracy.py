"""The demo's accuracy check: the layer's output against dense causal attention in fp32.

The serving loop records, per request and token, what the layer saw and produced
(``RequestLog``, ``record``); ``evaluate`` then splits the error against dense attention over the
unquantized bf16 K/V into the part from block selection and the part from MXFP4 quantization.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jax_mxfp4_tools.demo.layer import DENSE_LIMIT, HEAD_DIM, NUM_Q_HEADS, PAGE, SM_SCALE, TOPK

_EVAL_CHUNK = 64  # query rows per reference call (one compiled shape)

COMPARISONS = (
    # key, column title; every comparison is "this output vs that reference"
    ("total", "MXFP4 sparse"),  # the layer's output vs dense
    ("selection", "selection only"),  # fp32 attention over the selected blocks vs dense
    ("quantization", "MXFP4 only"),  # the layer's output vs fp32 over the selected blocks
    ("fp8", "fp8 KV dense"),  # dense attention over fp8 e4m3 K/V vs dense, for scale
)

_Group = tuple[str, str]  # (phase, context class)


@dataclasses.dataclass
class RequestLog:
    """What one request saw, token by token (host copies, for the accuracy check)."""

    q: np.ndarray  # float32 [L, Hq, D] (bf16 values)
    k: np.ndarray  # float32 [L, D]
    v: np.ndarray  # float32 [L, D]
    out: np.ndarray  # float32 [L, Hq, D] (bf16 values): the MXFP4 sparse attention output
    block_ids: np.ndarray  # int32 [L, topk]
    decode_from: int  # positions >= decode_from were decode steps

    @classmethod
    def empty(cls, length: int, decode_from: int) -> RequestLog:
        """A log for ``length`` tokens, zeros (block ids -1) until recorded."""
        return cls(
            q=np.zeros((length, NUM_Q_HEADS, HEAD_DIM), np.float32),
            k=np.zeros((length, HEAD_DIM), np.float32),
            v=np.zeros((length, HEAD_DIM), np.float32),
            out=np.zeros((length, NUM_Q_HEADS, HEAD_DIM), np.float32),
            block_ids=np.full((length, TOPK), -1, np.int32),
            decode_from=decode_from,
        )


def _host(x) -> np.ndarray:
    return np.asarray(jax.device_get(x)).astype(np.float32)


def record(
    logs: Sequence[RequestLog], positions: np.ndarray, requests: np.ndarray, extras, out
) -> None:
    """Copy one step's rows into ``logs``: row ``i`` is token ``positions[i]`` of request
    ``requests[i]`` (both int ``[T]``; position -1: padding, skipped)."""
    q, k, v = _host(extras["q"]), _host(extras["k"]), _host(extras["v"])
    ids = np.asarray(extras["block_ids"])
    out = _host(out)
    for row, (p, b) in enumerate(zip(positions, requests, strict=True)):
        if p < 0:
            continue
        log = logs[b]
        log.q[p], log.k[p], log.v[p], log.out[p], log.block_ids[p] = (
            q[row], k[row], v[row], out[row], ids[row]
        )


@jax.jit
def _reference_attention(q, k, v, positions, allowed_blocks):
    """Dense causal attention, fp32 math, for query rows ``q[R, Hq, D]`` of one request.

    Returns ``(dense, selected, dense_fp8)``: full causal attention over ``k, v [L, D]``; the same
    restricted to the blocks in ``allowed_blocks[R, NB]`` (the sparse selection, unquantized); and
    full attention over K/V rounded to fp8 e4m3 (unit scale), for scale.
    """
    length = k.shape[0]
    t = jnp.arange(length)
    causal = t[None, :] <= positions[:, None]
    selected = causal & jnp.take(allowed_blocks, t // PAGE, axis=1)

    def attend(kk, vv, mask):
        s = jnp.einsum("rhd,ld->rhl", q, kk, precision="highest") * SM_SCALE
        s = jnp.where(mask[:, None, :], s, -jnp.inf)
        m = jnp.max(s, axis=-1, keepdims=True)
        p = jnp.exp(s - jnp.where(jnp.isfinite(m), m, 0.0))
        p = p / jnp.maximum(jnp.sum(p, axis=-1, keepdims=True), 1e-30)
        return jnp.einsum("rhl,ld->rhd", p, vv, precision="highest")

    def fp8(x):
        return jnp.clip(x, -448, 448).astype(jnp.float8_e4m3fn).astype(jnp.float32)

    return attend(k, v, causal), attend(k, v, selected), attend(fp8(k), fp8(v), causal)


def _eval_positions(log: RequestLog, n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Prefill rows to check (up to ``n`` per request and context class); all decode rows."""
    prefill = np.arange(log.decode_from)
    picked = []
    for part in (prefill[prefill < DENSE_LIMIT], prefill[prefill >= DENSE_LIMIT]):
        if part.size > n:
            part = np.sort(rng.choice(part, n, replace=False))
        picked.append(part)
    return {
        "prefill": np.concatenate(picked),
        "decode": np.arange(log.decode_from, log.q.shape[0]),
    }


class _Stats:
    """Accumulates relative L2 error and cosine similarity of ``a`` against ``ref``."""

    def __init__(self):
        self.err2 = self.ref2 = self.a2 = self.dot = 0.0
        self.min_cos = 1.0

    def add(self, a: np.ndarray, ref: np.ndarray) -> None:
        a, ref = a.astype(np.float64), ref.astype(np.float64)
        self.err2 += float(np.sum((a - ref) ** 2))
        self.ref2 += float(np.sum(ref**2))
        self.a2 += float(np.sum(a**2))
        self.dot += float(np.sum(a * ref))
        rows_dot = np.sum(a * ref, axis=-1)
        rows_norm = np.linalg.norm(a, axis=-1) * np.linalg.norm(ref, axis=-1)
        ok = rows_norm > 0
        if ok.any():
            self.min_cos = min(self.min_cos, float(np.min(rows_dot[ok] / rows_norm[ok])))

    def summary(self) -> dict[str, float]:
        rel = math.sqrt(self.err2 / self.ref2) if self.ref2 else float("nan")
        denom = math.sqrt(self.a2 * self.ref2)
        return {"rel_l2": rel, "cos": self.dot / denom if denom else float("nan"),
                "min_cos": self.min_cos}


def _references(
    log: RequestLog, p: np.ndarray, k_dev: jax.Array, v_dev: jax.Array, num_blocks: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``_reference_attention`` for the rows at positions ``p`` (at most ``_EVAL_CHUNK``).

    ``k_dev, v_dev`` are float32 ``[num_blocks * PAGE, D]``; returns float32 ``[len(p), Hq, D]``
    each: dense, over the selected blocks, and dense over fp8 K/V.
    """
    p_pad = np.pad(p, (0, _EVAL_CHUNK - p.size), constant_values=0)
    allowed = np.zeros((_EVAL_CHUNK, num_blocks), bool)
    ids = log.block_ids[p_pad]
    rows = np.nonzero(ids >= 0)
    allowed[rows[0], ids[rows]] = True
    refs = jax.device_get(
        _reference_attention(
            jnp.asarray(log.q[p_pad]), k_dev, v_dev, jnp.asarray(p_pad), jnp.asarray(allowed)
        )
    )
    dense, selected, dense_fp8 = (r[: p.size] for r in refs)
    return dense, selected, dense_fp8


def _accumulate(
    groups: dict[_Group, dict[str, _Stats]],
    counts: dict[_Group, int],
    phase: str,
    p: np.ndarray,
    out: np.ndarray,
    refs: tuple[np.ndarray, np.ndarray, np.ndarray],
) -> None:
    """Add the rows at positions ``p`` (layer output ``out[len(p), Hq, D]``, ``refs`` from
    ``_references``) to the statistics of their (phase, context class) group."""
    dense, selected, dense_fp8 = refs
    for sparse in (False, True):
        m = (p + 1 > DENSE_LIMIT) == sparse
        if not m.any():
            continue
        key = (phase, "> 2048" if sparse else "<= 2048")
        stats = groups.setdefault(key, {c: _Stats() for c, _ in COMPARISONS})
        counts[key] = counts.get(key, 0) + int(m.sum())
        d, s = dense[m], selected[m]
        stats["total"].add(out[m], d)
        stats["selection"].add(s, d)
        stats["quantization"].add(out[m], s)
        stats["fp8"].add(dense_fp8[m], d)


def evaluate(
    logs: Sequence[RequestLog], num_blocks: int, eval_rows: int, rng: np.random.Generator
) -> tuple[list[dict[str, Any]], dict[str, tuple[int, int]]]:
    """Accuracy of the recorded outputs per (phase, context class).

    Returns one dict per group present (``phase``, ``context``, ``rows`` and, per entry of
    ``COMPARISONS``, ``{"rel_l2", "cos", "min_cos"}``), and per phase the rows checked as
    ``(rows with context > DENSE_LIMIT, all rows)``.
    """
    groups: dict[_Group, dict[str, _Stats]] = {}
    counts: dict[_Group, int] = {}
    sparse_rows = {"prefill": [0, 0], "decode": [0, 0]}
    length = num_blocks * PAGE
    for log in logs:
        n = log.q.shape[0]
        k = np.zeros((length, HEAD_DIM), np.float32)
        v = np.zeros((length, HEAD_DIM), np.float32)
        k[:n], v[:n] = log.k, log.v
        k_dev, v_dev = jnp.asarray(k), jnp.asarray(v)
        for phase, pos in _eval_positions(log, eval_rows, rng).items():
            ctx = pos + 1
            sparse_rows[phase][0] += int(np.sum(ctx > DENSE_LIMIT))
            sparse_rows[phase][1] += pos.size
            for start in range(0, pos.size, _EVAL_CHUNK):
                p = pos[start : start + _EVAL_CHUNK]
                refs = _references(log, p, k_dev, v_dev, num_blocks)
                _accumulate(groups, counts, phase, p, log.out[p], refs)
    order = [(ph, c) for ph in ("prefill", "decode") for c in ("<= 2048", "> 2048")]
    accuracy = [
        {"phase": ph, "context": c, "rows": counts[(ph, c)],
         **{name: groups[(ph, c)][name].summary() for name, _ in COMPARISONS}}
        for ph, c in order
        if (ph, c) in groups
    ]
    return accuracy, {k: (a, b) for k, (a, b) in sparse_rows.items()}
