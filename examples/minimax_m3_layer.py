"""A MiniMax-M3.1 sparse-attention block, written as a JAX user would, sharded over a mesh.

    python examples/minimax_m3_layer.py --tp 4 --dp 1 --cpu-devices 4 --check

Each layer: pre-norm, q / k / v / index-q / index-k projections, per-head (Gemma) RMSNorm and
partial RoPE, the MXFP4 cache writes (K, V, index K), index scoring, top-16 block selection,
sparse attention with the fused MXFP8 output, and the output projection fed from MXFP8
(dequantize-and-dot: an e4m3 value times its e8m0 scale is exact in bf16; on GPUs with MX
tensor cores ``jax.nn.scaled_matmul`` takes the same two arrays). Layers run under
``lax.scan`` over stacked weights and stacked pools; the pools are donated to each step. One
prefill step (every prompt, padded to the longest) and then a decode loop.

Model shapes are MiniMax-M3's (64 q heads, 4 kv heads = 4 index heads, head dim 128, rotary
64, 128-token pages, top-16) except ``--hidden`` and ``--layers``, small by default for CPUs.

Sharding (mesh axes ``dp`` x ``tp``): heads on ``tp`` (q, k, v and index-q weights, the K/V
pools' kv-head axis; the index-K projection and index pool have one shared head, replicated
over ``tp``); requests on ``dp``: the rows, and the pools' pages, each dp shard allocating its
own requests' pages (ids stay global: see ``jax_mxfp4/_src/dispatch/sharding.py``). The MXFP4
operations run per shard with no communication. The output projection sums the kv-head
groups' partial products in a fixed order after gathering them; the usual one all-reduce would
equal the one-device sum only to rounding.

``--check`` separates what jax_mxfp4 guarantees from what XLA does (``check_against_tp1``):

* **our operations, bit for bit**: every layer's cache writes, index scores, block selection
  and sparse attention (its MXFP8 output) in every step are recorded, then recomputed on one
  device from the same recorded inputs; the two must have the same bits;
* **the whole block, to rounding**: the hidden states are compared with a TP=1, DP=1 run on
  one device. The dense projections around our operations are XLA's: a sharded matmul may
  take another algorithm (on GPUs, GEMM autotuning may even pick another one per compile), so
  the states must agree to bf16 rounding (relative L2 <= 1e-2); whether they are also equal
  bit for bit is printed. On GPUs, ``XLA_FLAGS="--xla_gpu_deterministic_ops=true
  --xla_gpu_autotune_level=0"`` makes each compiled program repeat its own bits.

Several processes (one per host) share one mesh with ``--coordinator HOST:PORT
--num-processes N --process-id I`` (``jax.distributed``; README "More than one host"): the
mesh is made of every process's devices, each process's first, so a dp shard of ``tp``
devices stays inside one process when ``tp`` divides its device count; the hidden states are
gathered from every process (``fetch``) and ``--save`` has process 0 write them.

``--compare-backend NAME`` reruns the same prefill and decode on backend ``NAME`` and holds
the hidden states to the same 1e-2. With the emulated MI355X it checks the gfx950 kernels
inside a whole model on the CPU (a few seconds per decode step at these sizes):

    JAX_MXFP4_BACKEND=emulated-gfx950 python examples/minimax_m3_layer.py \
        --layers 1 --hidden 128 --prompt-len 200 --decode-steps 2 --compare-backend auto
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import hashlib
import math
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import jax_mxfp4 as jm
from jax_mxfp4_tools.demo.layer import HEAD_DIM, PAGE, SM_SCALE, TOPK, rms_norm, rope

BF16, F32 = jnp.bfloat16, jnp.float32


@dataclasses.dataclass(frozen=True)
class Config:
    layers: int = 2
    hidden: int = 256  # MiniMax-M3: 6144
    q_heads: int = 64
    kv_heads: int = 4  # = index heads: index head h drives kv head h
    requests: int = 2
    prompt_len: int = 300  # the longest prompt; request b has prompt_len - 97*b tokens
    decode_steps: int = 4
    seed: int = 0

    @property
    def pages_per_request(self) -> int:
        return math.ceil((self.prompt_len + self.decode_steps) / PAGE)

    def prompt_lens(self) -> np.ndarray:
        return np.maximum(self.prompt_len - 97 * np.arange(self.requests), 1).astype(np.int32)


# Leading axis of every weight and pool: the layer (lax.scan runs over it).
PARAM_SPECS = {
    "input_norm": P(), "q_norm": P(), "k_norm": P(), "iq_norm": P(), "ik_norm": P(),
    "wq": P(None, None, "tp"), "wk": P(None, None, "tp"), "wv": P(None, None, "tp"),
    "wiq": P(None, None, "tp"), "wik": P(), "wo": P(None, "tp"),
}
POOL_SPECS = (P(None, "dp", "tp"), P(None, "dp", "tp"), P(None, "dp"))  # K, V, index K


def init_params(cfg: Config) -> dict[str, np.ndarray]:
    """Random bf16 weights, stacked over layers. wq/wk/wv/wiq ``[L, hidden, heads, D]``,
    wik ``[L, hidden, D]``, wo ``[L, kv_heads, group*D, hidden]`` (q heads grouped by kv head),
    norm weights ``[L, D]`` (``[L, hidden]`` for the input norm)."""
    rng = np.random.default_rng(cfg.seed)
    L, C, D = cfg.layers, cfg.hidden, HEAD_DIM

    def normal(*shape, scale):
        return (rng.standard_normal(shape, np.float32) * scale).astype(jnp.bfloat16)

    group = cfg.q_heads // cfg.kv_heads
    params = {
        "wq": normal(L, C, cfg.q_heads, D, scale=C**-0.5),
        "wk": normal(L, C, cfg.kv_heads, D, scale=C**-0.5),
        "wv": normal(L, C, cfg.kv_heads, D, scale=C**-0.5),
        "wiq": normal(L, C, cfg.kv_heads, D, scale=C**-0.5),
        "wik": normal(L, C, D, scale=C**-0.5),
        "wo": normal(L, cfg.kv_heads, group * D, C, scale=(cfg.q_heads * D) ** -0.5),
        "input_norm": normal(L, C, scale=0.1),
    }
    for name in ("q_norm", "k_norm", "iq_norm", "ik_norm"):
        params[name] = normal(L, D, scale=0.1)
    return params


def gemma_norm(x: jax.Array, weight: jax.Array, eps: float = 1e-6) -> jax.Array:
    """RMSNorm over the last axis with a Gemma-style ``(1 + weight)`` gain; float32.

    The sum of squares is a fixed pairwise tree of adds, not a ``jnp.mean``: XLA picks a
    reduction's order from the shapes it is fused with, so a heads-sharded norm would round
    differently at each TP degree; this one rounds the same everywhere.
    """
    total = jnp.square(x.astype(F32))
    while total.shape[-1] > 1:
        half = total.shape[-1] // 2
        pairs = total[..., :half] + total[..., half : 2 * half]
        total = jnp.concatenate([pairs, total[..., 2 * half :]], axis=-1)
    scale = jax.lax.rsqrt(total / x.shape[-1] + eps)
    return x.astype(F32) * scale * (1.0 + weight.astype(F32))


def output_projection(values, scales, wo, mesh: Mesh) -> jax.Array:
    """MXFP8 attention output ``(e4m3 [T, Hq*D], e8m0 [T, Hq*D/32])`` times ``wo [Hkv,
    G*D, hidden]`` -> float32 ``[T, hidden]``: each kv-head group's partial product where
    its heads live, then the partials gathered and added in a fixed order."""
    o = jm.dequantize_mxfp8(values, scales, BF16).reshape(values.shape[0], wo.shape[0], -1)
    partial = jnp.einsum("tgk,gkc->gtc", o, wo, preferred_element_type=F32)
    partial = jax.lax.with_sharding_constraint(partial, NamedSharding(mesh, P(None, "dp")))
    return functools.reduce(jnp.add, [partial[g] for g in range(partial.shape[0])])


def attention_block(p, pools, x, positions, requests, table, mesh: Mesh):
    """One layer on rows ``x [T, hidden]`` (bf16): returns the updated (K, V, index) pools
    and ``x + attention(x)``."""
    h = gemma_norm(x, p["input_norm"]).astype(BF16)

    def project(w, norm=None):  # [T, hidden] x [hidden, ...] -> [T, ...], normed and roped
        y = jnp.einsum("tc,c...->t...", h, w, preferred_element_type=F32)
        return y if norm is None else rope(gemma_norm(y, norm), positions)

    q = project(p["wq"], p["q_norm"]).astype(BF16)
    k = project(p["wk"], p["k_norm"]).astype(BF16)
    v = project(p["wv"]).astype(BF16)
    iq = project(p["wiq"], p["iq_norm"]).astype(BF16)
    ik = project(p["wik"][:, None], p["ik_norm"])[:, 0].astype(BF16)

    ops_inputs = dict(pools=tuple(pools), q=q, k=k, v=v, iq=iq, ik=ik, positions=positions,
                      requests=requests, table=table)
    new_pools, (values, scales) = mxfp4_operations(**ops_inputs)
    y = output_projection(values, scales, p["wo"], mesh)
    record = dict(ops_inputs, new_pools=new_pools, values=values, scales=scales)
    return new_pools, (x.astype(F32) + y).astype(BF16), record


def mxfp4_operations(pools, q, k, v, iq, ik, positions, requests, table):
    """The layer's jax_mxfp4 operations: the K, V and index-K cache writes, index scoring,
    top-16 selection and sparse attention with the MXFP8 output. Returns the updated
    ``(k_pool, v_pool, index_pool)`` and ``(values e4m3 [T, Hq*D], scales u8 [T, Hq*D/32])``."""
    k_pool, v_pool, index_pool = pools
    slots = jm.slot_mapping(table, positions, requests)
    k_pool, v_pool, index_pool = jm.write_kv_cache(k_pool, v_pool, index_pool, k, v, ik, slots)
    scores = jm.index_scores(iq, index_pool, table, positions, requests,
                             num_blocks=table.shape[1], sm_scale=SM_SCALE)
    sel = jm.select_blocks(scores, table, positions, requests, topk=TOPK)
    out = jm.sparse_attention(q, k_pool, v_pool, sel.page_table, sel.context_lens,
                              sm_scale=SM_SCALE, output="mxfp8")
    return (k_pool, v_pool, index_pool), out


def forward(params, pools, x, positions, requests, table, mesh: Mesh, record: bool = False):
    """Every layer: ``lax.scan`` over the stacked weights, with the stacked pools in the carry.

    Each layer's pools are sliced out and written back with ``dynamic_update_slice``, which
    XLA does in place; passing the pools as scanned inputs and outputs instead would copy the
    whole stack every step. (The slice itself is still one copy of a layer's pools.) With
    ``record`` (static), also returns every layer's inputs and outputs of our operations,
    stacked over layers (``--check`` recomputes them).
    """

    def layer(carry, p):
        x, pools, index = carry
        mine = [jax.lax.dynamic_index_in_dim(pool, index, keepdims=False) for pool in pools]
        mine, x, ops_record = attention_block(p, mine, x, positions, requests, table, mesh)
        pools = tuple(jax.lax.dynamic_update_index_in_dim(pool, new, index, 0)
                      for pool, new in zip(pools, mine, strict=True))
        return (x, pools, index + 1), (ops_record if record else None)

    (x, pools, _), records = jax.lax.scan(layer, (x, tuple(pools), 0), params)
    return (pools, x, records) if record else (pools, x)


def prompt_rows(prompt_lens: jax.Array, width: int) -> tuple[jax.Array, jax.Array]:
    """Rows of a prefill where request b owns rows ``b*width .. b*width + width - 1`` (so a
    request's rows stay on its dp shard): positions ``0..len-1``, then padding (-1)."""
    offsets = jnp.arange(width, dtype=jnp.int32)
    positions = jnp.where(offsets[None, :] < prompt_lens[:, None], offsets[None, :], -1)
    requests = jnp.repeat(jnp.arange(prompt_lens.shape[0], dtype=jnp.int32), width)
    return positions.reshape(-1), requests


def make_steps(mesh: Mesh, cfg: Config, record: bool = False):
    """The jitted prefill and decode steps; pools (argument 1) are donated. With ``record``,
    each step also returns the records of ``forward`` (last)."""
    rows = NamedSharding(mesh, P("dp"))
    pools_out = tuple(NamedSharding(mesh, s) for s in POOL_SPECS)

    def prefill(params, pools, x, prompt_lens, table):
        positions, requests = prompt_rows(prompt_lens, cfg.prompt_len)
        return forward(params, pools, x, positions, requests, table, mesh, record)

    def decode(params, pools, x, seq_lens, table):
        positions, requests = jm.decode_rows(seq_lens, 1)
        pools, y, *records = forward(params, pools, x, positions, requests, table, mesh, record)
        return pools, y, rms_norm(y).astype(BF16), *records  # rms_norm(y): a stand-in token

    out = (pools_out, rows) + ((None,) if record else ())
    decode_out = (pools_out, rows, rows) + ((None,) if record else ())
    return (jax.jit(prefill, donate_argnums=1, out_shardings=out),
            jax.jit(decode, donate_argnums=1, out_shardings=decode_out))


def block_table(cfg: Config, dp: int) -> np.ndarray:
    """Request b's pages, shuffled within its dp shard's share of the pool."""
    rng = np.random.default_rng(cfg.seed + 1)
    per_shard = cfg.requests // dp * cfg.pages_per_request
    table = np.concatenate([s * per_shard + rng.permutation(per_shard) for s in range(dp)])
    return table.reshape(cfg.requests, cfg.pages_per_request).astype(np.int32)


def put(tree, specs, mesh: Mesh):
    """Each array of ``tree`` on ``mesh``. With several processes every process passes the
    same whole (host) array and keeps the shards of its own devices."""
    return jax.tree.map(lambda a, s: jax.device_put(a, NamedSharding(mesh, s)), tree, specs)


def fetch(a: jax.Array) -> np.ndarray:
    """The whole value of ``a`` on this host; an array with shards on other processes' devices
    is gathered from them (every process must call this, in the same order)."""
    if a.is_fully_addressable:
        return np.asarray(a)
    return np.asarray(multihost_utils.process_allgather(a, tiled=True))


def serve(cfg: Config, mesh: Mesh, records: list | None = None,
          ) -> tuple[dict[str, np.ndarray], list[float], str]:
    """Prefill every prompt, then decode. Returns the outputs (the prefill's hidden states
    and each decode step's), the decode-step times (s) and the decode step's collectives.
    With a ``records`` list, appends each step's records of our operations (numpy, stacked
    over layers) to it."""
    record = records is not None
    dp = mesh.shape["dp"]
    params = put(init_params(cfg), PARAM_SPECS, mesh)
    num_pages = cfg.requests * cfg.pages_per_request
    pools = (np.zeros((cfg.layers, num_pages, cfg.kv_heads, jm.PAGE_BYTES), np.uint8),) * 2
    pools = put((*pools, np.zeros((cfg.layers, num_pages, jm.PAGE_BYTES), np.uint8)),
                POOL_SPECS, mesh)
    table = put(block_table(cfg, dp), P(), mesh)
    rng = np.random.default_rng(cfg.seed + 2)
    x = rng.standard_normal((cfg.requests * cfg.prompt_len, cfg.hidden), np.float32)
    prompt_lens = cfg.prompt_lens()
    prefill, decode = make_steps(mesh, cfg, record)
    pools, y, *step_records = prefill(params, pools, put(x.astype(BF16), P("dp"), mesh),
                                      put(prompt_lens, P("dp"), mesh), table)
    if record:
        records.append(jax.tree.map(fetch, step_records[0]))
    outputs = {"prefill": fetch(y)}
    last = np.arange(cfg.requests) * cfg.prompt_len + prompt_lens - 1
    x = put(np.asarray(rms_norm(jnp.asarray(outputs["prefill"][last])).astype(BF16)),
            P("dp"), mesh)
    seq_lens = put(prompt_lens + 1, P("dp"), mesh)
    compiled = decode.lower(params, pools, x, seq_lens, table).compile()
    times, decoded = [], []
    for _ in range(cfg.decode_steps):
        start = time.perf_counter()
        pools, y, x, *step_records = jax.block_until_ready(
            compiled(params, pools, x, seq_lens, table))
        times.append(time.perf_counter() - start)
        decoded.append(fetch(y))
        if record:
            records.append(jax.tree.map(fetch, step_records[0]))
        seq_lens = seq_lens + 1
    outputs["decode"] = np.stack(decoded)
    outputs["pools"] = np.stack([digest_bytes(fetch(p)) for p in pools])
    return outputs, times, _collectives(compiled.as_text())


def digest_bytes(a: np.ndarray) -> np.ndarray:
    return np.frombuffer(hashlib.sha256(np.ascontiguousarray(a).tobytes()).digest(), np.uint8)


def _collectives(hlo: str) -> str:
    names = ("all-gather", "all-reduce", "all-to-all", "collective-permute", "reduce-scatter")
    counts = {n: hlo.count(f" {n}(") + hlo.count(f" {n}-start(") for n in names}
    return ", ".join(f"{n} {c}" for n, c in counts.items() if c) or "none"


def make_mesh(tp: int, dp: int, devices=None) -> Mesh:
    devices = (devices or jax.devices())[: tp * dp]
    if len(devices) < tp * dp:
        raise SystemExit(f"--tp {tp} --dp {dp} needs {tp * dp} devices, have {len(devices)}"
                         " (on a CPU, add --cpu-devices N)")
    return Mesh(np.array(devices).reshape(dp, tp), ("dp", "tp"))


HIDDEN_TOLERANCE = 1e-2
"""Relative L2 difference of the hidden states allowed against TP=1 (bf16 rounding)."""


def same_bits(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    return all(np.array_equal(a[k].view(np.uint8), b[k].view(np.uint8)) for k in a)


def relative_error(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> float:
    """Relative L2 distance of the hidden states (prefill and every decode step)."""
    x = np.concatenate([a[k].astype(np.float64).ravel() for k in ("prefill", "decode")])
    y = np.concatenate([b[k].astype(np.float64).ravel() for k in ("prefill", "decode")])
    return float(np.linalg.norm(x - y) / np.linalg.norm(y))


def operations_bit_equal_on_one_device(records: list) -> tuple[bool, int]:
    """Recompute our operations of every recorded step and layer on one device from the
    recorded inputs; ``(all bits equal, how many layer-steps were compared)``."""
    device = jax.local_devices()[0]
    ops = jax.jit(mxfp4_operations)
    compared, equal = 0, True
    for step in records:
        for layer in range(step["q"].shape[0]):
            inputs = {name: jax.device_put(jax.tree.map(lambda a, i=layer: a[i], step[name]),
                                           device)
                      for name in ("pools", "q", "k", "v", "iq", "ik", "positions",
                                   "requests", "table")}
            new_pools, (values, scales) = ops(**inputs)
            got = (*new_pools, values, scales)
            want = (*step["new_pools"], step["values"], step["scales"])
            equal &= all(np.array_equal(np.asarray(a).view(np.uint8), b[layer].view(np.uint8))
                         for a, b in zip(got, want, strict=True))
            compared += 1
    return equal, compared


def check_against_tp1(cfg: Config, args, outputs, records: list) -> bool:
    """What ``--check`` holds (see the module docstring): our operations bit for bit against
    one device from the same inputs; the hidden states against a TP=1, DP=1 run to bf16
    rounding (bit equality printed)."""
    ops_equal, compared = operations_bit_equal_on_one_device(records)
    print(f"jax_mxfp4 operations (cache writes, index scores, selection, sparse attention with "
          f"MXFP8 output) of {compared} layer-steps equal one device on the same inputs bit "
          f"for bit: {ops_equal}")
    single, single_times, _ = serve(cfg, make_mesh(1, 1, jax.local_devices()))
    equal, error = same_bits(outputs, single), relative_error(outputs, single)
    print(f"TP=1 DP=1 decode step: median {np.median(single_times) * 1e3:.2f} ms")
    print(f"hidden states: TP={args.tp} DP={args.dp} equals TP=1 DP=1 bit for bit: {equal} "
          f"(relative L2 difference {error:.2e}; held to <= {HIDDEN_TOLERANCE:.0e})")
    return ops_equal and error <= HIDDEN_TOLERANCE


def _arguments(argv) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel degree (heads)")
    parser.add_argument("--dp", type=int, default=1, help="data-parallel degree (requests)")
    parser.add_argument("--cpu-devices", type=int, default=0,
                        help="split the CPU into this many devices (before jax starts)")
    parser.add_argument("--compare-backend", choices=jm.backends(), default=None,
                        help="rerun on this jax_mxfp4 backend (e.g. 'auto': the CPU handlers, "
                        "against JAX_MXFP4_BACKEND=emulated-gfx950) and compare the hidden "
                        "states")
    parser.add_argument("--check", action="store_true",
                        help="recompute our operations on one device and compare bits; rerun "
                        "with TP=1, DP=1 and compare the hidden states")
    parser.add_argument("--coordinator", default=None, metavar="HOST:PORT",
                        help="run as one of --num-processes processes (one per host): "
                        "jax.distributed.initialize with this coordinator (process 0's host)")
    parser.add_argument("--num-processes", type=int, default=1)
    parser.add_argument("--process-id", type=int, default=0)
    parser.add_argument("--save", default=None, metavar="PATH.npz",
                        help="process 0 writes the hidden states' and pool digests' bytes here")
    for field in dataclasses.fields(Config):
        parser.add_argument("--" + field.name.replace("_", "-"), type=int, default=field.default)
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = _arguments(sys.argv[1:] if argv is None else argv)
    if args.cpu_devices:
        jax.config.update("jax_num_cpu_devices", args.cpu_devices)
    if args.coordinator:  # before anything asks JAX for its devices
        jax.distributed.initialize(coordinator_address=args.coordinator,
                                   num_processes=args.num_processes, process_id=args.process_id)
    cfg = Config(**{f.name: getattr(args, f.name) for f in dataclasses.fields(Config)})
    if cfg.kv_heads % args.tp or cfg.requests % args.dp:
        raise SystemExit("--tp must divide --kv-heads and --dp must divide --requests")
    mesh = make_mesh(args.tp, args.dp)
    records = [] if args.check else None
    outputs, times, collectives = serve(cfg, mesh, records)
    if args.save and jax.process_index() == 0:
        np.savez(args.save, **{name: a.view(np.uint8) for name, a in outputs.items()})
    print(f"{jax.devices()[0].platform}, backend {jm.get_backend()}: TP={args.tp} "
          f"DP={args.dp}, {jax.process_count()} process(es), {cfg}")
    print(f"decode step: median {np.median(times) * 1e3:.2f} ms over {len(times)} steps "
          f"(min {min(times) * 1e3:.2f} ms); collectives in the step: {collectives}")
    if args.check and not check_against_tp1(cfg, args, outputs, records):
        return 1
    if args.compare_backend and not compare_backends(cfg, mesh, outputs, args.compare_backend):
        return 1
    return 0


def compare_backends(cfg: Config, mesh: Mesh, outputs, other: str) -> bool:
    """The same run on backend ``other``: hidden states within bf16 rounding of this one's."""
    with jm.backend_scope(other):
        theirs, times, _ = serve(cfg, mesh)
    error = relative_error(outputs, theirs)
    print(f"backend {other} decode step: median {np.median(times) * 1e3:.2f} ms")
    print(f"hidden states: backend {jm.get_backend()} equals backend {other} bit for bit: "
          f"{same_bits(outputs, theirs)} (relative L2 difference {error:.2e}; held to <= "
          f"{HIDDEN_TOLERANCE:.0e})")
    return error <= HIDDEN_TOLERANCE


if __name__ == "__main__":
    sys.exit(main())
