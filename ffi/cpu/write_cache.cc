// jax_mxfp4_write_cache: quantize bf16 token rows to MXFP4 and store them into pool pages
// (SPEC §3, §1.4, §2.3; reference/write_cache.py, formats.quantize_mxfp4).
//
//   operands: pool u8[P, H, 8704], x bf16[T, H, 128], slots s32[T]
//             (or the one-head index cache: pool u8[P, 8704] with x bf16[T, 128])
//   attribute: round_mode int32 (0 "up", 1 "even", 2 "down")
//   result:   the pool's shape, aliased to operand 0 by the caller (input_output_aliases {0: 0})
//
// Slots < 0 or >= P*128 are skipped. Rows are quantized in parallel into a scratch buffer and
// then stored in row order, so a slot written twice keeps the last row (as XLA's scatter does).
#include <algorithm>
#include <cstring>

#include "cpu/handlers.h"
#include "cpu/mxfp4.h"

namespace jax_mxfp4 {
namespace {

constexpr const char* kTarget = "jax_mxfp4_write_cache";
constexpr int64_t kRowBytes = kTokenBytes + kGroups;  // 64 data bytes + 4 scale bytes

// e8m0 scale byte of a block from the fp32 bits of its amax (formats.mxfp4_scale_byte).
uint8_t ScaleByte(uint32_t amax_bits, int32_t round_mode) {
  const int exp_field = static_cast<int>((amax_bits >> 23) & 0xFFu);
  if (exp_field == 0xFF) return static_cast<uint8_t>(kE8m0Nan);
  int byte;
  if (round_mode == 0) {  // up: ceil_pow2(amax / 6)
    byte = std::max(exp_field - 2 + ((amax_bits & 0x7FFFFFu) > 0x400000u ? 1 : 0), 1);
    if (amax_bits == 0) byte = 0;
  } else if (round_mode == 1) {  // even: round the mantissa at 1.75, then floor(log2) - 2
    byte = std::max(static_cast<int>(((amax_bits + 0x200000u) >> 23) & 0xFFu) - 2, 0);
  } else {  // down: floor(log2(amax)) - 2
    byte = std::max(exp_field - 2, 0);
  }
  return static_cast<uint8_t>(std::min(byte, 254));
}

// Nearest e2m1 magnitude code of v >= 0, ties to the even code (formats._E2M1_STEPS).
uint32_t E2m1MagnitudeCode(float v) {
  return static_cast<uint32_t>(v > 0.25f) + (v >= 0.75f) + (v > 1.25f) + (v >= 1.75f) +
         (v > 2.5f) + (v >= 3.5f) + (v > 5.0f);
}

// One token row of one head: 128 bf16 -> 64 packed bytes followed by 4 scale bytes.
void QuantizeRow(const uint16_t* x, int32_t round_mode, uint8_t* row) {
  for (int64_t g = 0; g < kGroups; ++g) {
    const uint16_t* block = x + g * kMxBlock;
    uint32_t amax_bits = 0;
    for (int64_t i = 0; i < kMxBlock; ++i) {
      amax_bits = std::max(amax_bits, (uint32_t{block[i]} << 16) & 0x7FFFFFFFu);
    }
    const uint8_t byte = ScaleByte(amax_bits, round_mode);
    const int shift = 127 - static_cast<int>(byte);
    uint32_t codes[kMxBlock];
    for (int64_t i = 0; i < kMxBlock; ++i) {
      const uint32_t bits = uint32_t{block[i]} << 16;
      const float v = ExactScaledF32(bits & 0x7FFFFFFFu, shift);
      codes[i] = E2m1MagnitudeCode(v) | ((bits >> 31) << 3);
    }
    for (int64_t i = 0; i < kMxBlock / 2; ++i) {
      row[g * 16 + i] = static_cast<uint8_t>(codes[2 * i] | (codes[2 * i + 1] << 4));
    }
    row[kTokenBytes + g] = byte;
  }
}

// Copies `bytes` from src to dst in parallel chunks (the non-aliased case).
void ParallelCopy(ffi::ThreadPool& threads, const uint8_t* src, uint8_t* dst, int64_t bytes) {
  constexpr int64_t kChunk = int64_t{1} << 22;
  const int64_t chunks = (bytes + kChunk - 1) / kChunk;
  ParallelFor(threads, chunks, 1, [&](int, int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      const int64_t off = c * kChunk;
      std::memcpy(dst + off, src + off, static_cast<size_t>(std::min(kChunk, bytes - off)));
    }
  });
}

// Heads of a pool: u8[P, H, 8704] (K or V cache) or u8[P, 8704] (the one-head index cache).
int64_t PoolHeads(const ffi::Buffer<ffi::U8>& pool) {
  const auto pd = pool.dimensions();
  return pd.size() == 3 ? pd[1] : 1;
}

ffi::Error CheckArgs(ffi::Buffer<ffi::U8>& pool, ffi::Buffer<ffi::BF16>& x,
                     ffi::Buffer<ffi::S32>& slots, int32_t round_mode,
                     ffi::ResultBuffer<ffi::U8>& out) {
  const auto pd = pool.dimensions(), xd = x.dimensions(), sd = slots.dimensions();
  if ((pd.size() != 3 && pd.size() != 2) || pd[pd.size() - 1] != kPageBytes) {
    return BadArg(kTarget, "pool must be u8[P, H, 8704] or u8[P, 8704], got " + DimsString(pd));
  }
  const bool heads_axis = pd.size() == 3;
  if (xd.size() != pd.size() || (heads_axis && xd[1] != pd[1]) ||
      xd[xd.size() - 1] != kHeadDim) {
    return BadArg(kTarget, std::string("x must be bf16") +
                               (heads_axis ? "[T, H, 128]" : "[T, 128]") + " to match the pool " +
                               DimsString(pd) + ", got " + DimsString(xd));
  }
  if (sd.size() != 1 || sd[0] != xd[0]) {
    return BadArg(kTarget, "slots must be s32[T] with T = " + std::to_string(xd[0]) + ", got " +
                               DimsString(sd));
  }
  const auto od = out->dimensions();
  if (od.size() != pd.size() || !std::equal(od.begin(), od.end(), pd.begin())) {
    return BadArg(kTarget, "result must have the pool's shape " + DimsString(pd) + ", got " +
                               DimsString(od));
  }
  if (round_mode < 0 || round_mode > 2) {
    return BadArg(kTarget, "round_mode must be 0 (up), 1 (even) or 2 (down), got " +
                               std::to_string(round_mode));
  }
  return ffi::Error::Success();
}

ffi::Error WriteCacheImpl(ffi::ThreadPool threads, ffi::Buffer<ffi::U8> pool,
                          ffi::Buffer<ffi::BF16> x, ffi::Buffer<ffi::S32> slots,
                          int32_t round_mode, ffi::ResultBuffer<ffi::U8> out) {
  if (ffi::Error e = CheckArgs(pool, x, slots, round_mode, out); e.failure()) return e;
  const int64_t num_pages = pool.dimensions()[0], heads = PoolHeads(pool);
  const int64_t rows = x.dimensions()[0];
  uint8_t* dst = out->typed_data();
  if (dst != pool.typed_data()) {
    ParallelCopy(threads, pool.typed_data(), dst, num_pages * heads * kPageBytes);
  }
  if (rows == 0 || heads == 0) return ffi::Error::Success();
  Scratch<uint8_t> quantized;
  if (!quantized.Allocate(rows * heads * kRowBytes)) return OutOfMemory(kTarget);
  const uint16_t* xs = x.typed_data();
  const int32_t* slot = slots.typed_data();
  const int64_t capacity = num_pages * kPageTokens;
  ParallelFor(threads, rows * heads, 64, [&](int, int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t s = slot[r / heads];
      if (s < 0 || s >= capacity) continue;
      QuantizeRow(xs + r * kHeadDim, round_mode, quantized.get() + r * kRowBytes);
    }
  });
  for (int64_t t = 0; t < rows; ++t) {  // in row order: the last row of a slot wins
    const int64_t s = slot[t];
    if (s < 0 || s >= capacity) continue;
    const int64_t page = s / kPageTokens, offset = s % kPageTokens;
    for (int64_t h = 0; h < heads; ++h) {
      const uint8_t* row = quantized.get() + (t * heads + h) * kRowBytes;
      uint8_t* base = dst + (page * heads + h) * kPageBytes;
      std::memcpy(base + offset * kTokenBytes, row, kTokenBytes);
      std::memcpy(base + kScaleOffset + offset * kGroups, row + kTokenBytes, kGroups);
    }
  }
  return ffi::Error::Success();
}

}  // namespace
}  // namespace jax_mxfp4

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxMxfp4WriteCache, jax_mxfp4::WriteCacheImpl,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::ThreadPool>()
                                  .Arg<xla::ffi::Buffer<xla::ffi::U8>>()    // pool
                                  .Arg<xla::ffi::Buffer<xla::ffi::BF16>>()  // x
                                  .Arg<xla::ffi::Buffer<xla::ffi::S32>>()   // slots
                                  .Attr<int32_t>("round_mode")
                                  .Ret<xla::ffi::Buffer<xla::ffi::U8>>());

JAX_MXFP4_CPU_TARGET("jax_mxfp4_write_cache", JaxMxfp4WriteCache);
