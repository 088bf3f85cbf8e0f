"""Sharded decode steps on N CPU devices, each against its single-device run.

Run as ``python tests/sharding_cases.py N`` with ``XLA_FLAGS=--xla_force_host_platform_device_
count=N`` (the flag only works before jax starts, hence a process of its own;
``tests/test_sharding.py`` launches it). Prints one JSON object per case and mesh: the
collectives in the compiled HLO and whether every output equals the single-device result bit
for bit.

A decode step is the whole MXFP4 path: write K, V and index K into their pools, score, select,
attend. Heads shard on ``tp`` (q, index q, the K/V pools on their kv-head axis; the index pool
has one shared head and is replicated over ``tp``). On ``dp`` (see ``_sharding``: ids are global,
each shard holds its own requests' pages):

* ``vmap_problems``: independent problems on a leading vmapped axis sharded on ``dp``;
* ``global_batch``: one batch, rows, block table and every pool's pages sharded on ``dp``,
  global request/page ids, each shard's requests on its own pages; slots come in as an input;
* ``global_batch_whole_table``: the same with the block table replicated and the slots
  computed from it inside the step;
* ``one_kv_head``: ``global_batch`` with one kv head of 16 q heads (MiniMax-M3's rank at TP4),
  heads whole, on ``dp`` only;
* ``shard_map``: the step inside ``jax.shard_map`` on local shapes and local ids;
* ``shard_map_tp_only``: ``shard_map`` manual over ``tp`` only, ``dp`` left to XLA;
* ``pools_only_on_dp``: pools sharded on ``dp`` but rows and table not, a layout the kernels
  cannot run per shard: the plan gathers, and the answer must still be exact;
* ``gspmd_shardings``: ``global_batch`` placed with mesh-less ``GSPMDSharding``s, which name
  no axes: the operations run on whole operands, exactly.

The last three (``MAY_COMMUNICATE``) are about correctness only; the others must also compile
with no collective at all.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax._src.sharding_impls import GSPMDSharding
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

sys.path.insert(0, str(Path(__file__).resolve().parent))
from conftest import random_pages

import jax_mxfp4 as jm

MESHES = {4: ((1, 4), (2, 2)), 8: ((2, 4), (4, 2))}  # devices -> (dp, tp) meshes
KV_HEADS, GROUP = 4, 2  # per problem: 4 kv heads = 4 index heads, 8 q heads
REQUESTS, PAGES, NUM_BLOCKS, TOPK = 2, 8, 4, 2  # per dp shard
SM = 128**-0.5
COLLECTIVES = ("all-gather", "all-to-all", "collective-permute", "all-reduce",
               "reduce-scatter")
CASES = ("vmap_problems", "global_batch", "global_batch_whole_table", "one_kv_head",
         "shard_map", "shard_map_tp_only", "pools_only_on_dp", "gspmd_shardings")
MAY_COMMUNICATE = ("shard_map_tp_only", "pools_only_on_dp", "gspmd_shardings")


def slots_of(table, positions, requests):
    """Cache slot of each row's own token (-1: padding row)."""
    blocks = jnp.clip(positions // 128, 0, table.shape[1] - 1)
    slots = table[requests, blocks] * 128 + positions % 128
    return jnp.where(positions >= 0, slots, -1).astype(jnp.int32)


def decode_step(k_pool, v_pool, i_pool, q, iq, k, v, ik, table, seq_lens, slots, output):
    """write -> score -> select -> attend, one token per request."""
    positions, requests = jm.decode_rows(seq_lens, 1)
    k_pool = jm.write_cache(k_pool, k, slots)
    v_pool = jm.write_cache(v_pool, v, slots)
    i_pool = jm.write_cache(i_pool, ik, slots)
    scores = jm.index_scores(iq, i_pool, table, positions, requests, num_blocks=NUM_BLOCKS,
                             sm_scale=SM)
    sel = jm.select_blocks(scores, table, positions, requests, topk=TOPK)
    out = jm.sparse_attention(q, k_pool, v_pool, sel.page_table, sel.context_lens,
                              sm_scale=SM, output=output)
    return k_pool, v_pool, i_pool, out, sel


def problem(rng, kv_heads: int = KV_HEADS, group: int = GROUP) -> list[np.ndarray]:
    """One shard's requests with LOCAL ids: pools, rows, table, seq_lens, slots."""
    bf = jnp.bfloat16
    rows = REQUESTS
    table = rng.permutation(PAGES)[: REQUESTS * NUM_BLOCKS].reshape(REQUESTS, NUM_BLOCKS)
    seq_lens = rng.integers(1, NUM_BLOCKS * 128, REQUESTS)
    positions = seq_lens - 1
    slots = table[np.arange(REQUESTS), positions // 128] * 128 + positions % 128
    normal = lambda *shape: np.asarray(rng.standard_normal(shape), bf)  # noqa: E731
    return [
        random_pages(rng, (PAGES, kv_heads)), random_pages(rng, (PAGES, kv_heads)),
        random_pages(rng, (PAGES,)),
        normal(rows, kv_heads * group, 128), normal(rows, kv_heads, 128),
        normal(rows, kv_heads, 128), normal(rows, kv_heads, 128), normal(rows, 128),
        table.astype(np.int32), seq_lens.astype(np.int32), slots.astype(np.int32),
    ]


TABLE, SLOTS = 8, 10  # argument positions of ids that become global


def global_batch(problems: list[list[np.ndarray]]) -> list[np.ndarray]:
    """Shard ``i``'s problem holds pages ``[i*PAGES, (i+1)*PAGES)``: one batch, global ids."""
    out = []
    for n, parts in enumerate(zip(*problems, strict=True)):
        if n == TABLE:
            parts = [p + i * PAGES for i, p in enumerate(parts)]
        if n == SLOTS:
            parts = [p + i * PAGES * 128 for i, p in enumerate(parts)]
        out.append(np.concatenate(parts))
    return out


def heads_specs(lead: tuple, dp) -> list[P]:
    """Specs of the 11 arguments: heads on tp; ``lead`` = the entries before the head axis
    of pools and rows, ``dp`` = the entry of the table, seq_lens, slots."""
    heads = P(*lead, "tp")
    return [heads, heads, P(*lead), heads, heads, heads, heads, P(*lead), P(dp), P(dp), P(dp)]


def collectives(hlo: str) -> dict[str, int]:
    return {name: hlo.count(f" {name}(") + hlo.count(f" {name}-start(") for name in COLLECTIVES}


def same_bits(actual, expected) -> bool:
    pairs = zip(jax.tree.leaves(actual), jax.tree.leaves(expected), strict=True)
    return all(np.array_equal(np.asarray(a).view(np.uint8), np.asarray(e).view(np.uint8))
               for a, e in pairs)


def run_case(name: str, mesh: Mesh, rng) -> dict:
    """Compile the case's step for ``mesh``; compare with its single-device result."""
    dp, tp = mesh.devices.shape
    problems = [problem(rng) for _ in range(dp)]
    fn, args, specs, expected = _case(name, mesh, problems, rng)
    shardings = [NamedSharding(mesh, s) for s in specs]
    if name == "gspmd_shardings":
        devices = tuple(mesh.devices.flat)
        shardings = [GSPMDSharding(devices, s._to_xla_hlo_sharding(np.ndim(a)))
                     for s, a in zip(shardings, args, strict=True)]
    placed = [jax.device_put(a, s) for a, s in zip(args, shardings, strict=True)]
    start = time.perf_counter()
    compiled = jax.jit(fn, donate_argnums=(0, 1, 2)).lower(*placed).compile()
    seconds = time.perf_counter() - start
    actual = compiled(*placed)
    return {"case": name, "mesh": [dp, tp], "collectives": collectives(compiled.as_text()),
            "equal": same_bits(actual, expected), "compile_s": round(seconds, 2)}


def _single(fn: Callable, args) -> list:
    return jax.tree.map(np.asarray, jax.jit(fn)(*[jnp.asarray(a) for a in args]))


def _case(name: str, mesh: Mesh, problems, rng) -> tuple[Callable, list, list[P], object]:
    """(step, arguments, their specs, the single-device result) of case ``name``."""
    step = lambda *a: decode_step(*a, output="bf16")  # noqa: E731
    if name == "vmap_problems":
        step = jax.vmap(lambda *a: decode_step(*a, output="mxfp8"))
        args = [np.stack(parts) for parts in zip(*problems, strict=True)]
        return step, args, heads_specs(("dp", None), "dp"), _single(step, args)
    if name in ("global_batch", "gspmd_shardings"):
        args = global_batch(problems)
        return step, args, heads_specs(("dp",), "dp"), _single(step, args)
    if name == "global_batch_whole_table":
        def whole_table_step(*a):
            rows = jm.decode_rows(a[9], 1)
            return step(*a[:10], slots_of(a[8], *rows))

        args = global_batch(problems)
        specs = heads_specs(("dp",), "dp")
        specs[TABLE] = P()
        return whole_table_step, args, specs, _single(whole_table_step, args)
    if name == "one_kv_head":
        args = global_batch([problem(rng, kv_heads=1, group=16) for _ in problems])
        specs = heads_specs(("dp",), "dp")
        specs = [P(*s[:1]) for s in specs]  # one kv head: nothing to split on tp
        return step, args, specs, _single(step, args)
    if name == "pools_only_on_dp":
        args = global_batch(problems)
        specs = heads_specs((None,), None)
        specs[:3] = [P("dp", "tp"), P("dp", "tp"), P("dp")]
        return step, args, specs, _single(step, args)
    if name in ("shard_map", "shard_map_tp_only"):
        return _shard_map_case(name, mesh, problems, step)
    raise ValueError(name)


def _shard_map_case(name, mesh, problems, step):
    """``shard_map``: manual over both axes with local ids (each dp shard one problem), or
    manual over ``tp`` only with global ids (``dp`` left to XLA)."""
    if name == "shard_map":
        args = [np.concatenate(parts) for parts in zip(*problems, strict=True)]
        specs = heads_specs(("dp",), "dp")
        sel = jm.SparseSelection(P("tp", "dp"), P("dp", "tp"), P("dp", "tp"))
        fn = jax.shard_map(step, mesh=mesh, in_specs=tuple(specs),
                           out_specs=(*specs[:4], sel))
        return fn, args, specs, _concatenated([_single(step, p) for p in problems])
    args = global_batch(problems)
    specs = heads_specs((None,), None)
    sel = jm.SparseSelection(P("tp"), P(None, "tp"), P(None, "tp"))
    fn = jax.shard_map(step, mesh=mesh, in_specs=tuple(specs), out_specs=(*specs[:4], sel),
                       axis_names={"tp"})
    return fn, args, heads_specs(("dp",), "dp"), _single(step, args)


def _concatenated(results: list) -> list:
    """Per-problem step results as one batch's: rows (block ids: axis 1) and pages joined."""
    joined = [np.concatenate([r[i] for r in results]) for i in range(4)]
    sels = [r[4] for r in results]
    return [*joined, jm.SparseSelection(
        np.concatenate([s.block_ids for s in sels], axis=1),
        np.concatenate([s.page_table for s in sels]),
        np.concatenate([s.context_lens for s in sels]),
    )]


def main(argv: list[str]) -> int:
    devices = int(argv[0])
    if jax.device_count() != devices:
        print(f"expected {devices} devices, have {jax.device_count()}: set XLA_FLAGS="
              f"--xla_force_host_platform_device_count={devices}", file=sys.stderr)
        return 2
    rng = np.random.default_rng(devices)
    for shape in MESHES[devices]:
        mesh = Mesh(np.array(jax.devices()).reshape(shape), ("dp", "tp"))
        for name in CASES:
            try:
                result = run_case(name, mesh, rng)
            except Exception as error:  # reported per case, so one failure hides no other
                result = {"case": name, "mesh": list(shape), "error": repr(error)[-3000:]}
            print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
