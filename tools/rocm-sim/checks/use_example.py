# The README "Use" example, verbatim, plus: jm.explain of decode_step, the intermediate results
# (scores, selection, bf16 and MXFP8 attention) and every result saved to an .npz for comparison.
import functools
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import jax_mxfp4 as jm

t0 = time.time()


def T(m):
    print(f"[{time.time() - t0:8.2f}s] {m}", flush=True)


T(f"jax {jax.__version__} devices={jax.devices()} backend={jm.get_backend()}")
d0 = jax.devices()[0]
T(f"device platform={d0.platform} kind={d0.device_kind} "
  f"compute_capability={getattr(d0, 'compute_capability', None)!r}")

B, KV_HEADS, Q_HEADS, BLOCKS = 4, 2, 16, 8   # requests, kv heads, q heads, blocks per request
D = jm.HEAD_DIM                               # 128
num_pages = B * BLOCKS                        # request b owns pages b*BLOCKS .. b*BLOCKS+7
k_pool = jm.new_pool(num_pages, num_heads=KV_HEADS)   # uint8[P, Hkv, 8704], 128 tokens a page
v_pool = jm.new_pool(num_pages, num_heads=KV_HEADS)
index_pool = jm.new_pool(num_pages)                   # uint8[P, 8704]: one shared index head
block_table = jnp.arange(num_pages, dtype=jnp.int32).reshape(B, BLOCKS)  # block j -> page

# A prompt of 900 tokens per request, written through prefill rows (one row per token).
rng = np.random.default_rng(0)
bf16 = lambda *shape: jnp.asarray(rng.standard_normal(shape), jnp.bfloat16)  # noqa: E731
prompt = 900
positions, requests = jm.prefill_rows(jnp.arange(B + 1, dtype=jnp.int32) * prompt,
                                      jnp.zeros(B, jnp.int32), B * prompt)
slots = jm.slot_mapping(block_table, positions, requests)  # page * 128 + offset, -1: skip
prefill_kv = (bf16(B * prompt, KV_HEADS, D), bf16(B * prompt, KV_HEADS, D), bf16(B * prompt, D))
if os.environ.get("EXPLAIN"):
    print(jm.explain(jm.write_kv_cache, k_pool, v_pool, index_pool, *prefill_kv, slots), flush=True)
k_pool, v_pool, index_pool = jm.write_kv_cache(
    k_pool, v_pool, index_pool, *prefill_kv, slots)
saved = {"prefill_k_pool": np.asarray(k_pool), "prefill_v_pool": np.asarray(v_pool),
         "prefill_index_pool": np.asarray(index_pool)}
T("prefill write_kv_cache done")


@functools.partial(jax.jit, donate_argnums=(5, 6, 7))  # the pools are updated in place
def decode_step(q, q_index, k, v, k_index, k_pool, v_pool, index_pool, block_table, seq_lens):
    positions, requests = jm.decode_rows(seq_lens, tokens_per_request=1)  # seq_len - 1
    slots = jm.slot_mapping(block_table, positions, requests)
    k_pool, v_pool, index_pool = jm.write_kv_cache(k_pool, v_pool, index_pool, k, v, k_index,
                                                   slots)
    scores = jm.index_scores(q_index, index_pool, block_table, positions, requests,
                             num_blocks=block_table.shape[1], sm_scale=D**-0.5)  # f32[H, T, 8]
    sel = jm.select_blocks(scores, block_table, positions, requests, topk=4)
    out = jm.sparse_attention(q, k_pool, v_pool, sel.page_table, sel.context_lens,
                              sm_scale=D**-0.5)                  # bf16[T, Hq, 128]
    return out, k_pool, v_pool, index_pool


@jax.jit
def decode_parts(q, q_index, k, v, k_index, k_pool, v_pool, index_pool, block_table, seq_lens):
    """The same step, every intermediate returned (no donation)."""
    positions, requests = jm.decode_rows(seq_lens, tokens_per_request=1)
    slots = jm.slot_mapping(block_table, positions, requests)
    k_pool, v_pool, index_pool = jm.write_kv_cache(k_pool, v_pool, index_pool, k, v, k_index,
                                                   slots)
    scores = jm.index_scores(q_index, index_pool, block_table, positions, requests,
                             num_blocks=block_table.shape[1], sm_scale=D**-0.5)
    sel = jm.select_blocks(scores, block_table, positions, requests, topk=4)
    out = jm.sparse_attention(q, k_pool, v_pool, sel.page_table, sel.context_lens,
                              sm_scale=D**-0.5)
    fp8, fp8_scales = jm.sparse_attention(q, k_pool, v_pool, sel.page_table, sel.context_lens,
                                          sm_scale=D**-0.5, output="mxfp8")
    return dict(scores=scores, page_table=sel.page_table, context_lens=sel.context_lens,
                out=out, mxfp8=fp8, mxfp8_scales=fp8_scales)


step = (bf16(B, Q_HEADS, D), bf16(B, KV_HEADS, D), bf16(B, KV_HEADS, D), bf16(B, KV_HEADS, D),
        bf16(B, D))
seq_lens = jnp.full((B,), prompt + 1, jnp.int32)  # the prompt and this step's token
if os.environ.get("EXPLAIN"):
    print(jm.explain(decode_parts, *step, k_pool, v_pool, index_pool, block_table, seq_lens),
          flush=True)
if os.environ.get("EXPLAIN_ONLY"):
    sys.exit(0)
parts = decode_parts(*step, k_pool, v_pool, index_pool, block_table, seq_lens)
parts = {k: np.asarray(v) for k, v in parts.items()}
T("decode_parts done: " + ", ".join(f"{k}{list(v.shape)}" for k, v in parts.items()))
saved.update({"parts_" + k: v for k, v in parts.items()})
out, k_pool, v_pool, index_pool = decode_step(*step, k_pool, v_pool, index_pool, block_table,
                                              seq_lens)
print(out.shape, out.dtype)  # (4, 16, 128) bfloat16
saved.update(out=np.asarray(out), k_pool=np.asarray(k_pool), v_pool=np.asarray(v_pool),
             index_pool=np.asarray(index_pool))
T("decode_step done")


def as_bits(v):
    """bf16 as uint16 and one-byte floats as uint8: np.savez keeps their bits."""
    if v.dtype == jnp.bfloat16:
        return v.view(np.uint16)
    return v.view(np.uint8) if v.dtype.itemsize == 1 and v.dtype != np.uint8 else v


np.savez(sys.argv[1], **{k: as_bits(v) for k, v in saved.items()})
T(f"saved {sys.argv[1]}")
