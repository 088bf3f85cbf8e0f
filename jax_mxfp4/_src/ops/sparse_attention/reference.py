"""Reference ``sparse_attention``: paged attention over selected MXFP4 K/V pages (SPEC §7, §8).

Rows are (token ``t``, kv head ``h``); row ``(t, h)`` attends with q heads ``h*G .. h*G+G-1``
(``G = Hq // Hkv``) over the first ``context_lens[t, h]`` tokens of the pages
``page_table[t, h, :]`` of kv head ``h``. Tokens past the context, and every token of a page id
outside ``[0, P)``, are masked (score ``-inf`` and value 0, so garbage cannot leak); a row with
nothing to attend to outputs zeros. A live token whose logit is not finite (a NaN key or query,
an overflow) makes its q head's output NaN; NaN and infinite V elements of live tokens enter
the weighted sum as IEEE arithmetic says (SPEC §9.2).
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from jax_mxfp4._src.core import formats, validate
from jax_mxfp4._src.core._bits import (
    exact_div,
    exact_scaled_f32,
    f32_bits,
    f32_from_bits,
    pow2,
    widen_rounded,
)
from jax_mxfp4._src.core.formats import HEAD_DIM, PAGE_TOKENS
from jax_mxfp4._src.core.metadata import as_int32
from jax_mxfp4._src.core.scaling import FLT_MIN
from jax_mxfp4._src.ops.reference_common import (
    map_row_chunks,
    rows_per_chunk,
    scale_by_exponent,
    token_keys,
    token_values,
)

OUTPUTS = ("bf16", "mxfp8")


def attention_query(q: jnp.ndarray) -> tuple[jnp.ndarray, jnp.ndarray, jnp.ndarray]:
    """The e4m3 query the QK product uses, and the scale restored on the logits (SPEC §7.1).

    A bf16 query row (one token, one q head) is normalized by ``q_scale = max(amax / 448,
    FLT_MIN)`` and rounded to e4m3; an e4m3 query is used as stored (``q_scale = 1``).
    Returns ``(q8 f32[..., D], exponent int32[...], mantissa f32[...])`` with
    ``q_scale = mantissa * 2**exponent``, mantissa in [1, 2).
    """
    if q.dtype == jnp.float8_e4m3fn:
        ones = jnp.ones(q.shape[:-1], jnp.float32)
        return widen_rounded(q), jnp.zeros(q.shape[:-1], jnp.int32), ones
    bits = f32_bits(q.astype(jnp.bfloat16))
    amax = f32_from_bits(jnp.max(bits & jnp.uint32(0x7FFFFFFF), axis=-1))
    q_scale = jnp.maximum(exact_div(amax, formats.E4M3_MAX), jnp.float32(FLT_MIN))
    # q / q_scale with both sides lifted by 2**64 when q_scale is tiny, so subnormal query
    # elements keep their value on backends that flush subnormal operands.
    lift = jnp.where(q_scale < 2.0**-60, 64, 0)
    numerator = exact_scaled_f32(bits, lift[..., None])
    q8 = formats.to_e4m3(exact_div(numerator, (q_scale * pow2(lift))[..., None]))
    q8 = widen_rounded(q8)
    scale_bits = f32_bits(q_scale)
    exponent = ((scale_bits >> 23) & 0xFF).astype(jnp.int32) - 127
    mantissa = f32_from_bits((scale_bits & 0x7FFFFF) | 0x3F800000)
    return q8, exponent, mantissa


def _attend_rows(q8, q_exp, q_mant, pages, context, k_pool, v_pool, sm_scale):
    """Attention of a chunk of tokens, all kv heads. Shapes: q8 ``[c, Hkv, G, D]``, q_exp and
    q_mant ``[c, Hkv, G]``, pages ``[c, Hkv, n]``, context ``[c, Hkv]`` -> ``f32[c, Hkv, G, D]``.
    """
    num_pages, num_kv_heads = k_pool.shape[0], k_pool.shape[1]
    rows, _, n = pages.shape
    page_ok = (pages >= 0) & (pages < num_pages)
    safe = jnp.clip(pages, 0, num_pages - 1)
    heads = jnp.arange(num_kv_heads)[None, :, None]
    keys, key_exp = token_keys(k_pool[safe, heads])  # [c, Hkv, n, 128, D], [c, Hkv, n, 128]
    values = token_values(v_pool[safe, heads])
    tokens = n * PAGE_TOKENS
    keys = keys.reshape(rows, num_kv_heads, tokens, HEAD_DIM)
    values = values.reshape(rows, num_kv_heads, tokens, HEAD_DIM)
    key_exp = key_exp.reshape(rows, num_kv_heads, tokens)
    live = (jnp.arange(tokens) < context[..., None]) & jnp.repeat(page_ok, PAGE_TOKENS, axis=-1)

    dots = jnp.einsum("thgd,thkd->thgk", q8, keys, precision=lax.Precision.HIGHEST)
    logits = scale_by_exponent(dots, key_exp[:, :, None, :] + q_exp[..., None])
    logits = logits * q_mant[..., None] * jnp.float32(sm_scale)
    row_max = jnp.max(jnp.where(live[:, :, None, :], logits, -jnp.inf), axis=-1, keepdims=True)
    weights = jnp.where(live[:, :, None, :], jnp.exp(logits - row_max), 0.0)
    total = jnp.sum(weights, axis=-1, keepdims=True)
    # Normalize before the PV sum so large finite values cannot overflow the fp32 sum.
    weights = jnp.where(total > 0, weights / jnp.where(total > 0, total, 1.0), 0.0)
    values = jnp.where(live[..., None], values, 0.0)
    out = jnp.einsum("thgk,thkd->thgd", weights, values, precision=lax.Precision.HIGHEST)
    # A live logit that is not finite makes the q head's whole output NaN (SPEC §9.2).
    poisoned = jnp.any(live[:, :, None, :] & ~jnp.isfinite(logits), axis=-1)
    return jnp.where(poisoned[..., None], jnp.nan, out)


def sparse_attention(
    q: jnp.ndarray,
    k_pool: jnp.ndarray,
    v_pool: jnp.ndarray,
    page_table: jnp.ndarray,
    context_lens: jnp.ndarray,
    *,
    sm_scale: float,
    output: str = "bf16",
):
    """Sparse paged attention.

    Args:
      q: ``bfloat16 | float8_e4m3fn [T, Hq, 128]``.
      k_pool, v_pool: ``uint8[P, Hkv, 8704]``.
      page_table: ``int32[T, Hkv, n]`` physical page ids in attention order.
      context_lens: ``int32[T, Hkv]`` tokens attended through the page table.
      sm_scale: softmax scale (``128 ** -0.5`` for MiniMax-M3).
      output: ``"bf16"`` -> ``bfloat16[T, Hq, 128]``; ``"mxfp8"`` -> ``(float8_e4m3fn[T,
        Hq*128], uint8[T, Hq*4])``, the MXFP8 quantization of the bf16 output.
    """
    validate.scale(sm_scale)  # SPEC §9.3: a normal fp32, as the public API demands
    q, k_pool, v_pool = jnp.asarray(q), jnp.asarray(k_pool), jnp.asarray(v_pool)
    page_table = as_int32(page_table, "page_table", "id")  # SPEC §2.4
    context_lens = as_int32(context_lens, "context_lens", "length")
    num_tokens, num_q_heads, head_dim = q.shape
    num_kv_heads = k_pool.shape[1]
    group = num_q_heads // num_kv_heads
    n = page_table.shape[-1]
    q8, q_exp, q_mant = attention_query(q)
    shape4 = (num_tokens, num_kv_heads, group)
    q8 = q8.reshape(*shape4, head_dim)
    context = jnp.clip(context_lens, 0, n * PAGE_TOKENS)

    def rows(q8, q_exp, q_mant, pages, context):
        return _attend_rows(q8, q_exp, q_mant, pages, context, k_pool, v_pool, sm_scale)

    per_row_bytes = 4 * num_kv_heads * n * PAGE_TOKENS * (2 * head_dim + 2 * group)
    chunk = rows_per_chunk(per_row_bytes, num_tokens)
    out = map_row_chunks(
        rows,
        (q8, q_exp.reshape(shape4), q_mant.reshape(shape4), page_table, context),
        chunk,
    )
    out = out.reshape(num_tokens, num_q_heads, head_dim).astype(jnp.bfloat16)
    if output == "mxfp8":
        return formats.quantize_mxfp8(out.reshape(num_tokens, num_q_heads * head_dim))
    return out
