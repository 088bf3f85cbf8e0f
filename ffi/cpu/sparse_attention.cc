// jax_mxfp4_sparse_attention and jax_mxfp4_sparse_attention_mxfp8: paged attention over the
// selected MXFP4 K/V pages (SPEC §7, §7.1, §8; reference/sparse_attention.py).
//
//   operands: q bf16 | f8e4m3fn [T, Hq, 128], k_pool u8[P, Hkv, 8704], v_pool u8[P, Hkv, 8704],
//             page_table s32[T, Hkv, n], context_lens s32[T, Hkv]
//   attribute: sm_scale f32
//   results: bf16[T, Hq, 128]                                  (jax_mxfp4_sparse_attention)
//            f8e4m3fn[T, Hq*128] values, u8[T, Hq*4] scales    (..._mxfp8: the MXFP8
//            quantization of the bf16 output, computed here, SPEC §1.6)
//
// Row (t, h) attends with q heads h*G .. h*G+G-1 (G = Hq / Hkv) over the first
// clamp(context_lens[t, h], 0, n*128) virtual tokens; token i lives in page page_table[t, h,
// i / 128] and is masked when that id is outside [0, P). Per row: logits of every live token
// (pass 1), an fp32 softmax with the weights normalized before the PV sum, then the PV sum
// (pass 2); rows with nothing live give zeros, and a q head with a live logit that is not
// finite gives NaN (SPEC §9.2). The AVX-512 kernels round the normalized weights to bf16
// for the PV dot products (aiter's P, SPEC §7: within the SPEC §10 tolerance); the generic
// kernels keep them in fp32. Per-worker scratch is sized by the longest row's page slots
// (its context), not by the page table's width, and is not zero-filled: every element read
// is written first.
#include <cmath>
#include <limits>

#include "cpu/handlers.h"
#include "cpu/kernels.h"

namespace jax_mxfp4 {
namespace {

constexpr const char* kTarget = "jax_mxfp4_sparse_attention";
constexpr float kFltMin = 1.17549435e-38f;

struct Problem {
  int64_t rows, q_heads, kv_heads, group, num_pages, width;
  int64_t slots;  // page slots of the longest row: max over rows of ceil(ctx / 128)
  bool q_bf16, avx;
  const uint8_t* q;
  const uint8_t* k_pool;
  const uint8_t* v_pool;
  const int32_t* page_table;
  const int32_t* context;
  float sm_scale;
};

struct Outputs {
  uint16_t* bf16 = nullptr;    // [T, Hq, 128], or
  uint8_t* values = nullptr;   // [T, Hq*128] e4m3 and
  uint8_t* scales = nullptr;   // [T, Hq*4]
};

// A worker's scratch for one page; the per-row buffers (sized by G and n) are RowBuffers.
struct Workspace {
  KeyMeta meta;
  alignas(64) uint32_t kt[kTokenBytes * kPageTokens];  // AVX-512 keys, bf16 pairs
  alignas(64) float kf[kHeadDim * kPageTokens];        // generic keys, fp32 [d][token]
  alignas(64) float vf[kPageTokens * kHeadDim];        // generic values, fp32 [token][d]
  alignas(64) uint32_t vp[kPageTokens / 2 * kHeadDim];  // AVX-512 values, bf16 token pairs
  alignas(64) float dots[12 * 32 + kPageTokens];
};

// Per-row buffers of one worker; s = Problem::slots page slots (the longest row's pages).
struct RowBuffers {
  int64_t* ntok;      // [s]: live tokens of each page (0 for a masked page)
  float* logits;      // [G, s*128]: logits, then weights
  float* out;         // [G, 128]
  float* q8;          // [G, 128]
  float* mant;        // [G]
  int32_t* exp;       // [G]
  int32_t* poisoned;  // [G]: a live logit is not finite (the q head's output is NaN)
  uint32_t* qa;       // [G, 64]
  uint32_t* wb;       // [G, s*64]: AVX-512 weights as bf16, two tokens per dword

  static int64_t Floats(const Problem& p) {
    return 2 * p.slots +
           p.group * (p.slots * kPageTokens * 3 / 2 + 2 * kHeadDim + 3 + kTokenBytes) + 16;
  }
  static RowBuffers At(const Problem& p, float* base) {
    RowBuffers b;
    b.ntok = reinterpret_cast<int64_t*>(base);
    b.logits = base + 2 * p.slots;
    b.out = b.logits + p.group * p.slots * kPageTokens;
    b.q8 = b.out + p.group * kHeadDim;
    b.mant = b.q8 + p.group * kHeadDim;
    b.exp = reinterpret_cast<int32_t*>(b.mant + p.group);
    b.poisoned = b.exp + p.group;
    b.qa = reinterpret_cast<uint32_t*>(b.poisoned + p.group);
    b.wb = b.qa + p.group * kTokenBytes;
    return b;
  }
};

// The e4m3 query of one (token, q head) and its scale (reference attention_query, §7.1).
void PrepareQuery(const Problem& p, int64_t t, int64_t qh, int64_t g, RowBuffers& rb) {
  float* q8 = rb.q8 + g * kHeadDim;
  if (!p.q_bf16) {
    const uint8_t* src = p.q + (t * p.q_heads + qh) * kHeadDim;
    for (int64_t d = 0; d < kHeadDim; ++d) q8[d] = E4m3ToF32(src[d]);
    rb.exp[g] = 0;
    rb.mant[g] = 1.0f;
  } else {
    uint16_t src[kHeadDim];
    std::memcpy(src, p.q + (t * p.q_heads + qh) * kHeadDim * 2, sizeof src);
    uint32_t amax_bits = 0;
    for (int64_t d = 0; d < kHeadDim; ++d) {
      amax_bits = std::max(amax_bits, (uint32_t{src[d]} << 16) & 0x7FFFFFFFu);
    }
    const float q_scale = std::max(F32FromBits(amax_bits) / 448.0f, kFltMin);
    const int lift = q_scale < 0x1p-60f ? 64 : 0;  // keeps subnormal q exact
    const uint32_t sbits = F32Bits(q_scale);
    rb.exp[g] = static_cast<int32_t>((sbits >> 23) & 0xFFu) - 127;
    rb.mant[g] = F32FromBits((sbits & 0x7FFFFFu) | 0x3F800000u);
#if JAX_MXFP4_HAVE_AVX512
    if (p.avx && lift == 0) {  // the SIMD path needs only the bf16 pairs
      avx512::ScaledQueryPairs(src, q_scale, rb.qa + g * kTokenBytes);
      return;
    }
#endif
    const float denominator = q_scale * Pow2(lift);
    for (int64_t d = 0; d < kHeadDim; ++d) {
      const float numerator = ExactScaledF32(uint32_t{src[d]} << 16, lift);
      q8[d] = E4m3ToF32(F32ToE4m3(numerator / denominator));
    }
  }
  for (int64_t i = 0; i < kTokenBytes; ++i) {
    rb.qa[g * kTokenBytes + i] =
        (F32Bits(q8[2 * i]) >> 16) | (F32Bits(q8[2 * i + 1]) & 0xFFFF0000u);
  }
}

// Pass 1 (generic): logits of tokens [0, ntok) of one key page into column `col`.
void PageLogitsGeneric(const Problem& p, const uint8_t* page, int64_t ntok, int64_t col,
                       RowBuffers& rb, Workspace& ws) {
  ComputeKeyMeta(page, ntok, &ws.meta);
  generic::DecodeKeysF32(page, ws.meta, ntok, ws.kf);
  const int64_t ld = p.slots * kPageTokens;
  for (int64_t g = 0; g < p.group; ++g) {
    generic::DotRow(rb.q8 + g * kHeadDim, ws.kf, ntok, ws.dots);
    float* logits = rb.logits + g * ld + col;
    for (int64_t tok = 0; tok < ntok; ++tok) {
      const float v = MulPow2(ws.dots[tok], ws.meta.exponent[tok] + rb.exp[g]);
      const bool nan = (ws.meta.nan_mask[tok / 16] >> (tok % 16)) & 1u;
      logits[tok] = nan ? std::numeric_limits<float>::quiet_NaN() : v * rb.mant[g] * p.sm_scale;
    }
  }
}

// Softmax of one head over its live tokens, in place (reference: max, exp, normalize).
// Returns whether a live logit is not finite (the head's output is then NaN, SPEC §9.2).
bool SoftmaxGeneric(float* w, const int64_t* ntok, int64_t pages) {
  float m = -std::numeric_limits<float>::infinity();
  bool poisoned = false;
  for (int64_t pg = 0; pg < pages; ++pg) {
    for (int64_t i = 0; i < ntok[pg]; ++i) {
      const float v = w[pg * kPageTokens + i];
      poisoned |= !std::isfinite(v);
      m = std::max(m, v);
    }
  }
  if (poisoned) m = std::numeric_limits<float>::quiet_NaN();
  float total = 0.0f;
  for (int64_t pg = 0; pg < pages; ++pg) {
    for (int64_t i = 0; i < ntok[pg]; ++i) {
      float& v = w[pg * kPageTokens + i];
      v = std::exp(v - m);
      total += v;
    }
  }
  const bool ok = total > 0.0f;
  for (int64_t pg = 0; pg < pages; ++pg) {
    for (int64_t i = 0; i < ntok[pg]; ++i) {
      float& v = w[pg * kPageTokens + i];
      v = ok ? v / total : 0.0f;
    }
  }
  return poisoned;
}

// Pass 2 (generic): out[g] += sum over tokens [0, ntok) of w[g][col + token] * value[token].
void PageValuesGeneric(const Problem& p, const uint8_t* page, int64_t ntok, int64_t col,
                       RowBuffers& rb, Workspace& ws) {
  generic::DecodeValuesF32(page, ntok, ws.vf);
  const int64_t ld = p.slots * kPageTokens;
  for (int64_t g = 0; g < p.group; ++g) {
    float* out = rb.out + g * kHeadDim;
    for (int64_t tok = 0; tok < ntok; ++tok) {
      const float w = rb.logits[g * ld + col + tok];
      const float* v = ws.vf + tok * kHeadDim;
      for (int64_t d = 0; d < kHeadDim; ++d) out[d] += w * v[d];
    }
  }
}

#if JAX_MXFP4_HAVE_AVX512
// Pass 1 (AVX-512): as PageLogitsGeneric, heads in tiles of <= 12, tokens in tiles of 32.
JAX_MXFP4_AVX512 void PageLogitsAvx512(const Problem& p, const uint8_t* page, int64_t ntok,
                                       int64_t col, RowBuffers& rb, Workspace& ws) {
  const int64_t ntok32 = (ntok + 31) / 32 * 32;
  avx512::DecodeKeysBf16(page, ntok32, &ws.meta, ws.kt);
  const int64_t ld = p.slots * kPageTokens;
  const int64_t tiles = (p.group + avx512::kMaxTileRows - 1) / avx512::kMaxTileRows;
  const int64_t per_tile = (p.group + tiles - 1) / tiles;
  const __m512 nan = _mm512_set1_ps(std::numeric_limits<float>::quiet_NaN());
  for (int64_t g0 = 0; g0 < p.group; g0 += per_tile) {
    const int mr = static_cast<int>(std::min(per_tile, p.group - g0));
    for (int64_t tok0 = 0; tok0 < ntok32; tok0 += 32) {
      avx512::DotTiles(mr, rb.qa + g0 * kTokenBytes, kTokenBytes, ws.kt + tok0, ws.dots);
      for (int r = 0; r < mr; ++r) {
        const int64_t g = g0 + r;
        const __m512 scale = _mm512_set1_ps(rb.mant[g]), sm = _mm512_set1_ps(p.sm_scale);
        for (int64_t half = 0; half < 32; half += 16) {
          const int64_t tok = tok0 + half;
          const __m512i k = _mm512_add_epi32(_mm512_loadu_si512(ws.meta.exponent + tok),
                                             _mm512_set1_epi32(rb.exp[g]));
          __m512 v = avx512::MulPow2(_mm512_loadu_ps(ws.dots + r * 32 + half), k);
          v = _mm512_mul_ps(_mm512_mul_ps(v, scale), sm);
          v = _mm512_mask_blend_ps(ws.meta.nan_mask[tok / 16], v, nan);
          _mm512_storeu_ps(rb.logits + g * ld + col + tok, v);
        }
      }
    }
  }
}

// Lanes [0, n) of 16.
JAX_MXFP4_AVX512 inline __mmask16 Live(int64_t n) {
  return static_cast<__mmask16>((1u << std::clamp<int64_t>(n, 0, 16)) - 1u);
}

// Softmax of one head over its live tokens (AVX-512): exp(logit - max) in place, then the
// normalized weights as bf16 into wb (two tokens per dword; 0 past each page's live tokens).
// The bf16 weights are the aiter kernel's P (SPEC §7); an empty row gives zeros. Returns
// whether a live logit is not finite (the head's output is then NaN, SPEC §9.2).
JAX_MXFP4_AVX512 bool SoftmaxAvx512(float* w, const int64_t* ntok, int64_t pages, uint32_t* wb) {
  __m512 m = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  const __m512 inf = _mm512_set1_ps(std::numeric_limits<float>::infinity());
  __mmask16 poisoned = 0;
  for (int64_t pg = 0; pg < pages; ++pg) {
    for (int64_t i = 0; i < ntok[pg]; i += 16) {
      const __mmask16 live = Live(ntok[pg] - i);
      const __m512 v = _mm512_maskz_loadu_ps(live, w + pg * kPageTokens + i);
      poisoned |= _mm512_mask_cmp_ps_mask(live, _mm512_abs_ps(v), inf, _CMP_NLT_UQ);
      m = _mm512_mask_max_ps(m, live, m, v);
    }
  }
  const __m512 mx = _mm512_set1_ps(poisoned ? std::numeric_limits<float>::quiet_NaN()
                                            : avx512::HMax(m));
  __m512 sum = _mm512_setzero_ps();
  for (int64_t pg = 0; pg < pages; ++pg) {
    for (int64_t i = 0; i < ntok[pg]; i += 16) {
      const __mmask16 live = Live(ntok[pg] - i);
      float* at = w + pg * kPageTokens + i;
      const __m512 e = avx512::ExpNonPositive(_mm512_sub_ps(_mm512_maskz_loadu_ps(live, at), mx));
      sum = _mm512_add_ps(sum, _mm512_maskz_mov_ps(live, e));
      _mm512_mask_storeu_ps(at, live, e);
    }
  }
  const float total = avx512::HSum(sum);
  const bool ok = total > 0.0f;  // false for NaN: the reference's weights are then 0
  const __m512 inv = _mm512_set1_ps(1.0f / total);  // w * (1/total): within 1 ulp of w / total
  for (int64_t pg = 0; pg < pages; ++pg) {  // normalized weights, rounded to bf16 (RNE)
    for (int64_t i = 0; i < ntok[pg]; i += 32) {
      const float* at = w + pg * kPageTokens + i;
      const __mmask16 live_lo = ok ? Live(ntok[pg] - i) : 0;
      const __mmask16 live_hi = ok ? Live(ntok[pg] - i - 16) : 0;
      const __m512 lo = _mm512_maskz_mul_ps(live_lo, _mm512_maskz_loadu_ps(live_lo, at), inv);
      const __m512 hi = _mm512_maskz_mul_ps(live_hi, _mm512_maskz_loadu_ps(live_hi, at + 16), inv);
      _mm512_storeu_si512(wb + (pg * kPageTokens + i) / 2, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
    }
  }
  return poisoned != 0;
}

// Pass 2 (AVX-512): as PageValuesGeneric with bf16 weights and values, slots in the decoder's
// order.
JAX_MXFP4_AVX512 void PageValuesAvx512(const Problem& p, const uint8_t* page, int64_t ntok,
                                       int64_t col, RowBuffers& rb, Workspace& ws) {
  avx512::DecodeValuePairs(page, ntok, ws.vp);
  const int64_t ld = p.slots * kPageTokens / 2, pairs = (ntok + 1) / 2;
  for (int64_t g0 = 0; g0 < p.group; g0 += 4) {
    const uint32_t* w = rb.wb + g0 * ld + col / 2;
    float* out = rb.out + g0 * kHeadDim;
    for (int64_t d0 = 0; d0 < kHeadDim; d0 += 64) {
      switch (std::min<int64_t>(4, p.group - g0)) {
        case 1: avx512::PvTileBf16<1>(w, ld, ws.vp, pairs, out, d0); break;
        case 2: avx512::PvTileBf16<2>(w, ld, ws.vp, pairs, out, d0); break;
        case 3: avx512::PvTileBf16<3>(w, ld, ws.vp, pairs, out, d0); break;
        default: avx512::PvTileBf16<4>(w, ld, ws.vp, pairs, out, d0); break;
      }
    }
  }
}
#endif

// Element d of an output row as accumulated (the AVX-512 value decoder permutes each group).
float OutputElement(const float* out, int64_t d, bool permuted) {
  if (!permuted) return out[d];
  const int64_t g = d / 32, j = (d % 32) / 2, half = d % 2;
  return out[g * 32 + half * 16 + j];
}

// The bf16 (and optionally MXFP8) output of one q head (SPEC §1.6, formats.quantize_mxfp8).
void StoreHead(const Problem& p, const float* out, int64_t t, int64_t qh, const Outputs& o) {
  uint16_t bf[kHeadDim];
  for (int64_t d = 0; d < kHeadDim; ++d) bf[d] = F32ToBf16(OutputElement(out, d, p.avx));
  if (o.bf16 != nullptr) {
    std::memcpy(o.bf16 + (t * p.q_heads + qh) * kHeadDim, bf, sizeof bf);
    return;
  }
  for (int64_t blk = 0; blk < kGroups; ++blk) {
    uint32_t amax_bits = 0;
    for (int64_t i = 0; i < kMxBlock; ++i) {
      amax_bits = std::max(amax_bits, (uint32_t{bf[blk * kMxBlock + i]} << 16) & 0x7FFFFFFFu);
    }
    const int e = static_cast<int>((amax_bits >> 23) & 0xFFu);
    const int m7 = static_cast<int>((amax_bits >> 16) & 0x7Fu);
    // An Inf or NaN in the block: scale byte 255 and every value NaN (SPEC §1.9).
    const bool non_finite = e == 0xFF;
    const int sb = non_finite ? static_cast<int>(kE8m0Nan)
                              : std::clamp(e - 8 + (m7 > 96 ? 1 : 0), 0, 254);
    o.scales[(t * p.q_heads + qh) * kGroups + blk] = static_cast<uint8_t>(sb);
    for (int64_t i = 0; i < kMxBlock; ++i) {
      const int64_t d = blk * kMxBlock + i;
      const float scaled = ExactScaledF32(uint32_t{bf[d]} << 16, 127 - sb);
      o.values[(t * p.q_heads + qh) * kHeadDim + d] = non_finite ? kE4m3Nan : F32ToE4m3(scaled);
    }
  }
}

// Prefetches page `pg` of a row (of `pool`) when it exists and is in range.
void Prefetch(const Problem& p, const uint8_t* pool, int64_t h, int64_t ctx, const int32_t* ids,
              int64_t pg) {
  if (pg * kPageTokens >= ctx) return;
  const int64_t id = ids[pg];
  if (id >= 0 && id < p.num_pages) PrefetchPage(pool + (id * p.kv_heads + h) * kPageBytes);
}

// Pass 1 over the row's pages: logits of every live token; returns whether any token is live.
bool LogitsPass(const Problem& p, int64_t h, int64_t ctx, const int32_t* ids, RowBuffers& rb,
                Workspace& ws) {
  bool any = false;
  Prefetch(p, p.k_pool, h, ctx, ids, 0);
  for (int64_t pg = 0; pg * kPageTokens < ctx; ++pg) {
    const int64_t id = ids[pg];
    const bool masked = id < 0 || id >= p.num_pages;
    Prefetch(p, p.k_pool, h, ctx, ids, pg + 1);
    rb.ntok[pg] = masked ? 0 : std::min(kPageTokens, ctx - pg * kPageTokens);
    if (masked) continue;
    any = true;
    const uint8_t* page = p.k_pool + (id * p.kv_heads + h) * kPageBytes;
#if JAX_MXFP4_HAVE_AVX512
    if (p.avx) {
      PageLogitsAvx512(p, page, rb.ntok[pg], pg * kPageTokens, rb, ws);
      continue;
    }
#endif
    PageLogitsGeneric(p, page, rb.ntok[pg], pg * kPageTokens, rb, ws);
  }
  return any;
}

// Softmax per head, then pass 2 over the live pages.
void WeightsAndValues(const Problem& p, int64_t h, int64_t pages, const int32_t* ids,
                      RowBuffers& rb, Workspace& ws) {
  const int64_t ld = p.slots * kPageTokens;
  for (int64_t g = 0; g < p.group; ++g) {
#if JAX_MXFP4_HAVE_AVX512
    if (p.avx) {
      rb.poisoned[g] = SoftmaxAvx512(rb.logits + g * ld, rb.ntok, pages, rb.wb + g * ld / 2);
      continue;
    }
#endif
    rb.poisoned[g] = SoftmaxGeneric(rb.logits + g * ld, rb.ntok, pages);
  }
  Prefetch(p, p.v_pool, h, pages * kPageTokens, ids, 0);
  for (int64_t pg = 0; pg < pages; ++pg) {
    Prefetch(p, p.v_pool, h, pages * kPageTokens, ids, pg + 1);
    if (rb.ntok[pg] == 0) continue;
    const uint8_t* page = p.v_pool + (int64_t{ids[pg]} * p.kv_heads + h) * kPageBytes;
#if JAX_MXFP4_HAVE_AVX512
    if (p.avx) {
      PageValuesAvx512(p, page, rb.ntok[pg], pg * kPageTokens, rb, ws);
      continue;
    }
#endif
    PageValuesGeneric(p, page, rb.ntok[pg], pg * kPageTokens, rb, ws);
  }
}

// One attention row (token t, kv head h): its G output heads.
void AttendRow(const Problem& p, int64_t t, int64_t h, RowBuffers& rb, Workspace& ws,
               const Outputs& o) {
  const int64_t ctx =
      std::clamp<int64_t>(p.context[t * p.kv_heads + h], 0, p.width * kPageTokens);
  const int32_t* ids = p.page_table + (t * p.kv_heads + h) * p.width;
  std::fill(rb.out, rb.out + p.group * kHeadDim, 0.0f);
  std::fill(rb.poisoned, rb.poisoned + p.group, 0);
  for (int64_t g = 0; g < p.group; ++g) PrepareQuery(p, t, h * p.group + g, g, rb);
  if (LogitsPass(p, h, ctx, ids, rb, ws)) {
    WeightsAndValues(p, h, (ctx + kPageTokens - 1) / kPageTokens, ids, rb, ws);
  }
  for (int64_t g = 0; g < p.group; ++g) {
    float* out = rb.out + g * kHeadDim;
    if (rb.poisoned[g]) std::fill(out, out + kHeadDim, std::numeric_limits<float>::quiet_NaN());
    StoreHead(p, out, t, h * p.group + g, o);
  }
}

ffi::Error CheckArgs(const ffi::AnyBuffer& q, ffi::Buffer<ffi::U8>& k_pool,
                     ffi::Buffer<ffi::U8>& v_pool, ffi::Buffer<ffi::S32>& page_table,
                     ffi::Buffer<ffi::S32>& context) {
  const auto qd = q.dimensions(), kd = k_pool.dimensions(), vd = v_pool.dimensions();
  if (q.element_type() != ffi::DataType::BF16 && q.element_type() != ffi::DataType::F8E4M3FN) {
    return BadArg(kTarget, "q must be bfloat16 or float8_e4m3fn");
  }
  if (qd.size() != 3 || qd[2] != kHeadDim) {
    return BadArg(kTarget, "q must be [T, Hq, 128], got " + DimsString(qd));
  }
  if (kd.size() != 3 || kd[2] != kPageBytes || kd[1] < 1 || qd[1] % kd[1] != 0) {
    return BadArg(kTarget, "k_pool must be u8[P, Hkv, 8704] with Hkv dividing Hq = " +
                               std::to_string(qd[1]) + ", got " + DimsString(kd));
  }
  if (vd.size() != 3 || vd[0] != kd[0] || vd[1] != kd[1] || vd[2] != kd[2]) {
    return BadArg(kTarget, "v_pool must have k_pool's shape " + DimsString(kd) + ", got " +
                               DimsString(vd));
  }
  const auto pd = page_table.dimensions(), cd = context.dimensions();
  if (pd.size() != 3 || pd[0] != qd[0] || pd[1] != kd[1]) {
    return BadArg(kTarget, "page_table must be s32[T, Hkv, n], got " + DimsString(pd));
  }
  if (cd.size() != 2 || cd[0] != qd[0] || cd[1] != kd[1]) {
    return BadArg(kTarget, "context_lens must be s32[T, Hkv], got " + DimsString(cd));
  }
  return ffi::Error::Success();
}

// Page slots of the longest row: max over rows (t, h) of ceil(clamp(ctx, 0, n*128) / 128).
int64_t LongestRowSlots(const Problem& p) {
  int64_t longest = 0;
  for (int64_t r = 0; r < p.rows * p.kv_heads; ++r) {
    const int64_t ctx = std::clamp<int64_t>(p.context[r], 0, p.width * kPageTokens);
    longest = std::max(longest, ctx);
  }
  return (longest + kPageTokens - 1) / kPageTokens;
}

// Both targets: checks, scratch, and the parallel loop over rows (t, h).
ffi::Error Attend(ffi::ThreadPool& threads, const ffi::AnyBuffer& q, ffi::Buffer<ffi::U8>& k_pool,
                  ffi::Buffer<ffi::U8>& v_pool, ffi::Buffer<ffi::S32>& page_table,
                  ffi::Buffer<ffi::S32>& context, float sm_scale, const Outputs& o) {
  if (ffi::Error e = CheckArgs(q, k_pool, v_pool, page_table, context); e.failure()) return e;
  Problem p;
  p.rows = q.dimensions()[0];
  p.q_heads = q.dimensions()[1];
  p.kv_heads = k_pool.dimensions()[1];
  p.group = p.q_heads / p.kv_heads;
  p.num_pages = k_pool.dimensions()[0];
  p.width = page_table.dimensions()[2];
  p.q_bf16 = q.element_type() == ffi::DataType::BF16;
  p.avx = JAX_MXFP4_HAVE_AVX512 && UseAvx512();
  p.q = static_cast<const uint8_t*>(q.untyped_data());
  p.k_pool = k_pool.typed_data();
  p.v_pool = v_pool.typed_data();
  p.page_table = page_table.typed_data();
  p.context = context.typed_data();
  p.sm_scale = sm_scale;
  p.slots = LongestRowSlots(p);
  const int workers = NumWorkers(threads);
  const int64_t floats = RowBuffers::Floats(p);
  Scratch<Workspace> ws;
  UninitializedScratch<float> buffers;
  if (!ws.Allocate(workers) || !buffers.Allocate(floats * workers)) return OutOfMemory(kTarget);
  ParallelFor(threads, p.rows * p.kv_heads, 1, [&](int worker, int64_t begin, int64_t end) {
    RowBuffers rb = RowBuffers::At(p, buffers.get() + worker * floats);
    for (int64_t r = begin; r < end; ++r) {
      AttendRow(p, r / p.kv_heads, r % p.kv_heads, rb, ws.get()[worker], o);
    }
  }, 16);
  return ffi::Error::Success();
}

ffi::Error SparseAttentionImpl(ffi::ThreadPool threads, ffi::AnyBuffer q,
                               ffi::Buffer<ffi::U8> k_pool, ffi::Buffer<ffi::U8> v_pool,
                               ffi::Buffer<ffi::S32> page_table, ffi::Buffer<ffi::S32> context,
                               float sm_scale, ffi::ResultBuffer<ffi::BF16> out) {
  const auto qd = q.dimensions(), od = out->dimensions();
  if (od.size() != 3 || qd.size() != 3 || od[0] != qd[0] || od[1] != qd[1] || od[2] != qd[2]) {
    return BadArg(kTarget, "result must be bf16[T, Hq, 128] like q " + DimsString(qd) +
                               ", got " + DimsString(od));
  }
  Outputs o;
  o.bf16 = out->typed_data();
  return Attend(threads, q, k_pool, v_pool, page_table, context, sm_scale, o);
}

ffi::Error SparseAttentionMxfp8Impl(ffi::ThreadPool threads, ffi::AnyBuffer q,
                                    ffi::Buffer<ffi::U8> k_pool, ffi::Buffer<ffi::U8> v_pool,
                                    ffi::Buffer<ffi::S32> page_table,
                                    ffi::Buffer<ffi::S32> context, float sm_scale,
                                    ffi::Result<ffi::AnyBuffer> values,
                                    ffi::ResultBuffer<ffi::U8> scales) {
  const auto qd = q.dimensions(), vd = values->dimensions(), sd = scales->dimensions();
  if (qd.size() != 3 || values->element_type() != ffi::DataType::F8E4M3FN || vd.size() != 2 ||
      vd[0] != qd[0] || vd[1] != qd[1] * kHeadDim) {
    return BadArg(kTarget, "values must be float8_e4m3fn[T, Hq*128] for q " + DimsString(qd) +
                               ", got " + DimsString(vd));
  }
  if (sd.size() != 2 || sd[0] != qd[0] || sd[1] != qd[1] * kGroups) {
    return BadArg(kTarget, "scales must be u8[T, Hq*4] for q " + DimsString(qd) + ", got " +
                               DimsString(sd));
  }
  Outputs o;
  o.values = static_cast<uint8_t*>(values->untyped_data());
  o.scales = scales->typed_data();
  return Attend(threads, q, k_pool, v_pool, page_table, context, sm_scale, o);
}

}  // namespace
}  // namespace jax_mxfp4

#define JAX_MXFP4_ATTENTION_OPERANDS                         \
  xla::ffi::Ffi::Bind()                                      \
      .Ctx<xla::ffi::ThreadPool>()                           \
      .Arg<xla::ffi::AnyBuffer>()              /* q */       \
      .Arg<xla::ffi::Buffer<xla::ffi::U8>>()   /* k_pool */  \
      .Arg<xla::ffi::Buffer<xla::ffi::U8>>()   /* v_pool */  \
      .Arg<xla::ffi::Buffer<xla::ffi::S32>>()  /* page_table */ \
      .Arg<xla::ffi::Buffer<xla::ffi::S32>>()  /* context_lens */ \
      .Attr<float>("sm_scale")

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxMxfp4SparseAttention, jax_mxfp4::SparseAttentionImpl,
                              JAX_MXFP4_ATTENTION_OPERANDS
                                  .Ret<xla::ffi::Buffer<xla::ffi::BF16>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxMxfp4SparseAttentionMxfp8, jax_mxfp4::SparseAttentionMxfp8Impl,
                              JAX_MXFP4_ATTENTION_OPERANDS
                                  .Ret<xla::ffi::AnyBuffer>()               // values
                                  .Ret<xla::ffi::Buffer<xla::ffi::U8>>());  // scales

JAX_MXFP4_CPU_TARGET("jax_mxfp4_sparse_attention", JaxMxfp4SparseAttention);
JAX_MXFP4_CPU_TARGET("jax_mxfp4_sparse_attention_mxfp8", JaxMxfp4SparseAttentionMxfp8);
