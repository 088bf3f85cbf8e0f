// jax_mxfp4_index_scores: block scores of each query row over the MXFP4 index cache
// (SPEC §4, §4.1, §5, §5.1, §2.3; reference/index_scores.py).
//
//   operands: q bf16 | f8e4m3fn [T, H, 128], index_pool u8[P, 8704], block_table s32[B, W],
//             positions s32[T], requests s32[T]
//   attributes: score_scale f32 (= fp32(sm_scale * 1.4426950409)), round_q bool
//   result: f32[H, T, NB] (NB <= W)
//
//   out[h, t, j] = max over live tokens k of (Qe[t, h] . Knorm[k]) * 2**(maxbyte_k - 127),
//                  then * score_scale; -inf * score_scale where no token is live; NaN where a
//                  live token's logit is not finite (a NaN key or query, an fp32 overflow in
//                  whatever order the kernel summed: SPEC §9.2).
//
// Work is organised by (request, block): the rows of a request are sorted by position
// (descending), so the rows that reach block j are a prefix; each page is decoded once and
// scored against all of them (a small matrix product). Blocks past a request's furthest row
// are never read.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "cpu/handlers.h"
#include "cpu/kernels.h"

namespace jax_mxfp4 {
namespace {

constexpr const char* kTarget = "jax_mxfp4_index_scores";

struct Problem {
  int64_t rows, heads, num_pages, num_requests, width, num_blocks;
  const uint8_t* pool;
  const int32_t* table;
  float score_scale;
  float* out;  // [H, T, NB]
};

// Live rows grouped by request and sorted by position, descending ("sorted rows").
struct Plan {
  std::vector<int64_t> request_start;  // [B + 1] offsets into sorted
  std::vector<int32_t> sorted;         // row ids
  std::vector<int32_t> position;       // position of each sorted row
  std::vector<int64_t> unit_start;     // [B + 1] offsets of each request's (request, block) units
};

Plan MakePlan(const Problem& p, const int32_t* positions, const int32_t* requests) {
  Plan plan;
  plan.request_start.assign(p.num_requests + 1, 0);
  for (int64_t t = 0; t < p.rows; ++t) {
    if (positions[t] >= 0 && requests[t] >= 0 && requests[t] < p.num_requests) {
      ++plan.request_start[requests[t] + 1];
    }
  }
  for (int64_t b = 0; b < p.num_requests; ++b) plan.request_start[b + 1] += plan.request_start[b];
  plan.sorted.resize(plan.request_start[p.num_requests]);
  std::vector<int64_t> fill(plan.request_start.begin(), plan.request_start.end() - 1);
  for (int64_t t = 0; t < p.rows; ++t) {
    if (positions[t] >= 0 && requests[t] >= 0 && requests[t] < p.num_requests) {
      plan.sorted[fill[requests[t]]++] = static_cast<int32_t>(t);
    }
  }
  plan.unit_start.assign(p.num_requests + 1, 0);
  for (int64_t b = 0; b < p.num_requests; ++b) {
    auto first = plan.sorted.begin() + plan.request_start[b];
    auto last = plan.sorted.begin() + plan.request_start[b + 1];
    std::stable_sort(first, last,
                     [&](int32_t x, int32_t y) { return positions[x] > positions[y]; });
    int64_t blocks = 0;
    if (first != last) {
      blocks = std::min<int64_t>(positions[*first] / kPageTokens + 1, p.num_blocks);
    }
    plan.unit_start[b + 1] = plan.unit_start[b] + blocks;
  }
  plan.position.resize(plan.sorted.size());
  for (size_t s = 0; s < plan.sorted.size(); ++s) plan.position[s] = positions[plan.sorted[s]];
  return plan;
}

// The query values a scorer multiplies (reference scoring_query), as fp32.
float QueryValue(const uint8_t* q, bool is_bf16, bool round_q, int64_t i) {
  if (!is_bf16) return E4m3ToF32(q[i]);
  uint16_t h;
  std::memcpy(&h, q + 2 * i, 2);
  const uint32_t bits = uint32_t{h} << 16;
  return round_q ? E4m3ToF32(F32BitsToE4m3(bits)) : F32FromBits(bits);
}

// One worker's scratch: decoded keys, page facts, dot products.
struct Workspace {
  KeyMeta meta;
  alignas(64) uint32_t kt[kTokenBytes * kPageTokens];  // AVX-512: bf16 pairs [64][128]
  alignas(64) float kf[kHeadDim * kPageTokens];        // generic: fp32 [128][128]
  alignas(64) float dots[12 * 32 + kPageTokens];  // a tile of dots, or one row's
};

// The rows of request b (sorted) that reach block j: a prefix of its sorted rows.
int64_t RowsReaching(const Plan& plan, int64_t b, int64_t j) {
  const auto first = plan.position.begin() + plan.request_start[b];
  const auto last = plan.position.begin() + plan.request_start[b + 1];
  const int64_t start = j * kPageTokens;
  return std::partition_point(first, last, [&](int32_t pos) { return pos >= start; }) - first;
}

float Finish(float best, bool nan, float score_scale) {
  return (nan ? std::numeric_limits<float>::quiet_NaN() : best) * score_scale;
}

// Generic kernel: scores of `items` (row, head) queries of one request against one page.
void ScoreUnitGeneric(const Problem& p, const Plan& plan, const float* qf, int64_t b, int64_t j,
                      const uint8_t* page, int64_t ntok, int64_t items, Workspace& ws) {
  ComputeKeyMeta(page, ntok, &ws.meta);
  generic::DecodeKeysF32(page, ws.meta, ntok, ws.kf);
  const int64_t s0 = plan.request_start[b];
  for (int64_t m = 0; m < items; ++m) {
    const int64_t s = s0 + m / p.heads, h = m % p.heads;
    const int64_t lim = std::min<int64_t>(plan.position[s] - j * kPageTokens + 1, ntok);
    generic::DotRow(qf + (s * p.heads + h) * kHeadDim, ws.kf, lim, ws.dots);
    float best = -std::numeric_limits<float>::infinity();
    bool nan = false;
    for (int64_t tok = 0; tok < lim; ++tok) {
      const float logit = ws.dots[tok] * ws.meta.pow_a[tok] * ws.meta.pow_b[tok];
      nan |= !std::isfinite(logit) || ((ws.meta.nan_mask[tok / 16] >> (tok % 16)) & 1u);
      best = std::max(best, logit);
    }
    p.out[(h * p.rows + plan.sorted[s]) * p.num_blocks + j] = Finish(best, nan, p.score_scale);
  }
}

#if JAX_MXFP4_HAVE_AVX512
// Running max of one query's logits over 16 tokens from tok0 (live below lim).
JAX_MXFP4_AVX512 inline void MaxStep(const float* dots, const KeyMeta& meta, int64_t tok0,
                                     int64_t lim, __m512& best, __mmask16& nan) {
  const __m512i lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __mmask16 live = _mm512_cmplt_epi32_mask(
      lanes, _mm512_set1_epi32(static_cast<int>(std::clamp<int64_t>(lim - tok0, 0, 16))));
  const __m512 v = _mm512_mul_ps(
      _mm512_mul_ps(_mm512_loadu_ps(dots), _mm512_loadu_ps(meta.pow_a + tok0)),
      _mm512_loadu_ps(meta.pow_b + tok0));
  // Not finite (|v| not below inf, or unordered: NaN), or a NaN key.
  const __m512 inf = _mm512_set1_ps(std::numeric_limits<float>::infinity());
  const __mmask16 bad = _mm512_cmp_ps_mask(_mm512_abs_ps(v), inf, _CMP_NLT_UQ);
  nan |= live & (meta.nan_mask[tok0 / 16] | bad);
  best = _mm512_mask_max_ps(best, live, best, v);
}

// AVX-512 kernel: same as ScoreUnitGeneric, tiles of up to 12 queries x 32 tokens.
JAX_MXFP4_AVX512 void ScoreUnitAvx512(const Problem& p, const Plan& plan, const uint32_t* qa,
                                      int64_t b, int64_t j, const uint8_t* page, int64_t ntok,
                                      int64_t items, Workspace& ws) {
  const int64_t ntok32 = (ntok + 31) / 32 * 32;
  avx512::DecodeKeysBf16(page, ntok32, &ws.meta, ws.kt);
  const int64_t s0 = plan.request_start[b];
  for (int64_t m0 = 0; m0 < items; m0 += avx512::kMaxTileRows) {
    const int mr = static_cast<int>(std::min<int64_t>(avx512::kMaxTileRows, items - m0));
    __m512 best[avx512::kMaxTileRows];
    __mmask16 nan[avx512::kMaxTileRows];
    int64_t lim[avx512::kMaxTileRows];
    for (int r = 0; r < mr; ++r) {
      best[r] = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
      nan[r] = 0;
      lim[r] = plan.position[s0 + (m0 + r) / p.heads] - j * kPageTokens + 1;
    }
    for (int64_t tok0 = 0; tok0 < ntok32; tok0 += 32) {
      avx512::DotTiles(mr, qa + (s0 * p.heads + m0) * kTokenBytes, kTokenBytes, ws.kt + tok0,
                       ws.dots);
      for (int r = 0; r < mr; ++r) {
        MaxStep(ws.dots + r * 32, ws.meta, tok0, lim[r], best[r], nan[r]);
        MaxStep(ws.dots + r * 32 + 16, ws.meta, tok0 + 16, lim[r], best[r], nan[r]);
      }
    }
    for (int r = 0; r < mr; ++r) {
      const int64_t s = s0 + (m0 + r) / p.heads, h = (m0 + r) % p.heads;
      p.out[(h * p.rows + plan.sorted[s]) * p.num_blocks + j] =
          Finish(avx512::HMax(best[r]), nan[r] != 0, p.score_scale);
    }
  }
}
#endif

// Query values per sorted row: fp32 [S, H, 128] (generic) or bf16 pairs [S, H, 64] (AVX-512).
void PrepareQueries(ffi::ThreadPool& threads, const Problem& p, const Plan& plan,
                    const ffi::AnyBuffer& q, bool round_q, bool avx, float* qf, uint32_t* qa) {
  const bool is_bf16 = q.element_type() == ffi::DataType::BF16;
  const int64_t elem = is_bf16 ? 2 : 1;
  const uint8_t* base = static_cast<const uint8_t*>(q.untyped_data());
  const int64_t n = static_cast<int64_t>(plan.sorted.size()) * p.heads;
  ParallelFor(threads, n, 256, [&](int, int64_t begin, int64_t end) {
    for (int64_t m = begin; m < end; ++m) {
      const int64_t t = plan.sorted[m / p.heads], h = m % p.heads;
      const uint8_t* src = base + (t * p.heads + h) * kHeadDim * elem;
#if JAX_MXFP4_HAVE_AVX512
      if (avx && is_bf16) {
        avx512::QueryPairsBf16(reinterpret_cast<const uint16_t*>(src), round_q,
                               qa + m * kTokenBytes);
        continue;
      }
#endif
      for (int64_t i = 0; i < kTokenBytes; ++i) {
        const float lo = QueryValue(src, is_bf16, round_q, 2 * i);
        const float hi = QueryValue(src, is_bf16, round_q, 2 * i + 1);
        if (avx) {
          qa[m * kTokenBytes + i] = (F32Bits(lo) >> 16) | (F32Bits(hi) & 0xFFFF0000u);
        } else {
          qf[m * kHeadDim + 2 * i] = lo;
          qf[m * kHeadDim + 2 * i + 1] = hi;
        }
      }
    }
  });
}

// The page of unit u = (request b, block j), from the request's block-table row.
int64_t UnitPage(const Problem& p, const Plan& plan, int64_t u) {
  const int64_t b = std::upper_bound(plan.unit_start.begin(), plan.unit_start.end(), u) -
                    plan.unit_start.begin() - 1;
  return p.table[b * p.width + (u - plan.unit_start[b])];
}

void PrefetchUnit(const Problem& p, const Plan& plan, int64_t u) {
  const int64_t page = UnitPage(p, plan, u);
  if (page >= 0 && page < p.num_pages) PrefetchPage(p.pool + page * kPageBytes);
}

ffi::Error CheckArgs(const ffi::AnyBuffer& q, ffi::Buffer<ffi::U8>& pool,
                     ffi::Buffer<ffi::S32>& table, ffi::Buffer<ffi::S32>& positions,
                     ffi::Buffer<ffi::S32>& requests, ffi::ResultBuffer<ffi::F32>& out) {
  const auto qd = q.dimensions(), pd = pool.dimensions(), bd = table.dimensions();
  if (q.element_type() != ffi::DataType::BF16 && q.element_type() != ffi::DataType::F8E4M3FN) {
    return BadArg(kTarget, "q must be bfloat16 or float8_e4m3fn");
  }
  if (qd.size() != 3 || qd[2] != kHeadDim) {
    return BadArg(kTarget, "q must be [T, H, 128], got " + DimsString(qd));
  }
  if (pd.size() != 2 || pd[1] != kPageBytes) {
    return BadArg(kTarget, "index_pool must be u8[P, 8704], got " + DimsString(pd));
  }
  if (bd.size() != 2) {
    return BadArg(kTarget, "block_table must be s32[B, W], got " + DimsString(bd));
  }
  if (positions.dimensions().size() != 1 || positions.dimensions()[0] != qd[0] ||
      requests.dimensions().size() != 1 || requests.dimensions()[0] != qd[0]) {
    return BadArg(kTarget, "positions and requests must be s32[T] with T = " +
                               std::to_string(qd[0]));
  }
  const auto od = out->dimensions();
  if (od.size() != 3 || od[0] != qd[1] || od[1] != qd[0] || od[2] > bd[1]) {
    return BadArg(kTarget, "result must be f32[H, T, NB] with H = " + std::to_string(qd[1]) +
                               ", T = " + std::to_string(qd[0]) + ", NB <= W = " +
                               std::to_string(bd[1]) + ", got " + DimsString(od));
  }
  return ffi::Error::Success();
}

ffi::Error IndexScoresImpl(ffi::ThreadPool threads, ffi::AnyBuffer q, ffi::Buffer<ffi::U8> pool,
                           ffi::Buffer<ffi::S32> table, ffi::Buffer<ffi::S32> positions,
                           ffi::Buffer<ffi::S32> requests, float score_scale, bool round_q,
                           ffi::ResultBuffer<ffi::F32> out) {
  if (ffi::Error e = CheckArgs(q, pool, table, positions, requests, out); e.failure()) return e;
  const Problem p{q.dimensions()[0], q.dimensions()[1], pool.dimensions()[0],
                  table.dimensions()[0], table.dimensions()[1], out->dimensions()[2],
                  pool.typed_data(), table.typed_data(), score_scale, out->typed_data()};
  const int64_t total = p.heads * p.rows * p.num_blocks;
  const float fill = -std::numeric_limits<float>::infinity() * score_scale;
  ParallelFor(threads, total, int64_t{1} << 16, [&](int, int64_t begin, int64_t end) {
    std::fill(p.out + begin, p.out + end, fill);
  });
  if (total == 0) return ffi::Error::Success();
  const Plan plan = MakePlan(p, positions.typed_data(), requests.typed_data());
  const int64_t units = plan.unit_start[p.num_requests];
  const bool avx = JAX_MXFP4_HAVE_AVX512 && UseAvx512();
  const int64_t queries = static_cast<int64_t>(plan.sorted.size()) * p.heads;
  Scratch<float> qf;
  Scratch<uint32_t> qa;
  Scratch<Workspace> ws;
  if (!(avx ? qa.Allocate(queries * kTokenBytes) : qf.Allocate(queries * kHeadDim)) ||
      !ws.Allocate(NumWorkers(threads))) {
    return OutOfMemory(kTarget);
  }
  PrepareQueries(threads, p, plan, q, round_q, avx, qf.get(), qa.get());
  ParallelFor(
      threads, units, 1,
      [&](int worker, int64_t begin, int64_t end) {
        for (int64_t u = begin; u < end; ++u) {
          if (u + 1 < end) PrefetchUnit(p, plan, u + 1);
          const int64_t page = UnitPage(p, plan, u);
          const int64_t b = std::upper_bound(plan.unit_start.begin(), plan.unit_start.end(), u) -
                            plan.unit_start.begin() - 1;
          const int64_t j = u - plan.unit_start[b];
          if (page < 0 || page >= p.num_pages) continue;  // no live token: stays -inf
          const uint8_t* page_data = p.pool + page * kPageBytes;
          const int64_t s0 = plan.request_start[b];
          const int64_t ntok = std::min<int64_t>(plan.position[s0] - j * kPageTokens + 1, 128);
          const int64_t items = RowsReaching(plan, b, j) * p.heads;
          Workspace& w = ws.get()[worker];
#if JAX_MXFP4_HAVE_AVX512
          if (avx) {
            ScoreUnitAvx512(p, plan, qa.get(), b, j, page_data, ntok, items, w);
            continue;
          }
#endif
          ScoreUnitGeneric(p, plan, qf.get(), b, j, page_data, ntok, items, w);
        }
      },
      16);
  return ffi::Error::Success();
}

}  // namespace
}  // namespace jax_mxfp4

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxMxfp4IndexScores, jax_mxfp4::IndexScoresImpl,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::ThreadPool>()
                                  .Arg<xla::ffi::AnyBuffer>()              // q
                                  .Arg<xla::ffi::Buffer<xla::ffi::U8>>()   // index_pool
                                  .Arg<xla::ffi::Buffer<xla::ffi::S32>>()  // block_table
                                  .Arg<xla::ffi::Buffer<xla::ffi::S32>>()  // positions
                                  .Arg<xla::ffi::Buffer<xla::ffi::S32>>()  // requests
                                  .Attr<float>("score_scale")
                                  .Attr<bool>("round_q")
                                  .Ret<xla::ffi::Buffer<xla::ffi::F32>>());

JAX_MXFP4_CPU_TARGET("jax_mxfp4_index_scores", JaxMxfp4IndexScores);
