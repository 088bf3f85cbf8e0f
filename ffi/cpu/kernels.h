// Inner kernels shared by index_scores.cc and sparse_attention.cc: decoding MXFP4 key/value
// pages and the small matrix products over them, in two flavours:
//
// * AVX-512 with BF16 dot products: keys are decoded to bf16 pairs in "VNNI" layout
//   kt[i][token] = (k[token][2i], k[token][2i+1]), so one vdpbf16ps adds
//   q[2i]k[2i] + q[2i+1]k[2i+1] for 16 tokens at once. Every MXFP4 key (normalized per token)
//   and every e4m3 query is exact in bf16, and bf16 products are exact in fp32, so only the
//   fp32 accumulation rounds (as in the generic kernels). The attention's PV product uses
//   bf16 weights (aiter's P, SPEC §7) against exact bf16 values.
// * generic: fp32 loops (any CPU; JAX_MXFP4_CPU_ISA=generic selects them for testing).
#ifndef JAX_MXFP4_FFI_CPU_KERNELS_H_
#define JAX_MXFP4_FFI_CPU_KERNELS_H_

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
// GCC 12's AVX-512 intrinsics trip -Wmaybe-uninitialized on their own _mm512_undefined_*
// (GCC bug 105593, fixed in GCC 13): silence it for the header's lines only.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#define JAX_MXFP4_HAVE_AVX512 1
#define JAX_MXFP4_AVX512 \
  __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16")))
#else
#define JAX_MXFP4_HAVE_AVX512 0
#endif

#include "cpu/mxfp4.h"

namespace jax_mxfp4 {

// Per-token facts of one key page (SPEC §1.3, reference _common.token_keys): keys are normalized
// by the token's largest scale byte mb, so a key element is e2m1 * group_scale and the logit
// is dot * 2**(mb - 127).
struct KeyMeta {
  alignas(64) float group_scale[kGroups][kPageTokens];  // 2**(byte_g - mb); 0 for NaN tokens
  alignas(64) int32_t exponent[kPageTokens];            // mb - 127
  alignas(64) float pow_a[kPageTokens];                 // 2**exponent in two normal factors
  alignas(64) float pow_b[kPageTokens];
  uint16_t nan_mask[kPageTokens / 16];                  // bit set: a scale byte 255 (NaN key)
};

// Fills `meta` for tokens [0, ntok) of a page.
inline void ComputeKeyMeta(const uint8_t* page, int64_t ntok, KeyMeta* meta) {
  const uint8_t* scales = page + kScaleOffset;
  for (int64_t c = 0; c < kPageTokens / 16; ++c) meta->nan_mask[c] = 0;
  for (int64_t tok = 0; tok < ntok; ++tok) {
    const uint8_t* s = scales + tok * kGroups;
    const int mb = std::max(std::max(s[0], s[1]), std::max(s[2], s[3]));
    const bool nan = mb == static_cast<int>(kE8m0Nan);
    const int e = mb - 127;
    const int k1 = std::clamp(e, -126, 127);
    meta->exponent[tok] = e;
    meta->pow_a[tok] = Pow2(k1);
    meta->pow_b[tok] = Pow2(std::clamp(e - k1, -126, 127));
    if (nan) meta->nan_mask[tok / 16] |= static_cast<uint16_t>(1u << (tok % 16));
    for (int64_t g = 0; g < kGroups; ++g) {
      // 1.0 (e2m1 code 2) * 2**(byte_g - mb), exact down to the fp32 subnormals.
      meta->group_scale[g][tok] = nan ? 0.0f : F32FromBits(Mxfp4F32Bits(2, s[g] - mb + 127));
    }
  }
}

namespace generic {

// kf[d][token] = normalized key element, fp32, for tokens [0, ntok).
inline void DecodeKeysF32(const uint8_t* page, const KeyMeta& meta, int64_t ntok, float* kf) {
  for (int64_t tok = 0; tok < ntok; ++tok) {
    const uint8_t* data = page + tok * kTokenBytes;
    for (int64_t i = 0; i < kTokenBytes; ++i) {
      const float s = meta.group_scale[i / 16][tok];
      kf[(2 * i) * kPageTokens + tok] = kE2m1Values[data[i] & 15] * s;
      kf[(2 * i + 1) * kPageTokens + tok] = kE2m1Values[data[i] >> 4] * s;
    }
  }
}

// dots[token] = sum_d q[d] * kf[d][token] for tokens [0, ntok), accumulated in d order.
inline void DotRow(const float* q, const float* kf, int64_t ntok, float* dots) {
  for (int64_t tok = 0; tok < ntok; ++tok) dots[tok] = 0.0f;
  for (int64_t d = 0; d < kHeadDim; ++d) {
    const float qd = q[d];
    const float* row = kf + d * kPageTokens;
    for (int64_t tok = 0; tok < ntok; ++tok) dots[tok] += qd * row[tok];
  }
}

// vf[token][d] = exactly dequantized value element (SPEC §1.3), for tokens [0, ntok).
inline void DecodeValuesF32(const uint8_t* page, int64_t ntok, float* vf) {
  for (int64_t tok = 0; tok < ntok; ++tok) {
    const uint8_t* data = page + tok * kTokenBytes;
    const uint8_t* scales = page + kScaleOffset + tok * kGroups;
    for (int64_t i = 0; i < kTokenBytes; ++i) {
      const int byte = scales[i / 16];
      vf[tok * kHeadDim + 2 * i] = F32FromBits(Mxfp4F32Bits(data[i] & 15u, byte));
      vf[tok * kHeadDim + 2 * i + 1] = F32FromBits(Mxfp4F32Bits(data[i] >> 4, byte));
    }
  }
}

}  // namespace generic

#if JAX_MXFP4_HAVE_AVX512
namespace avx512 {

// In place: r[j] holds dword j of the 16 input rows (a 16 x 16 dword transpose).
JAX_MXFP4_AVX512 inline void Transpose16x16(__m512i r[16]) {
  __m512i t[16];
  for (int k = 0; k < 8; ++k) {
    t[2 * k] = _mm512_unpacklo_epi32(r[2 * k], r[2 * k + 1]);
    t[2 * k + 1] = _mm512_unpackhi_epi32(r[2 * k], r[2 * k + 1]);
  }
  for (int k = 0; k < 4; ++k) {
    r[4 * k] = _mm512_unpacklo_epi64(t[4 * k], t[4 * k + 2]);
    r[4 * k + 1] = _mm512_unpackhi_epi64(t[4 * k], t[4 * k + 2]);
    r[4 * k + 2] = _mm512_unpacklo_epi64(t[4 * k + 1], t[4 * k + 3]);
    r[4 * k + 3] = _mm512_unpackhi_epi64(t[4 * k + 1], t[4 * k + 3]);
  }
  // r[4k + m], 128-bit lane L: rows 4k..4k+3 of column 4L + m.
  for (int m = 0; m < 4; ++m) {
    t[m] = _mm512_shuffle_i32x4(r[m], r[4 + m], 0x88);
    t[4 + m] = _mm512_shuffle_i32x4(r[m], r[4 + m], 0xDD);
    t[8 + m] = _mm512_shuffle_i32x4(r[8 + m], r[12 + m], 0x88);
    t[12 + m] = _mm512_shuffle_i32x4(r[8 + m], r[12 + m], 0xDD);
  }
  for (int m = 0; m < 4; ++m) {
    r[m] = _mm512_shuffle_i32x4(t[m], t[8 + m], 0x88);
    r[8 + m] = _mm512_shuffle_i32x4(t[m], t[8 + m], 0xDD);
    r[4 + m] = _mm512_shuffle_i32x4(t[4 + m], t[12 + m], 0x88);
    r[12 + m] = _mm512_shuffle_i32x4(t[4 + m], t[12 + m], 0xDD);
  }
}

// KeyMeta of 16 tokens from their scale bytes (one dword per token). Per group g and token
// lane it returns d = byte_g - mb <= 0 as a bf16 exponent adjustment (d << 7 in both 16-bit
// halves; 0 for NaN tokens) and the scale 2**d as fp32 (0 below the normal range or for NaN
// tokens). Returns whether every non-NaN token has d >= -125 in every group, i.e. whether
// adding the adjustment to bf16 e2m1 values (exponents 126..129) keeps them normal and exact.
JAX_MXFP4_AVX512 inline bool KeyMeta16(const uint8_t* scales, int64_t tok0, KeyMeta* meta,
                                       __m512i adjust[kGroups], __m512 group_scale[kGroups]) {
  const __m512i s = _mm512_loadu_si512(scales);
  const __m512i m1 = _mm512_max_epu8(s, _mm512_srli_epi32(s, 8));
  const __m512i mb =
      _mm512_and_si512(_mm512_max_epu8(m1, _mm512_srli_epi32(m1, 16)), _mm512_set1_epi32(255));
  const __mmask16 nan = _mm512_cmpeq_epi32_mask(mb, _mm512_set1_epi32(255));
  const __m512i e = _mm512_sub_epi32(mb, _mm512_set1_epi32(127));
  const __m512i lo = _mm512_set1_epi32(-126), hi = _mm512_set1_epi32(127);
  const __m512i k1 = _mm512_min_epi32(_mm512_max_epi32(e, lo), hi);
  const __m512i k2 = _mm512_min_epi32(_mm512_max_epi32(_mm512_sub_epi32(e, k1), lo), hi);
  _mm512_storeu_si512(meta->exponent + tok0, e);
  _mm512_storeu_si512(meta->pow_a + tok0, _mm512_slli_epi32(_mm512_add_epi32(k1, hi), 23));
  _mm512_storeu_si512(meta->pow_b + tok0, _mm512_slli_epi32(_mm512_add_epi32(k2, hi), 23));
  meta->nan_mask[tok0 / 16] = nan;
  __mmask16 exact = 0xFFFF;
  for (int g = 0; g < kGroups; ++g) {
    const __m512i byte =
        _mm512_and_si512(_mm512_srlv_epi32(s, _mm512_set1_epi32(8 * g)), _mm512_set1_epi32(255));
    const __m512i d = _mm512_maskz_sub_epi32(~nan, byte, mb);
    const __m512i rel = _mm512_add_epi32(d, hi);  // biased exponent of 2**d
    const __mmask16 normal = _mm512_cmpgt_epi32_mask(rel, _mm512_setzero_si512()) & ~nan;
    group_scale[g] = _mm512_castsi512_ps(_mm512_maskz_slli_epi32(normal, rel, 23));
    exact &= _mm512_cmpge_epi32_mask(d, _mm512_set1_epi32(-125));
    const __m512i a = _mm512_and_si512(_mm512_slli_epi32(d, 7), _mm512_set1_epi32(0xFFFF));
    adjust[g] = _mm512_or_si512(a, _mm512_slli_epi32(a, 16));
  }
  return exact == 0xFFFF;
}

// The 32-entry bf16 table of e2m1 codes (index & 15) for vpermw.
alignas(64) constexpr uint16_t kE2m1Bf16[32] = {
    0x0000, 0x3F00, 0x3F80, 0x3FC0, 0x4000, 0x4040, 0x4080, 0x40C0,
    0x8000, 0xBF00, 0xBF80, 0xBFC0, 0xC000, 0xC040, 0xC080, 0xC0C0,
    0x0000, 0x3F00, 0x3F80, 0x3FC0, 0x4000, 0x4040, 0x4080, 0x40C0,
    0x8000, 0xBF00, 0xBF80, 0xBFC0, 0xC000, 0xC040, 0xC080, 0xC0C0};

// Byte b of each dword of `word` (16 token lanes) as a bf16 pair scaled by 2**d: the low
// nibble goes to the low 16 bits, the high nibble to the high 16 bits (exact, see KeyMeta16).
JAX_MXFP4_AVX512 inline __m512i ScaledPairs(__m512i x, __m512i table, __m512i adjust) {
  const __m512i nibbles = _mm512_mask_blend_epi16(0xAAAAAAAAu, x, _mm512_slli_epi32(x, 12));
  const __m512i v = _mm512_permutexvar_epi16(nibbles, table);
  const __mmask32 nonzero = _mm512_test_epi16_mask(v, _mm512_set1_epi16(0x7FFF));
  return _mm512_mask_add_epi16(v, nonzero, v, adjust);
}

// The same through fp32 (any group scale; values below the normal range become 0).
JAX_MXFP4_AVX512 inline __m512i ScaledPairsF32(__m512i x, __m512 scale) {
  const __m512 table = _mm512_loadu_ps(kE2m1Values);
  const __m512 lo = _mm512_mul_ps(_mm512_permutexvar_ps(x, table), scale);
  const __m512 hi = _mm512_mul_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(x, 4), table), scale);
  return _mm512_or_si512(
      _mm512_srli_epi32(_mm512_castps_si512(lo), 16),
      _mm512_and_si512(_mm512_castps_si512(hi), _mm512_set1_epi32(static_cast<int>(0xFFFF0000u))));
}

// Keys of tokens [0, ntok) (ntok a multiple of 16) as bf16 pairs kt[i * 128 + token], and
// their KeyMeta.
JAX_MXFP4_AVX512 inline void DecodeKeysBf16(const uint8_t* page, int64_t ntok, KeyMeta* meta,
                                            uint32_t* kt) {
  const __m512i table = _mm512_load_si512(kE2m1Bf16);
  for (int64_t tok0 = 0; tok0 < ntok; tok0 += 16) {
    __m512i adjust[kGroups];
    __m512 scale[kGroups];
    const bool exact = KeyMeta16(page + kScaleOffset + tok0 * kGroups, tok0, meta, adjust, scale);
    __m512i r[16];
    for (int k = 0; k < 16; ++k) r[k] = _mm512_loadu_si512(page + (tok0 + k) * kTokenBytes);
    Transpose16x16(r);  // r[j]: bytes 4j..4j+3 of the 16 tokens
    for (int j = 0; j < 16; ++j) {
      for (int b = 0; b < 4; ++b) {
        const __m512i x = _mm512_srlv_epi32(r[j], _mm512_set1_epi32(8 * b));
        const __m512i pair = exact ? ScaledPairs(x, table, adjust[j / 4])
                                   : ScaledPairsF32(x, scale[j / 4]);
        _mm512_storeu_si512(kt + (4 * j + b) * kPageTokens + tok0, pair);
      }
    }
  }
}

// c[r][0..32) = dots of query rows a[r] (64 bf16 pairs, stride lda) with 32 tokens of kt.
template <int MR>
JAX_MXFP4_AVX512 inline void DotTile(const uint32_t* a, int64_t lda, const uint32_t* kt,
                                     float* c) {
  __m512 acc[MR][2];
#pragma GCC unroll 12
  for (int r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  for (int64_t i = 0; i < kTokenBytes; ++i) {
    const __m512bh b0 = (__m512bh)_mm512_loadu_si512(kt + i * kPageTokens);
    const __m512bh b1 = (__m512bh)_mm512_loadu_si512(kt + i * kPageTokens + 16);
#pragma GCC unroll 12
    for (int r = 0; r < MR; ++r) {
      const __m512bh q = (__m512bh)_mm512_set1_epi32(static_cast<int>(a[r * lda + i]));
      acc[r][0] = _mm512_dpbf16_ps(acc[r][0], q, b0);
      acc[r][1] = _mm512_dpbf16_ps(acc[r][1], q, b1);
    }
  }
#pragma GCC unroll 12
  for (int r = 0; r < MR; ++r) {
    _mm512_storeu_ps(c + r * 32, acc[r][0]);
    _mm512_storeu_ps(c + r * 32 + 16, acc[r][1]);
  }
}

// DotTile for a run-time number of rows, 1 <= mr <= 12.
JAX_MXFP4_AVX512 inline void DotTiles(int mr, const uint32_t* a, int64_t lda, const uint32_t* kt,
                                      float* c) {
  switch (mr) {
    case 1: return DotTile<1>(a, lda, kt, c);
    case 2: return DotTile<2>(a, lda, kt, c);
    case 3: return DotTile<3>(a, lda, kt, c);
    case 4: return DotTile<4>(a, lda, kt, c);
    case 5: return DotTile<5>(a, lda, kt, c);
    case 6: return DotTile<6>(a, lda, kt, c);
    case 7: return DotTile<7>(a, lda, kt, c);
    case 8: return DotTile<8>(a, lda, kt, c);
    case 9: return DotTile<9>(a, lda, kt, c);
    case 10: return DotTile<10>(a, lda, kt, c);
    case 11: return DotTile<11>(a, lda, kt, c);
    default: return DotTile<12>(a, lda, kt, c);
  }
}
constexpr int kMaxTileRows = 12;

// The fp32 table e2m1(code) * 2**(byte - 127) of one value group (exact: one multiplication when
// the scale is a normal number, two for byte 0; byte 255 gives NaN).
JAX_MXFP4_AVX512 inline __m512 ValueTable(__m512 table, uint8_t byte) {
  if (byte == 0) return _mm512_mul_ps(_mm512_mul_ps(table, _mm512_set1_ps(0x1p-126f)),
                                      _mm512_set1_ps(0.5f));
  if (byte == kE8m0Nan) return _mm512_set1_ps(F32FromBits(0x7FC00000u));
  return _mm512_mul_ps(table, _mm512_set1_ps(F32FromBits(uint32_t{byte} << 23)));
}

// Values of tokens [0, ntok) as bf16 pairs of consecutive tokens for the PV dot products:
// vp[k * 128 + s] = (value of token 2k at slot s, token 2k+1 at slot s). Inside each 32-element
// group g, slot 32g + j holds element 32g + 2j and slot 32g + 16 + j element 32g + 2j + 1
// (OutputElement restores the order). A token 2k+1 past ntok is 0. MXFP4 values are exact in
// bf16 down to the normal range.
JAX_MXFP4_AVX512 inline void DecodeValuePairs(const uint8_t* page, int64_t ntok, uint32_t* vp) {
  const __m512 table = _mm512_loadu_ps(kE2m1Values);
  const __m512i hi_half = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  for (int64_t t0 = 0; t0 < ntok; t0 += 2) {
    const bool second = t0 + 1 < ntok;
    const uint8_t* data0 = page + t0 * kTokenBytes;
    const uint8_t* data1 = second ? data0 + kTokenBytes : data0;
    for (int64_t g = 0; g < kGroups; ++g) {
      const __m512 table0 = ValueTable(table, page[kScaleOffset + t0 * kGroups + g]);
      const __m512 table1 = second ? ValueTable(table, page[kScaleOffset + (t0 + 1) * kGroups + g])
                                   : _mm512_setzero_ps();
      const __m512i x0 = _mm512_cvtepu8_epi32(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(data0 + g * 16)));
      const __m512i x1 = _mm512_cvtepu8_epi32(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(data1 + g * 16)));
      for (int half = 0; half < 2; ++half) {
        const __m512i i0 = half ? _mm512_srli_epi32(x0, 4) : x0;
        const __m512i i1 = half ? _mm512_srli_epi32(x1, 4) : x1;
        const __m512i v0 = _mm512_castps_si512(_mm512_permutexvar_ps(i0, table0));
        const __m512i v1 = _mm512_castps_si512(_mm512_permutexvar_ps(i1, table1));
        _mm512_storeu_si512(vp + (t0 / 2) * kHeadDim + g * 32 + half * 16,
                            _mm512_or_si512(_mm512_srli_epi32(v0, 16),
                                            _mm512_and_si512(v1, hi_half)));
      }
    }
  }
}

// o[r][64 slots from d0] += sum over token pairs of w[r] pair . vp pair (bf16 dot products);
// w holds each head's weights as bf16, two tokens per dword (stride ldw dwords).
template <int MR>
JAX_MXFP4_AVX512 inline void PvTileBf16(const uint32_t* w, int64_t ldw, const uint32_t* vp,
                                        int64_t pairs, float* o, int64_t d0) {
  __m512 acc[MR][4];
#pragma GCC unroll 4
  for (int r = 0; r < MR; ++r) {
    for (int n = 0; n < 4; ++n) acc[r][n] = _mm512_loadu_ps(o + r * kHeadDim + d0 + 16 * n);
  }
  for (int64_t k = 0; k < pairs; ++k) {
    const uint32_t* v = vp + k * kHeadDim + d0;
    const __m512bh v0 = (__m512bh)_mm512_loadu_si512(v);
    const __m512bh v1 = (__m512bh)_mm512_loadu_si512(v + 16);
    const __m512bh v2 = (__m512bh)_mm512_loadu_si512(v + 32);
    const __m512bh v3 = (__m512bh)_mm512_loadu_si512(v + 48);
#pragma GCC unroll 4
    for (int r = 0; r < MR; ++r) {
      const __m512bh p = (__m512bh)_mm512_set1_epi32(static_cast<int>(w[r * ldw + k]));
      acc[r][0] = _mm512_dpbf16_ps(acc[r][0], p, v0);
      acc[r][1] = _mm512_dpbf16_ps(acc[r][1], p, v1);
      acc[r][2] = _mm512_dpbf16_ps(acc[r][2], p, v2);
      acc[r][3] = _mm512_dpbf16_ps(acc[r][3], p, v3);
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < MR; ++r) {
    for (int n = 0; n < 4; ++n) _mm512_storeu_ps(o + r * kHeadDim + d0 + 16 * n, acc[r][n]);
  }
}

// fp32 value of the saturating e4m3 RNE of x (F32ToE4m3 then E4m3ToF32, lane-wise).
JAX_MXFP4_AVX512 inline __m512 RoundE4m3(__m512 x) {
  const __m512i bits = _mm512_castps_si512(x);
  const __m512i sign = _mm512_and_si512(bits, _mm512_set1_epi32(static_cast<int>(0x80000000u)));
  const __m512i a = _mm512_and_si512(bits, _mm512_set1_epi32(0x7FFFFFFF));
  // Normal e4m3 (|x| >= 2**-6): keep 3 mantissa bits, ties to even.
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(a, 20), _mm512_set1_epi32(1));
  __m512i r = _mm512_add_epi32(_mm512_add_epi32(a, _mm512_set1_epi32(0x7FFFF)), odd);
  r = _mm512_and_si512(r, _mm512_set1_epi32(static_cast<int>(0xFFF00000u)));
  // Subnormal e4m3: a multiple of 2**-9, rounded to nearest even.
  const __m512 units = _mm512_roundscale_ps(
      _mm512_mul_ps(_mm512_castsi512_ps(a), _mm512_set1_ps(512.0f)),
      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512i sub = _mm512_castps_si512(_mm512_mul_ps(units, _mm512_set1_ps(1.0f / 512.0f)));
  r = _mm512_mask_mov_epi32(r, _mm512_cmplt_epi32_mask(a, _mm512_set1_epi32(0x3C800000)), sub);
  r = _mm512_mask_mov_epi32(r, _mm512_cmpge_epi32_mask(a, _mm512_set1_epi32(0x43E00000)),
                            _mm512_set1_epi32(0x43E00000));  // >= 448, inf: saturate
  r = _mm512_mask_mov_epi32(r, _mm512_cmpgt_epi32_mask(a, _mm512_set1_epi32(0x7F800000)), a);
  return _mm512_castsi512_ps(_mm512_or_si512(r, sign));
}

// 32 fp32 values exact in bf16 (elements 0..15 in lo, 16..31 in hi) as 16 bf16 pairs.
JAX_MXFP4_AVX512 inline void StorePairs(__m512 lo, __m512 hi, uint32_t* out) {
  const __m512i a = _mm512_srli_epi32(_mm512_castps_si512(lo), 16);
  const __m512i b = _mm512_srli_epi32(_mm512_castps_si512(hi), 16);
  const __m512i words = _mm512_packus_epi32(a, b);  // per 128-bit lane: a[0..3], b[0..3]
  const __m512i order = _mm512_setr_epi64(0, 2, 4, 6, 1, 3, 5, 7);
  _mm512_storeu_si512(out, _mm512_permutexvar_epi64(order, words));
}

// 16 bf16 values -> fp32 (exact).
JAX_MXFP4_AVX512 inline __m512 LoadBf16(const uint16_t* src) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// A bf16 query row (128 values) as bf16 pairs, optionally rounded to e4m3 first.
JAX_MXFP4_AVX512 inline void QueryPairsBf16(const uint16_t* src, bool round_e4m3, uint32_t* out) {
  for (int c = 0; c < 4; ++c) {
    __m512 lo = LoadBf16(src + 32 * c), hi = LoadBf16(src + 32 * c + 16);
    if (round_e4m3) {
      lo = RoundE4m3(lo);
      hi = RoundE4m3(hi);
    }
    StorePairs(lo, hi, out + 16 * c);
  }
}

// bf16 pairs of e4m3(src / q_scale) for a bf16 query row (SPEC §7.1 with no lift).
JAX_MXFP4_AVX512 inline void ScaledQueryPairs(const uint16_t* src, float q_scale, uint32_t* out) {
  const __m512 scale = _mm512_set1_ps(q_scale);
  for (int c = 0; c < 4; ++c) {
    const __m512 lo = RoundE4m3(_mm512_div_ps(LoadBf16(src + 32 * c), scale));
    const __m512 hi = RoundE4m3(_mm512_div_ps(LoadBf16(src + 32 * c + 16), scale));
    StorePairs(lo, hi, out + 16 * c);
  }
}

// Horizontal max / sum of 16 lanes (shuffles; avoids GCC 12's -Wuninitialized in reduce_*).
JAX_MXFP4_AVX512 inline float HMax(__m512 v) {
  v = _mm512_max_ps(v, _mm512_shuffle_f32x4(v, v, 0x4E));
  v = _mm512_max_ps(v, _mm512_shuffle_f32x4(v, v, 0xB1));
  v = _mm512_max_ps(v, _mm512_permute_ps(v, 0x4E));
  v = _mm512_max_ps(v, _mm512_permute_ps(v, 0xB1));
  return _mm512_cvtss_f32(v);
}
JAX_MXFP4_AVX512 inline float HSum(__m512 v) {
  v = _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, 0x4E));
  v = _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, 0xB1));
  v = _mm512_add_ps(v, _mm512_permute_ps(v, 0x4E));
  v = _mm512_add_ps(v, _mm512_permute_ps(v, 0xB1));
  return _mm512_cvtss_f32(v);
}

// x * 2**k for integer lanes k (two normal steps, as MulPow2).
JAX_MXFP4_AVX512 inline __m512 MulPow2(__m512 x, __m512i k) {
  const __m512i lo = _mm512_set1_epi32(-126), hi = _mm512_set1_epi32(127);
  const __m512i bias = _mm512_set1_epi32(127);
  const __m512i k1 = _mm512_min_epi32(_mm512_max_epi32(k, lo), hi);
  const __m512i k2 = _mm512_min_epi32(_mm512_max_epi32(_mm512_sub_epi32(k, k1), lo), hi);
  const __m512 f1 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(k1, bias), 23));
  const __m512 f2 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(k2, bias), 23));
  return _mm512_mul_ps(_mm512_mul_ps(x, f1), f2);
}

// exp(x) for x <= 0 (or NaN, which it returns), error well under 1 ulp of the polynomial;
// results below FLT_MIN (x < -87.3365, incl. -inf) are 0, as under XLA's flush-to-zero.
JAX_MXFP4_AVX512 inline __m512 ExpNonPositive(__m512 x_in) {
  const __m512 x = _mm512_max_ps(_mm512_set1_ps(-88.0f), x_in);  // keeps NaN (second operand)
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187045e-06f), r);
  __m512 p = _mm512_set1_ps(1.0f / 5040.0f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  const __mmask16 tiny = _mm512_cmp_ps_mask(x_in, _mm512_set1_ps(-87.3365f), _CMP_LT_OQ);
  return _mm512_mask_blend_ps(tiny, _mm512_scalef_ps(p, n), _mm512_setzero_ps());
}

}  // namespace avx512
#endif  // JAX_MXFP4_HAVE_AVX512

}  // namespace jax_mxfp4

#endif  // JAX_MXFP4_FFI_CPU_KERNELS_H_
