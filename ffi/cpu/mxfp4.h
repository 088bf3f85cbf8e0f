// Shared pieces of the CPU handlers: the page layout, exact scalar codecs for the formats of
// SPEC §1 (e2m1, e8m0, e4m3, bf16), shape checks, and a parallel-for over XLA's intra-op pool.
//
// Every codec here works on bit patterns where subnormals matter: XLA runs handlers with
// flush-to-zero / denormals-are-zero set, so plain float arithmetic on subnormals is not exact.
#ifndef JAX_MXFP4_FFI_CPU_MXFP4_H_
#define JAX_MXFP4_FFI_CPU_MXFP4_H_

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <string>

#include "xla/ffi/api/ffi.h"

namespace jax_mxfp4 {

namespace ffi = xla::ffi;

// --- page layout (SPEC §2.1) ------------------------------------------------------------------
constexpr int64_t kHeadDim = 128;        // elements per token row
constexpr int64_t kMxBlock = 32;         // elements per e8m0 scale byte
constexpr int64_t kGroups = 4;           // scale bytes per token row
constexpr int64_t kPageTokens = 128;     // tokens per page
constexpr int64_t kTokenBytes = 64;      // packed e2m1 bytes per token row
constexpr int64_t kScaleOffset = 8192;   // byte offset of the scale area in a page
constexpr int64_t kPageBytes = 8704;     // bytes per page
constexpr uint32_t kE8m0Nan = 255;
constexpr uint8_t kE4m3Nan = 0x7F;   // float8_e4m3fn NaN (no Inf in e4m3fn)

constexpr float kE2m1Values[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                   -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

// --- bit patterns -----------------------------------------------------------------------------
inline float F32FromBits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, sizeof f);
  return f;
}
inline uint32_t F32Bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  return b;
}
inline float Bf16ToF32(uint16_t h) { return F32FromBits(uint32_t{h} << 16); }

// fp32 -> bf16, round to nearest even; NaN stays a (quiet) NaN with its sign.
inline uint16_t F32ToBf16(float f) {
  const uint32_t b = F32Bits(f);
  if ((b & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((b >> 16) | 0x40u);
  return static_cast<uint16_t>((b + 0x7FFFu + ((b >> 16) & 1u)) >> 16);
}

// 2**k for k in [-126, 127], a normal fp32 number.
inline float Pow2(int k) { return F32FromBits(static_cast<uint32_t>(k + 127) << 23); }

// x * 2**k in two normal steps (the reference's _bits.mul_pow2): exact for normal results.
inline float MulPow2(float x, int k) {
  const int k1 = std::clamp(k, -126, 127);
  const int k2 = std::clamp(k - k1, -126, 127);
  return x * Pow2(k1) * Pow2(k2);
}

// float(bits) * 2**k, exact even when float(bits) is subnormal (the reference's
// _bits.exact_scaled_f32): the significand is scaled as an integer-valued float.
inline float ExactScaledF32(uint32_t bits, int k) {
  const uint32_t exp_field = (bits >> 23) & 0xFFu;
  if (exp_field == 0xFFu) return F32FromBits(bits);
  const uint32_t mant = bits & 0x7FFFFFu;
  const uint32_t significand = exp_field ? (mant | 0x800000u) : mant;
  const int exponent = static_cast<int>(std::max(exp_field, 1u)) - 150 + k;
  const float magnitude = MulPow2(static_cast<float>(significand), exponent);
  return F32FromBits(F32Bits(magnitude) | (bits & 0x80000000u));
}

// fp32 (given as bits) -> float8_e4m3fn code: RNE(clamp(x, -448, 448)), subnormals exact,
// NaN -> 0x7F with the sign of x (SPEC §1.5).
inline uint8_t F32BitsToE4m3(uint32_t b) {
  const uint32_t sign = (b >> 24) & 0x80u;
  const uint32_t a = b & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return static_cast<uint8_t>(sign | 0x7Fu);
  if (a >= 0x43E00000u) return static_cast<uint8_t>(sign | 0x7Eu);  // >= 448 (incl. inf)
  const uint32_t exp_field = a >> 23;
  if (exp_field >= 121) {  // normal e4m3: keep 3 mantissa bits, round to nearest even
    const uint32_t r = (a + 0x7FFFFu + ((a >> 20) & 1u)) >> 20;
    return static_cast<uint8_t>(sign | (r - (120u << 3)));
  }
  // e4m3 subnormal: units of 2**-9. value = significand * 2**(e - 150), e = max(exp, 1).
  const uint32_t significand = exp_field ? ((a & 0x7FFFFFu) | 0x800000u) : a;
  const uint32_t shift = 141u - std::max(exp_field, 1u);  // >= 21
  if (shift > 31) return static_cast<uint8_t>(sign);
  uint32_t units = significand >> shift;
  const uint32_t rest = significand - (units << shift);
  const uint32_t half = 1u << (shift - 1);
  if (rest > half || (rest == half && (units & 1u))) ++units;
  return static_cast<uint8_t>(sign | units);
}
inline uint8_t F32ToE4m3(float x) { return F32BitsToE4m3(F32Bits(x)); }

// float8_e4m3fn code -> fp32 value (exact; 0x7F / 0xFF are NaN).
inline float E4m3ToF32(uint8_t c) {
  const uint32_t sign = uint32_t{c & 0x80u} << 24;
  const uint32_t e = (c >> 3) & 0xFu, m = c & 7u;
  if (e == 0xF && m == 7) return F32FromBits(sign | 0x7FC00000u);
  if (e == 0) return F32FromBits(F32Bits(static_cast<float>(m) * 0.001953125f) | sign);
  return F32FromBits(sign | ((e + 120u) << 23) | (m << 20));
}

// fp32 bits of e2m1(code) * 2**(byte - 127) (formats.mxfp4_f32_bits): exact, subnormals
// included; byte 255 is NaN; past the fp32 range is inf.
inline uint32_t Mxfp4F32Bits(uint32_t code, int byte) {
  if (byte == static_cast<int>(kE8m0Nan)) return 0x7FC00000u;
  const uint32_t mag = code & 7u, sign = (code >> 3) << 31;
  if (mag == 0) return sign;
  const int exp_offset = mag >= 2 ? static_cast<int>(mag >> 1) - 1 : -1;
  const uint32_t half = mag >= 2 ? (mag & 1u) : 0u;
  const int e = byte + exp_offset;
  if (e >= 255) return sign | 0x7F800000u;
  if (e >= 1) return sign | (static_cast<uint32_t>(e) << 23) | (half << 22);
  const int shift = e + 21;  // (2 + half) * 2**(e - 128) in units of 2**-149
  const uint32_t sig = 2u + half;
  if (shift >= 0) return sign | (sig << shift);
  const int drop = -shift;
  if (drop > 31) return sign;
  uint32_t kept = sig >> drop;
  const uint32_t rest = sig - (kept << drop), halfway = 1u << (drop - 1);
  if (rest > halfway || (rest == halfway && (kept & 1u))) ++kept;
  return sign | kept;
}

// Asks for a page's cache lines ahead of use (pages are scattered in the pool, so the
// hardware prefetchers only catch up after the first misses of each page).
inline void PrefetchPage(const uint8_t* page) {
#if defined(__GNUC__) || defined(__clang__)
  for (int64_t off = 0; off < kPageBytes; off += 64) __builtin_prefetch(page + off, 0, 3);
#else
  (void)page;
#endif
}

// --- thread pool ------------------------------------------------------------------------------
// Work [0, n) split into chunks that the calling thread and up to (pool threads - 1) tasks of
// XLA's intra-op pool take from a shared counter. The caller waits for all chunks, never for
// the tasks themselves: a task that starts late finds no chunk left and touches only the
// shared state it co-owns, so the call cannot deadlock when the pool is busy.
struct ParallelState {
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};
  int64_t num_chunks = 0, n = 0, chunk = 0;
  void (*call)(const void*, int, int64_t, int64_t) = nullptr;
  const void* fn = nullptr;
  std::mutex mu;
  std::condition_variable cv;

  void Run(int worker) {
    for (int64_t c = next.fetch_add(1); c < num_chunks; c = next.fetch_add(1)) {
      call(fn, worker, c * chunk, std::min(n, (c + 1) * chunk));
      if (done.fetch_add(1) + 1 == num_chunks) {
        std::lock_guard<std::mutex> lock(mu);
        cv.notify_all();
      }
    }
  }
};

// How many threads (the caller included) a parallel region may use.
inline int NumWorkers(ffi::ThreadPool& pool) {
  return static_cast<int>(std::clamp<int64_t>(pool.num_threads(), 1, 256));
}

// fn(worker, begin, end) over [0, n); worker < NumWorkers(pool) identifies a thread-private
// slot (for scratch buffers). Chunks hold at least `grain` items, at most chunks_per_worker
// chunks per worker.
template <typename Fn>
void ParallelFor(ffi::ThreadPool& pool, int64_t n, int64_t grain, const Fn& fn,
                 int chunks_per_worker = 4) {
  if (n <= 0) return;
  const int workers = NumWorkers(pool);
  grain = std::max<int64_t>(grain, 1);
  const int64_t chunks = std::max<int64_t>(
      1, std::min<int64_t>((n + grain - 1) / grain, int64_t{chunks_per_worker} * workers));
  if (workers == 1 || chunks == 1) {
    fn(0, int64_t{0}, n);
    return;
  }
  auto state = std::make_shared<ParallelState>();
  state->n = n;
  state->chunk = (n + chunks - 1) / chunks;
  state->num_chunks = (n + state->chunk - 1) / state->chunk;
  state->fn = &fn;
  state->call = [](const void* f, int w, int64_t b, int64_t e) {
    (*static_cast<const Fn*>(f))(w, b, e);
  };
  const int tasks = static_cast<int>(std::min<int64_t>(workers, state->num_chunks)) - 1;
  for (int t = 1; t <= tasks; ++t) {
    pool.Schedule([state, t] { state->Run(t); });
  }
  state->Run(0);
  std::unique_lock<std::mutex> lock(state->mu);
  state->cv.wait(lock, [&] { return state->done.load() == state->num_chunks; });
}

// A zero-initialised scratch array that reports allocation failure instead of throwing.
template <typename T>
struct Scratch {
  std::unique_ptr<T[]> data;
  bool Allocate(int64_t count) {
    data.reset(new (std::nothrow) T[static_cast<size_t>(std::max<int64_t>(count, 1))]());
    return data != nullptr;
  }
  T* get() const { return data.get(); }
};

// A scratch array left uninitialized (for buffers whose every element read is written first:
// no zero-fill proportional to the allocation); reports allocation failure instead of throwing.
template <typename T>
struct UninitializedScratch {
  std::unique_ptr<T[]> data;
  bool Allocate(int64_t count) {
    data.reset(new (std::nothrow) T[static_cast<size_t>(std::max<int64_t>(count, 1))]);
    return data != nullptr;
  }
  T* get() const { return data.get(); }
};

// --- argument checks --------------------------------------------------------------------------
inline std::string DimsString(ffi::Span<const int64_t> dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + "]";
}

// An InvalidArgument error naming the target and the operand.
inline ffi::Error BadArg(const char* target, const std::string& what) {
  return ffi::Error::InvalidArgument(std::string(target) + ": " + what);
}

inline ffi::Error OutOfMemory(const char* target) {
  return ffi::Error(ffi::ErrorCode::kResourceExhausted,
                    std::string(target) + ": could not allocate scratch memory");
}

// The SIMD kernels run when the CPU has AVX-512 BF16 and JAX_MXFP4_CPU_ISA is not "generic"
// (the portable scalar kernels compute the same values; the variable exists to test them).
inline bool UseAvx512() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  const char* isa = std::getenv("JAX_MXFP4_CPU_ISA");
  if (isa != nullptr && std::strcmp(isa, "generic") == 0) return false;
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
         __builtin_cpu_supports("avx512bf16");
#else
  return false;
#endif
}

}  // namespace jax_mxfp4

#endif  // JAX_MXFP4_FFI_CPU_MXFP4_H_
