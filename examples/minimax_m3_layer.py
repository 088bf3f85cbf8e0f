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
own requests' pages (ids stay global: see ``jax_mxfp4/primitives/_sharding.py``). The MXFP4
operations run per shard with no communication. The output projection sums the kv-head
groups' partial products in a fixed order after gathering them, so every TP degree gives the
same bits (``--check`` proves it against TP=1); the usual one all-reduce would equal it only
to rounding. DP runs equal TP=1 to rounding (see ``check_against_tp1``).
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
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import jax_mxfp4 as jm
from jax_mxfp4.demo.layer import HEAD_DIM, PAGE, SM_SCALE, TOPK, rms_norm, rope

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

    k_pool, v_pool, index_pool = pools
    slots = jm.slot_mapping(table, positions, requests)
    k_pool, v_pool, index_pool = jm.write_kv_cache(k_pool, v_pool, index_pool, k, v, ik, slots)
    scores = jm.index_scores(iq, index_pool, table, positions, requests,
                             num_blocks=table.shape[1], sm_scale=SM_SCALE)
    sel = jm.select_blocks(scores, table, positions, requests, topk=TOPK)
    values, scales = jm.sparse_attention(q, k_pool, v_pool, sel.page_table, sel.context_lens,
                                         sm_scale=SM_SCALE, output="mxfp8")
    y = output_projection(values, scales, p["wo"], mesh)
    return (k_pool, v_pool, index_pool), (x.astype(F32) + y).astype(BF16)


def forward(params, pools, x, positions, requests, table, mesh: Mesh):
    """Every layer: ``lax.scan`` over the stacked weights, with the stacked pools in the carry.

    Each layer's pools are sliced out and written back with ``dynamic_update_slice``, which
    XLA does in place; passing the pools as scanned inputs and outputs instead would copy the
    whole stack every step. (The slice itself is still one copy of a layer's pools.)
    """

    def layer(carry, p):
        x, pools, index = carry
        mine = [jax.lax.dynamic_index_in_dim(pool, index, keepdims=False) for pool in pools]
        mine, x = attention_block(p, mine, x, positions, requests, table, mesh)
        pools = tuple(jax.lax.dynamic_update_index_in_dim(pool, new, index, 0)
                      for pool, new in zip(pools, mine, strict=True))
        return (x, pools, index + 1), None

    (x, pools, _), _ = jax.lax.scan(layer, (x, tuple(pools), 0), params)
    return pools, x


def prompt_rows(prompt_lens: jax.Array, width: int) -> tuple[jax.Array, jax.Array]:
    """Rows of a prefill where request b owns rows ``b*width .. b*width + width - 1`` (so a
    request's rows stay on its dp shard): positions ``0..len-1``, then padding (-1)."""
    offsets = jnp.arange(width, dtype=jnp.int32)
    positions = jnp.where(offsets[None, :] < prompt_lens[:, None], offsets[None, :], -1)
    requests = jnp.repeat(jnp.arange(prompt_lens.shape[0], dtype=jnp.int32), width)
    return positions.reshape(-1), requests


def make_steps(mesh: Mesh, cfg: Config):
    """The jitted prefill and decode steps; pools (argument 1) are donated."""
    rows = NamedSharding(mesh, P("dp"))
    pools_out = tuple(NamedSharding(mesh, s) for s in POOL_SPECS)

    def prefill(params, pools, x, prompt_lens, table):
        positions, requests = prompt_rows(prompt_lens, cfg.prompt_len)
        return forward(params, pools, x, positions, requests, table, mesh)

    def decode(params, pools, x, seq_lens, table):
        positions, requests = jm.decode_rows(seq_lens, 1)
        pools, y = forward(params, pools, x, positions, requests, table, mesh)
        return pools, y, rms_norm(y).astype(BF16)  # the next step's input: a stand-in token

    out = (pools_out, rows)
    return (jax.jit(prefill, donate_argnums=1, out_shardings=out),
            jax.jit(decode, donate_argnums=1, out_shardings=(*out, rows)))


def block_table(cfg: Config, dp: int) -> np.ndarray:
    """Request b's pages, shuffled within its dp shard's share of the pool."""
    rng = np.random.default_rng(cfg.seed + 1)
    per_shard = cfg.requests // dp * cfg.pages_per_request
    table = np.concatenate([s * per_shard + rng.permutation(per_shard) for s in range(dp)])
    return table.reshape(cfg.requests, cfg.pages_per_request).astype(np.int32)


def put(tree, specs, mesh: Mesh):
    return jax.tree.map(lambda a, s: jax.device_put(a, NamedSharding(mesh, s)), tree, specs)


def serve(cfg: Config, mesh: Mesh) -> tuple[dict[str, np.ndarray], list[float], str]:
    """Prefill every prompt, then decode. Returns the outputs (the prefill's hidden states
    and each decode step's), the decode-step times (s) and the decode step's collectives."""
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
    prefill, decode = make_steps(mesh, cfg)
    pools, y = prefill(params, pools, put(x.astype(BF16), P("dp"), mesh),
                       put(prompt_lens, P("dp"), mesh), table)
    outputs = {"prefill": np.asarray(y)}
    last = np.arange(cfg.requests) * cfg.prompt_len + prompt_lens - 1
    x = put(np.asarray(rms_norm(jnp.asarray(outputs["prefill"][last])).astype(BF16)),
            P("dp"), mesh)
    seq_lens = put(prompt_lens + 1, P("dp"), mesh)
    compiled = decode.lower(params, pools, x, seq_lens, table).compile()
    times, decoded = [], []
    for _ in range(cfg.decode_steps):
        start = time.perf_counter()
        pools, y, x = jax.block_until_ready(compiled(params, pools, x, seq_lens, table))
        times.append(time.perf_counter() - start)
        decoded.append(np.asarray(y))
        seq_lens = seq_lens + 1
    outputs["decode"] = np.stack(decoded)
    outputs["pools"] = np.stack([digest_bytes(np.asarray(p)) for p in pools])
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


def same_bits(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    return all(np.array_equal(a[k].view(np.uint8), b[k].view(np.uint8)) for k in a)


def relative_error(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> float:
    """Relative L2 distance of the hidden states (prefill and every decode step)."""
    x = np.concatenate([a[k].astype(np.float64).ravel() for k in ("prefill", "decode")])
    y = np.concatenate([b[k].astype(np.float64).ravel() for k in ("prefill", "decode")])
    return float(np.linalg.norm(x - y) / np.linalg.norm(y))


def check_against_tp1(cfg: Config, args, outputs) -> bool:
    """Rerun on one device and compare. Only TP differs: the bits must be equal. With DP > 1
    the dense matmuls around the MXFP4 operations (XLA's, not ours) see fewer rows per device
    and may round differently (XLA:CPU takes another dot routine for one row), so DP runs
    are held to bf16 rounding."""
    single, single_times, _ = serve(cfg, make_mesh(1, 1))
    equal, error = same_bits(outputs, single), relative_error(outputs, single)
    print(f"TP=1 DP=1 decode step: median {np.median(single_times) * 1e3:.2f} ms")
    print(f"TP={args.tp} DP={args.dp} equals TP=1 DP=1 bit for bit: {equal} "
          f"(relative L2 difference {error:.2e})")
    return equal or (args.dp > 1 and error < 1e-2)


def _arguments(argv) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel degree (heads)")
    parser.add_argument("--dp", type=int, default=1, help="data-parallel degree (requests)")
    parser.add_argument("--cpu-devices", type=int, default=0,
                        help="split the CPU into this many devices (before jax starts)")
    parser.add_argument("--check", action="store_true",
                        help="rerun with TP=1, DP=1 on the first device; compare bits")
    for field in dataclasses.fields(Config):
        parser.add_argument("--" + field.name.replace("_", "-"), type=int, default=field.default)
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = _arguments(sys.argv[1:] if argv is None else argv)
    if args.cpu_devices:
        jax.config.update("jax_num_cpu_devices", args.cpu_devices)
    cfg = Config(**{f.name: getattr(args, f.name) for f in dataclasses.fields(Config)})
    if cfg.kv_heads % args.tp or cfg.requests % args.dp:
        raise SystemExit("--tp must divide --kv-heads and --dp must divide --requests")
    mesh = make_mesh(args.tp, args.dp)
    outputs, times, collectives = serve(cfg, mesh)
    print(f"{jax.devices()[0].platform}: TP={args.tp} DP={args.dp}, {cfg}")
    print(f"decode step: median {np.median(times) * 1e3:.2f} ms over {len(times)} steps "
          f"(min {min(times) * 1e3:.2f} ms); collectives in the step: {collectives}")
    if args.check and not check_against_tp1(cfg, args, outputs):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
