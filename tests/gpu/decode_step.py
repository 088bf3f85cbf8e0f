"""One MiniMax-M3.1-shaped decode step (or prefill step) on the GPU: write the new keys, score
the index cache, select blocks, attend with the MXFP8 epilogue.

Run by the command-buffer test (``--json``: prints the output digest and the compiled HLO's
command-buffer counts) and under compute-sanitizer (``--prefill`` for the prefill step).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import jax_mxfp4 as jm
from jax_mxfp4._src.gpu import launch

SM = 128**-0.5


def build(prefill: bool, seed: int = 0, one_row: bool = False):
    """Inputs of a prefill step (64 rows per request), or a decode step of 4 rows per request
    (16-row tensor-core index tiles) or, ``one_row``, 1 (one-row CUDA-core index tiles)."""
    rng = np.random.default_rng(seed)
    requests, context = (2, 3000) if prefill else (8, 5000)
    s = 64 if prefill else (1 if one_row else 4)
    blocks = -(-context // 128)
    pages = requests * blocks
    pool = rng.integers(0, 256, (pages, 8704), dtype=np.uint8)
    pool[:, 8192:] = rng.integers(120, 132, (pages, 512))
    kv = rng.integers(0, 256, (pages, 1, 8704), dtype=np.uint8)
    kv[..., 8192:] = rng.integers(120, 132, (pages, 1, 512))
    table = rng.permutation(pages).reshape(requests, blocks).astype(np.int32)
    seq = np.full(requests, context, np.int32)
    rows = requests * s
    positions, reqs = jm.decode_rows(jnp.asarray(seq), s)
    slots = jm.slot_mapping(table, positions, reqs)
    x = jnp.asarray(rng.standard_normal((rows, 128)), jnp.bfloat16)
    kx = jnp.asarray(rng.standard_normal((rows, 1, 128)), jnp.bfloat16)
    q = jnp.asarray(rng.standard_normal((rows, 1, 128)), jnp.bfloat16)
    qa = jnp.asarray(rng.standard_normal((rows, 16, 128)), jnp.bfloat16)
    return (jnp.asarray(pool), jnp.asarray(kv), x, kx, jnp.asarray(slots), q, qa,
            jnp.asarray(table), positions, reqs, blocks)


def step(pool, kv, x, kx, slots, q, qa, table, positions, reqs, *, blocks):
    pool = jm.write_cache(pool, x, slots)
    kv = jm.write_cache(kv, kx, slots)
    scores = jm.index_scores(q, pool, table, positions, reqs, num_blocks=blocks, sm_scale=SM)
    sel = jm.select_blocks(scores, table, positions, reqs, topk=16)
    out = jm.sparse_attention(qa, kv, kv, sel.page_table, sel.context_lens, sm_scale=SM,
                              output="mxfp8")
    return pool, kv, scores, sel, out


def thunk_report() -> dict:
    """What XLA's thunk sequence (dumped under ``--xla_dump_to``) made of the step: the
    command-buffer thunks, and the custom-call thunks left outside them. XLA 0.11 forms command
    buffers on the thunk sequence, not in the HLO, so the dump is where they show."""
    flags = os.environ.get("XLA_FLAGS", "").split()
    dump = next((f.split("=", 1)[1] for f in flags if f.startswith("--xla_dump_to=")), None)
    if dump is None:
        return {}
    files = (sorted(Path(dump).glob("*jit_decode_step.thunk_sequence_after_thunk_passes.txt"))
             or sorted(Path(dump).glob("*jit_decode_step.thunk_sequence.txt")))
    if not files:
        return {"thunk_dump": "missing: " + ", ".join(p.name for p in Path(dump).iterdir())}
    text = files[-1].read_text()
    top = [line for line in text.splitlines() if re.match(r"^\d+: ", line)]
    return {
        "command_buffers": sum("kCommandBuffer" in line for line in top),
        "top_level_custom_calls": sum("kCustomCall" in line for line in top),
        "thunk_sequence": text[:3000],
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prefill", action="store_true")
    parser.add_argument("--one-row", action="store_true", help="decode with S = 1")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    *arrays, blocks = build(args.prefill, one_row=args.one_row)

    def decode_step(*a):
        return step(*a, blocks=blocks)

    compiled = jax.jit(decode_step).lower(*arrays).compile()
    outs = jax.tree.map(np.asarray, compiled(*arrays))
    outs = jax.tree.map(np.asarray, compiled(*arrays))  # a second run: graph replay
    digest = hashlib.sha256()
    for leaf in jax.tree.leaves(outs):
        digest.update(np.ascontiguousarray(leaf).view(np.uint8).tobytes())
    hlo = compiled.as_text()
    report = {
        "digest": digest.hexdigest(),
        "launches": hlo.count(f'custom_call_target="{launch.TARGET}"'),
        **thunk_report(),
    }
    print(json.dumps(report) if args.json else report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
