// jax_mxfp4_select_blocks: top-k blocks per (index head, row) and the sparse page table
// (SPEC §6, §6.1, §2.5; reference/select_blocks.py, bit for bit).
//
//   operands: scores f32[H, T, NB], block_table s32[B, W] (W >= NB), positions s32[T],
//             requests s32[T]
//   attributes: init_blocks int64, local_blocks int64
//   results: block_ids s32[H, T, K], page_table s32[T, H, K], context_lens s32[T, H]
//
// Candidates of a row with position p are the valid = min(p // 128 + 1, NB) first blocks. The
// forced blocks come first by construction (no score can outrank them): the init blocks
// 0 .. min(init_blocks, valid) - 1, then the local blocks (the last local_blocks candidates
// that are not init blocks). The rest of the min(K, valid) selections are the other candidates
// by score, descending: +inf > finite > NaN > -inf, -0 < +0 (lax.top_k's order), ties to the
// lower block.
#include <algorithm>
#include <vector>

#include "cpu/handlers.h"
#include "cpu/mxfp4.h"

namespace jax_mxfp4 {
namespace {

constexpr const char* kTarget = "jax_mxfp4_select_blocks";
constexpr uint64_t kNegInfOrder = 0x007FFFFFu;  // -inf's bit pattern in OrderOf's order

// 2 * (the float's bit pattern as an unsigned in total order); NaN takes 2 * order(-inf) + 1,
// just above -inf and below -FLT_MAX (whose order is order(-inf) + 1).
uint64_t OrderOf(float score) {
  if (score != score) return 2 * kNegInfOrder + 1;
  const uint32_t bits = F32Bits(score);
  return 2 * uint64_t{(bits & 0x80000000u) ? ~bits : (bits | 0x80000000u)};
}

// A 64-bit rank that orders (score descending, block ascending) as unsigned integers
// descending: the score's 33-bit order above 31 bits of inverted block number.
uint64_t Rank(float score, int64_t block) {
  return (OrderOf(score) << 31) | (0x7FFFFFFFu - static_cast<uint32_t>(block));
}

int64_t RankBlock(uint64_t rank) { return 0x7FFFFFFF - static_cast<int64_t>(rank & 0x7FFFFFFFu); }

struct RowInfo {
  bool live = false;
  int32_t position = -1;
  int64_t request = 0;
  int64_t valid = 0;       // candidate blocks
  int64_t self_block = -2; // the row's own (partial) block
};

struct Outputs {
  int32_t* block_ids;  // [H, T, K]
  int32_t* pages;      // [T, H, K]
  int32_t* context;    // [T, H]
};

// The forced blocks of a row: 0 .. init - 1, then first_local .. valid - 1 (SPEC §6).
struct Forced {
  int64_t init, first_local, count;
};

Forced ForcedBlocks(int64_t valid, int64_t init_blocks, int64_t local_blocks) {
  Forced f;
  f.init = std::min(valid, init_blocks);
  f.first_local = std::max(valid - local_blocks, f.init);
  f.count = f.init + valid - f.first_local;
  return f;
}

// Selects the blocks of one (head, row) into ids[0..count) (selection order); returns count.
// The forced blocks first, then the best of the other candidates by Rank.
int64_t SelectRow(const float* scores, const RowInfo& row, int64_t topk, int64_t init_blocks,
                  int64_t local_blocks, std::vector<uint64_t>& ranks, int64_t* ids) {
  const int64_t count = std::min(topk, row.valid);
  const Forced f = ForcedBlocks(row.valid, init_blocks, local_blocks);
  int64_t r = 0;
  for (int64_t j = 0; j < f.init && r < count; ++j) ids[r++] = j;
  for (int64_t j = f.first_local; j < row.valid && r < count; ++j) ids[r++] = j;
  const int64_t wanted = count - r;
  if (wanted <= 0) return count;
  ranks.clear();
  for (int64_t j = f.init; j < f.first_local; ++j) ranks.push_back(Rank(scores[j], j));
  if (wanted < static_cast<int64_t>(ranks.size())) {  // the best `wanted` first (distinct)
    std::nth_element(ranks.begin(), ranks.begin() + (wanted - 1), ranks.end(), std::greater<>());
  }
  std::sort(ranks.begin(), ranks.begin() + wanted, std::greater<>());
  for (int64_t k = 0; k < wanted; ++k) ids[r++] = RankBlock(ranks[k]);
  return count;
}

// Writes block ids, the attention-ordered page table and the context of one (head, row).
void EmitRow(const int64_t* selected, int64_t count, const RowInfo& row,
             const int32_t* table_row, int64_t topk, int32_t* ids, int32_t* pages,
             int32_t* context) {
  int64_t filled = 0;
  bool has_tail = false;
  for (int64_t r = 0; r < topk; ++r) ids[r] = r < count ? static_cast<int32_t>(selected[r]) : -1;
  for (int64_t r = 0; r < count; ++r) {  // full blocks in selection order, then the tail
    const int64_t block = selected[r];
    if (block == row.self_block) {
      has_tail = true;
    } else {
      pages[filled++] = table_row[block];
    }
  }
  if (has_tail) pages[filled++] = table_row[row.self_block];
  for (int64_t r = filled; r < topk; ++r) pages[r] = 0;
  // In 64 bits: position INT32_MAX + 1 does not wrap.
  int64_t ctx;
  if (has_tail) {
    ctx = (count - 1) * kPageTokens + (row.position % kPageTokens) + 1;
  } else {
    ctx = std::min<int64_t>(count * kPageTokens, int64_t{row.position} + 1);
  }
  *context = static_cast<int32_t>(std::max<int64_t>(ctx, 0));
}

RowInfo MakeRow(int32_t position, int32_t request, int64_t num_requests, int64_t num_blocks) {
  RowInfo row;
  row.live = position >= 0 && request >= 0 && request < num_requests;
  if (!row.live) return row;
  row.position = position;
  row.request = request;
  row.valid = std::min<int64_t>(position / kPageTokens + 1, num_blocks);
  row.self_block = position / kPageTokens;
  return row;
}

ffi::Error CheckArgs(ffi::Buffer<ffi::F32>& scores, ffi::Buffer<ffi::S32>& table,
                     ffi::Buffer<ffi::S32>& positions, ffi::Buffer<ffi::S32>& requests,
                     int64_t init_blocks, int64_t local_blocks, ffi::ResultBuffer<ffi::S32>& ids,
                     ffi::ResultBuffer<ffi::S32>& pages, ffi::ResultBuffer<ffi::S32>& context) {
  if (init_blocks < 0 || local_blocks < 0) {
    return BadArg(kTarget, "init_blocks and local_blocks must be >= 0, got " +
                               std::to_string(init_blocks) + " and " +
                               std::to_string(local_blocks));
  }
  const auto sd = scores.dimensions(), bd = table.dimensions();
  if (sd.size() != 3) return BadArg(kTarget, "scores must be f32[H, T, NB], got " + DimsString(sd));
  if (bd.size() != 2 || bd[1] < sd[2]) {
    return BadArg(kTarget, "block_table must be s32[B, W] with W >= NB = " +
                               std::to_string(sd[2]) + ", got " + DimsString(bd));
  }
  if (positions.dimensions().size() != 1 || positions.dimensions()[0] != sd[1] ||
      requests.dimensions().size() != 1 || requests.dimensions()[0] != sd[1]) {
    return BadArg(kTarget, "positions and requests must be s32[T] with T = " +
                               std::to_string(sd[1]));
  }
  const auto id = ids->dimensions(), pd = pages->dimensions(), cd = context->dimensions();
  if (id.size() != 3 || id[0] != sd[0] || id[1] != sd[1]) {
    return BadArg(kTarget, "block_ids must be s32[H, T, K], got " + DimsString(id));
  }
  if (pd.size() != 3 || pd[0] != sd[1] || pd[1] != sd[0] || pd[2] != id[2]) {
    return BadArg(kTarget, "page_table must be s32[T, H, K], got " + DimsString(pd));
  }
  if (cd.size() != 2 || cd[0] != sd[1] || cd[1] != sd[0]) {
    return BadArg(kTarget, "context_lens must be s32[T, H], got " + DimsString(cd));
  }
  return ffi::Error::Success();
}

ffi::Error SelectBlocksImpl(ffi::ThreadPool threads, ffi::Buffer<ffi::F32> scores,
                            ffi::Buffer<ffi::S32> table, ffi::Buffer<ffi::S32> positions,
                            ffi::Buffer<ffi::S32> requests, int64_t init_blocks,
                            int64_t local_blocks, ffi::ResultBuffer<ffi::S32> ids,
                            ffi::ResultBuffer<ffi::S32> pages,
                            ffi::ResultBuffer<ffi::S32> context) {
  if (ffi::Error e = CheckArgs(scores, table, positions, requests, init_blocks, local_blocks, ids,
                               pages, context);
      e.failure()) {
    return e;
  }
  const int64_t heads = scores.dimensions()[0], rows = scores.dimensions()[1];
  const int64_t num_blocks = scores.dimensions()[2], topk = ids->dimensions()[2];
  const int64_t num_requests = table.dimensions()[0], width = table.dimensions()[1];
  const Outputs out{ids->typed_data(), pages->typed_data(), context->typed_data()};
  const float* s = scores.typed_data();
  const int32_t* bt = table.typed_data();
  const int32_t* pos = positions.typed_data();
  const int32_t* req = requests.typed_data();
  ParallelFor(threads, rows, 16, [&](int, int64_t begin, int64_t end) {
    std::vector<uint64_t> ranks;
    std::vector<int64_t> selected(static_cast<size_t>(std::max<int64_t>(topk, 1)));
    ranks.reserve(static_cast<size_t>(num_blocks));
    for (int64_t t = begin; t < end; ++t) {
      const RowInfo row = MakeRow(pos[t], req[t], num_requests, num_blocks);
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t count = SelectRow(s + (h * rows + t) * num_blocks, row, topk, init_blocks,
                                        local_blocks, ranks, selected.data());
        EmitRow(selected.data(), count, row, bt + row.request * width, topk,
                out.block_ids + (h * rows + t) * topk, out.pages + (t * heads + h) * topk,
                out.context + t * heads + h);
      }
    }
  });
  return ffi::Error::Success();
}

}  // namespace
}  // namespace jax_mxfp4

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxMxfp4SelectBlocks, jax_mxfp4::SelectBlocksImpl,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::ThreadPool>()
                                  .Arg<xla::ffi::Buffer<xla::ffi::F32>>()  // scores
                                  .Arg<xla::ffi::Buffer<xla::ffi::S32>>()  // block_table
                                  .Arg<xla::ffi::Buffer<xla::ffi::S32>>()  // positions
                                  .Arg<xla::ffi::Buffer<xla::ffi::S32>>()  // requests
                                  .Attr<int64_t>("init_blocks")
                                  .Attr<int64_t>("local_blocks")
                                  .Ret<xla::ffi::Buffer<xla::ffi::S32>>()   // block_ids
                                  .Ret<xla::ffi::Buffer<xla::ffi::S32>>()   // page_table
                                  .Ret<xla::ffi::Buffer<xla::ffi::S32>>());  // context_lens

JAX_MXFP4_CPU_TARGET("jax_mxfp4_select_blocks", JaxMxfp4SelectBlocks);
