// Paged decode and prefill attention against cpu::PagedAttention on random caches, random block
// tables and mixed lengths (including contexts that need several split-K pieces and chunks that
// start mid-sequence). Tolerances (relative L2): decode 1e-2 (fp32 math, bf16 output), prefill
// 2e-2 (probabilities are rounded to bf16 for the tensor-core P.V product).
#include "kernels/cuda/attention.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <tuple>

#include "common/dtype.h"
#include "gtest/gtest.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/device_info.h"
#include "kernels/cuda/test_util.h"

namespace ringserve::cuda {
namespace {

using testing::Download;
using testing::DownloadBf16;
using testing::Poison;
using testing::RandomBf16Values;
using testing::RelL2;
using testing::Upload;
using testing::UploadBf16;

// The cache's element type in a test: bf16, or e4m3 codes with these scales.
struct KvFormat {
  bool fp8 = false;
  float k_scale = 1.0f;
  float v_scale = 1.0f;
};
constexpr KvFormat kFp8Scaled{.fp8 = true, .k_scale = 0.05f, .v_scale = 0.02f};

// A random paged cache in the CUDA layout plus the same data in the CPU layout; with an fp8
// format, as e4m3 codes (FloatToFp8E4M3(x / scale)) in both.
struct TestCache {
  int num_blocks, kv_heads, block_size, head_dim;
  KvFormat format;
  std::vector<float> k, v;          // CUDA layout [blocks][kv_heads][block_size][head_dim]
  std::vector<float> cpu_k, cpu_v;  // CPU layout [blocks][block_size][kv_heads][head_dim]
  std::vector<uint8_t> k8, v8, cpu_k8, cpu_v8;  // fp8: the codes of k, v, cpu_k, cpu_v
  DeviceBuffer dk, dv;

  TestCache(std::mt19937& rng, int blocks, int kvh, int bs, int d, KvFormat f = {})
      : num_blocks(blocks), kv_heads(kvh), block_size(bs), head_dim(d), format(f) {
    const size_t n = static_cast<size_t>(blocks) * kvh * bs * d;
    k = RandomBf16Values(rng, n);
    v = RandomBf16Values(rng, n);
    cpu_k.resize(n);
    cpu_v.resize(n);
    for (int b = 0; b < blocks; ++b)
      for (int h = 0; h < kvh; ++h)
        for (int s = 0; s < bs; ++s)
          for (int i = 0; i < d; ++i) {
            const size_t from = ((static_cast<size_t>(b) * kvh + h) * bs + s) * d + i;
            const size_t to = ((static_cast<size_t>(b) * bs + s) * kvh + h) * d + i;
            cpu_k[to] = k[from];
            cpu_v[to] = v[from];
          }
    if (!f.fp8) {
      dk = UploadBf16(k);
      dv = UploadBf16(v);
      return;
    }
    auto codes = [](const std::vector<float>& x, float scale) {
      std::vector<uint8_t> out(x.size());
      for (size_t i = 0; i < x.size(); ++i) out[i] = FloatToFp8E4M3(x[i] / scale);
      return out;
    };
    k8 = codes(k, f.k_scale);
    v8 = codes(v, f.v_scale);
    cpu_k8 = codes(cpu_k, f.k_scale);
    cpu_v8 = codes(cpu_v, f.v_scale);
    dk = Upload(k8);
    dv = Upload(v8);
  }
  cpu::KvLayerView CpuView() {
    cpu::KvLayerView view{.k = cpu_k.data(),
                          .v = cpu_v.data(),
                          .block_stride = static_cast<int64_t>(block_size) * kv_heads * head_dim,
                          .block_size = block_size,
                          .num_kv_heads = kv_heads,
                          .head_dim = head_dim};
    if (format.fp8) {
      view = {.block_stride = view.block_stride,
              .block_size = block_size,
              .num_kv_heads = kv_heads,
              .head_dim = head_dim,
              .k8 = cpu_k8.data(),
              .v8 = cpu_v8.data(),
              .k_scale = format.k_scale,
              .v_scale = format.v_scale};
    }
    return view;
  }
  KvCacheLayer Layer() {
    if (format.fp8) {
      return {.num_kv_heads = kv_heads,
              .block_size = block_size,
              .head_dim = head_dim,
              .k8 = dk.as<uint8_t>(),
              .v8 = dv.as<uint8_t>(),
              .k_scale = format.k_scale,
              .v_scale = format.v_scale};
    }
    return {dk.as<bf16>(), dv.as<bf16>(), kv_heads, block_size, head_dim};
  }
};

// The kernels the selector picks on device 0 for this shape.
KernelPlan DevicePlan(int head_dim, int heads, int kv_heads, const KernelOptions& options = {}) {
  absl::StatusOr<KernelPlan> plan = SelectKernelsForDevice(
      0, {.head_dim = head_dim, .num_heads = heads, .num_kv_heads = kv_heads}, options);
  EXPECT_TRUE(plan.ok()) << plan.status();
  return plan.ok() ? *plan : KernelPlan{};
}

std::vector<int32_t> RandomTable(std::mt19937& rng, int num_blocks, int max_blocks) {
  std::vector<int32_t> all(num_blocks);
  std::iota(all.begin(), all.end(), 0);
  std::shuffle(all.begin(), all.end(), rng);
  all.resize(max_blocks);
  return all;
}

// A decode batch's device arrays: entry e attends row q_rows[e] through table row e of `tables`
// ([entries, max_blocks]) to contexts[e] keys, in DecodeSplitsFor(max context, partition)
// splits with their workspace, on `kernel`.
struct DeviceDecodeBatch {
  DeviceBuffer ctx, rows, table_rows, tables, workspace;
  DecodeBatch batch;

  DeviceDecodeBatch(const std::vector<int32_t>& contexts, const std::vector<int32_t>& q_rows,
                    const std::vector<int32_t>& block_tables, int max_blocks, int heads,
                    int head_dim, int partition, DecodeAttentionKernel kernel)
      : ctx(Upload(contexts)), rows(Upload(q_rows)), tables(Upload(block_tables)) {
    const int entries = static_cast<int>(contexts.size());
    std::vector<int32_t> trows(entries);
    std::iota(trows.begin(), trows.end(), 0);
    table_rows = Upload(trows);
    const int splits =
        DecodeSplitsFor(*std::max_element(contexts.begin(), contexts.end()), partition);
    EXPECT_TRUE(
        workspace.Allocate(DecodeWorkspaceFloats(entries, heads, head_dim, splits) * 4 + 16).ok());
    batch = {.q_rows = rows.as<int32_t>(),
             .context_lens = ctx.as<int32_t>(),
             .table_rows = table_rows.as<int32_t>(),
             .block_tables = tables.as<int32_t>(),
             .max_blocks = max_blocks,
             .num_entries = entries,
             .num_splits = splits,
             .workspace = workspace.as<float>(),
             .partition = partition,
             .kernel = kernel};
  }
};

// On the kernel the selector picks for the shape (with `options`), launched as the slice would
// (dependent launch where the plan has it).
void RunDecodeCase(int head_dim, int heads, int kv_heads, std::vector<int32_t> contexts,
                   uint32_t seed, int partition = kDecodePartition,
                   const KernelOptions& options = {}, int sliding_window = 0, bool sinks = false,
                   KvFormat format = {}) {
  SCOPED_TRACE(::testing::Message()
               << "head_dim " << head_dim << " seed " << seed << " fp8 " << format.fp8);
  const KernelPlan plan = DevicePlan(head_dim, heads, kv_heads, options);
  std::mt19937 rng(seed);
  const int bs = 16;
  const int max_ctx = *std::max_element(contexts.begin(), contexts.end());
  const int max_blocks = (max_ctx + bs - 1) / bs;
  TestCache cache(rng, max_blocks + 7, kv_heads, bs, head_dim, format);
  const int entries = static_cast<int>(contexts.size());
  std::vector<int32_t> tables, q_rows(entries);
  for (int e = 0; e < entries; ++e) {
    const auto t = RandomTable(rng, cache.num_blocks, max_blocks);
    tables.insert(tables.end(), t.begin(), t.end());
    q_rows[e] = entries - 1 - e;  // rows need not follow entries
  }
  const auto q = RandomBf16Values(rng, static_cast<size_t>(entries) * heads * head_dim);
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  std::vector<float> sink_logits;
  if (sinks) {
    std::uniform_real_distribution<float> uni(-2.0f, 3.0f);
    for (int h = 0; h < heads; ++h) sink_logits.push_back(uni(rng));
  }
  const cpu::AttentionVariant variant{.sliding_window = sliding_window,
                                      .sinks = sinks ? sink_logits.data() : nullptr};
  std::vector<float> want(q.size());
  for (int e = 0; e < entries; ++e) {
    const size_t row = static_cast<size_t>(q_rows[e]) * heads * head_dim;
    cpu::PagedAttention(q.data() + row, 1, heads, cache.CpuView(),
                        std::span<const int32_t>(tables.data() + e * max_blocks, max_blocks),
                        contexts[e] - 1, scale, variant, want.data() + row);
  }
  DeviceBuffer dsinks = Upload(sinks ? sink_logits : std::vector<float>{0.0f});
  DeviceBuffer dq = UploadBf16(q), dout;
  ASSERT_TRUE(dout.Allocate(q.size() * 2).ok());
  Poison(dout);
  const DeviceDecodeBatch device_batch(contexts, q_rows, tables, max_blocks, heads, head_dim,
                                       partition, plan.decode_attention);
  const DecodeBatch& batch = device_batch.batch;
  AttentionShape shape{.num_heads = heads,
                       .scale = scale,
                       .cache = cache.Layer(),
                       .sinks = sinks ? dsinks.as<float>() : nullptr,
                       .sliding_window = sliding_window};
  RS_ASSERT_OK(LaunchDecodeAttention(shape, dq.as<bf16>(), dout.as<bf16>(), batch,
                                     LaunchStream(nullptr, plan.dependent_launch)));
  const std::vector<float> got = DownloadBf16(dout, q.size());
  EXPECT_LT(RelL2(got, want), 1e-2) << "splits " << batch.num_splits;
  if (batch.num_splits == 1) return;
  // The splits merged by the CTA that finishes last (split tickets): the same bits, twice (the
  // tickets are left at zero for the next launch).
  DeviceBuffer tickets;
  ASSERT_TRUE(tickets.Allocate(DecodeSplitTickets(entries, heads) * 4).ok());
  ASSERT_EQ(cudaMemset(tickets.get(), 0, tickets.bytes()), cudaSuccess);
  DecodeBatch ticketed = batch;
  ticketed.split_tickets = tickets.as<int32_t>();
  for (int launch = 0; launch < 2; ++launch) {
    Poison(dout);
    RS_ASSERT_OK(LaunchDecodeAttention(shape, dq.as<bf16>(), dout.as<bf16>(), ticketed,
                                       LaunchStream(nullptr, plan.dependent_launch)));
    const std::vector<float> merged = DownloadBf16(dout, q.size());
    EXPECT_EQ(std::memcmp(merged.data(), got.data(), got.size() * sizeof(float)), 0)
        << "split tickets, launch " << launch;
  }
  EXPECT_EQ(Download<int32_t>(tickets, DecodeSplitTickets(entries, heads)),
            std::vector<int32_t>(DecodeSplitTickets(entries, heads), 0));
}

// gpt-oss's attention on the CUDA-core kernel: sinks (with one and several splits) and sliding
// windows (splits wholly before the window leave empty partials), head_dim 8 too.
TEST(CudaDecodeAttentionTest, SinksAndSlidingWindowMatchCpu) {
  RS_SKIP_WITHOUT_GPU();
  const uint32_t seed = std::random_device{}();
  const KernelOptions cuda_core{.decode_attention_tensor_cores = false};
  RunDecodeCase(8, 4, 2, {1, 5, 40, 600}, seed, kDecodePartition, cuda_core, 6, true);
  RunDecodeCase(64, 8, 2, {3, 130, 700, 1100}, seed + 1, 256, cuda_core, 128, true);
  RunDecodeCase(64, 8, 2, {3, 130, 700}, seed + 2, kDecodePartition, cuda_core, 0, true);
  RunDecodeCase(16, 4, 1, {1, 9, 300}, seed + 3, 64, cuda_core, 20, false);
  RunDecodeCase(128, 16, 2, {2, 90, 1500}, seed + 4, 512, cuda_core, 64, true);
}

// More than 8 query heads per kv head (GLM-4.5: 12) run in parts of at most 8 heads on the
// CUDA-core kernel (the selector's choice for such groups), with splits, windows and sinks.
TEST(CudaDecodeAttentionTest, LargeGroupsRunInPartsAndMatchCpu) {
  RS_SKIP_WITHOUT_GPU();
  const uint32_t seed = std::random_device{}();
  RunDecodeCase(128, 24, 2, {1, 90, 700, 1500}, seed);
  RunDecodeCase(128, 24, 2, {3, 300}, seed + 1, 64);
  RunDecodeCase(16, 12, 1, {1, 40, 600}, seed + 2, 128, {}, 20, true);
  RunDecodeCase(64, 36, 3, {5, 513}, seed + 3, kDecodePartition, {}, 0, true);  // parts of 6
  RunDecodeCase(64, 16, 1, {2, 100}, seed + 4);                                 // 2 parts of 8
}

TEST(CudaDecodeAttentionTest, MatchesCpuWithGqaAndSplitK) {
  RS_SKIP_WITHOUT_GPU();
  const uint32_t seed = std::random_device{}();
  RunDecodeCase(128, 8, 2, {1, 17, 512, 513, 1500, 40}, seed);
  RunDecodeCase(128, 32, 8, {100, 200, 300}, seed + 1);  // one split
  RunDecodeCase(16, 4, 1, {3, 700, 64}, seed + 2);
  RunDecodeCase(32, 4, 2, {1, 2, 33}, seed + 3);
  RunDecodeCase(64, 16, 2, {1030, 5}, seed + 4);  // group 8
  RunDecodeCase(128, 32, 8, {1, 63, 64, 65, 300}, seed + 5, /*partition=*/64);
  RunDecodeCase(128, 32, 8, {1, 31, 32, 33, 2000}, seed + 6, /*partition=*/96);
  RunDecodeCase(128, 8, 2, {3000, 17, 1025}, seed + 7, /*partition=*/1024);  // long splits
  RunDecodeCase(64, 12, 4, {777, 2}, seed + 8, /*partition=*/32);            // group 3
  // Head dim 128 runs the tensor-core kernel: group 8 (half the MMA rows), group 1 (MHA) and a
  // split that is not a whole number of 32-key tiles.
  RunDecodeCase(128, 16, 2, {5, 600, 33}, seed + 9);
  RunDecodeCase(128, 4, 4, {1, 129, 70}, seed + 10);
  RunDecodeCase(128, 32, 8, {47, 200, 1}, seed + 11, /*partition=*/48);
  // Head dim 128 on the CUDA-core kernel (devices without 100 KB of shared memory per CTA).
  RunDecodeCase(128, 32, 8, {1, 200, 513}, seed + 12, /*partition=*/256,
                {.decode_attention_tensor_cores = false});
  // The tensor-core kernel refuses other head dims.
  const AttentionShape shape64{.num_heads = 8,
                               .cache = {.num_kv_heads = 2, .block_size = 16, .head_dim = 64}};
  EXPECT_EQ(LaunchDecodeAttention(shape64, nullptr, nullptr,
                                  {.num_entries = 1, .kernel = DecodeAttentionKernel::kTensorCore},
                                  nullptr)
                .code(),
            absl::StatusCode::kInvalidArgument);
}

// The attention input stage folded into the decode kernel: from the raw q/k/v projection it
// stores exactly the cache and output that LaunchQkvPrepare + LaunchDecodeAttention store (both
// checked against the CPU above): with and without bias, one and several splits, group 4 and 8.
void RunDecodeFromQkvCase(int heads, int kv_heads, const std::vector<int32_t>& contexts,
                          int partition, bool bias, uint32_t seed, KvFormat format = {}) {
  SCOPED_TRACE(::testing::Message() << "heads " << heads << " partition " << partition << " bias "
                                    << bias << " seed " << seed << " fp8 " << format.fp8);
  std::mt19937 rng(seed);
  const int d = 128, bs = 16, entries = static_cast<int>(contexts.size());
  const int width = (heads + 2 * kv_heads) * d;
  const int max_ctx = *std::max_element(contexts.begin(), contexts.end());
  const int max_blocks = (max_ctx + bs - 1) / bs;
  TestCache cache[2] = {TestCache(rng, entries * max_blocks, kv_heads, bs, d, format),
                        TestCache(rng, entries * max_blocks, kv_heads, bs, d, format)};
  // The same starting cache for both paths.
  cache[1].dk = format.fp8 ? Upload(cache[0].k8) : UploadBf16(cache[0].k);
  cache[1].dv = format.fp8 ? Upload(cache[0].v8) : UploadBf16(cache[0].v);
  std::vector<int32_t> tables, q_rows(entries), positions(entries), slots(entries);
  for (int e = 0; e < entries; ++e) {
    for (int b = 0; b < max_blocks; ++b) tables.push_back(e * max_blocks + b);  // disjoint
    const int t = entries - 1 - e;  // rows need not follow entries
    q_rows[e] = t;
    positions[t] = contexts[e] - 1;
    slots[t] = tables[e * max_blocks + positions[t] / bs] * bs + positions[t] % bs;
  }
  std::vector<float> inv_freq = cpu::RopeInvFreq(d, 500000.0);
  const auto qkv = RandomBf16Values(rng, static_cast<size_t>(entries) * width);
  const auto bias_values = RandomBf16Values(rng, width);
  DeviceBuffer dqkv = UploadBf16(qkv), dbias = UploadBf16(bias_values), dpos = Upload(positions),
               dslots = Upload(slots), dinv = Upload(inv_freq), dq, dout[2];
  const size_t q_elems = static_cast<size_t>(entries) * heads * d;
  ASSERT_TRUE(dq.Allocate(q_elems * 2).ok());
  for (DeviceBuffer& out : dout) {
    ASSERT_TRUE(out.Allocate(q_elems * 2).ok());
    Poison(out);
  }
  const DeviceDecodeBatch device_batch(contexts, q_rows, tables, max_blocks, heads, d, partition,
                                       DecodeAttentionKernel::kTensorCore);
  const DecodeBatch& batch = device_batch.batch;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const bf16* b = bias ? dbias.as<bf16>() : nullptr;
  RS_ASSERT_OK(LaunchQkvPrepare({.qkv = dqkv.as<bf16>(),
                                 .bias = b,
                                 .positions = dpos.as<int32_t>(),
                                 .inv_freq = dinv.as<float>(),
                                 .slots = dslots.as<int32_t>(),
                                 .q_out = dq.as<bf16>(),
                                 .cache = cache[0].Layer(),
                                 .num_tokens = entries,
                                 .num_heads = heads},
                                nullptr));
  RS_ASSERT_OK(
      LaunchDecodeAttention({.num_heads = heads, .scale = scale, .cache = cache[0].Layer()},
                            dq.as<bf16>(), dout[0].as<bf16>(), batch, nullptr));
  RS_ASSERT_OK(
      LaunchDecodeAttentionFromQkv({.num_heads = heads, .scale = scale, .cache = cache[1].Layer()},
                                   {.qkv = dqkv.as<bf16>(),
                                    .bias = b,
                                    .positions = dpos.as<int32_t>(),
                                    .slots = dslots.as<int32_t>(),
                                    .inv_freq = dinv.as<float>()},
                                   dout[1].as<bf16>(), batch, nullptr));
  const size_t cache_bytes = cache[0].k.size() * (format.fp8 ? 1 : 2);
  EXPECT_EQ(Download<uint16_t>(dout[1], q_elems), Download<uint16_t>(dout[0], q_elems));
  EXPECT_EQ(Download<uint8_t>(cache[1].dk, cache_bytes),
            Download<uint8_t>(cache[0].dk, cache_bytes));
  EXPECT_EQ(Download<uint8_t>(cache[1].dv, cache_bytes),
            Download<uint8_t>(cache[0].dv, cache_bytes));
}

TEST(CudaDecodeAttentionTest, FromQkvMatchesPrepareThenAttention) {
  RS_SKIP_WITHOUT_GPU();
  if (DevicePlan(128, 32, 8).decode_attention != DecodeAttentionKernel::kTensorCore) {
    GTEST_SKIP() << "no tensor-core decode kernel here";
  }
  const uint32_t seed = std::random_device{}();
  RunDecodeFromQkvCase(32, 8, {1, 17, 160, 600}, kDecodePartition, true, seed);
  RunDecodeFromQkvCase(32, 8, {1, 17, 160, 600}, 64, false, seed + 1);  // the newest key's split
  RunDecodeFromQkvCase(16, 2, {33, 2, 1025}, 32, true, seed + 2);       // group 8
  const absl::Status refused = LaunchDecodeAttentionFromQkv(
      {.num_heads = 4, .cache = {.num_kv_heads = 1, .block_size = 16, .head_dim = 128}}, {},
      nullptr, {.num_entries = 1, .kernel = DecodeAttentionKernel::kTensorCore}, nullptr);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  // Not on the CUDA-core kernel.
  const absl::Status cuda_core = LaunchDecodeAttentionFromQkv(
      {.num_heads = 4, .cache = {.num_kv_heads = 1, .block_size = 16, .head_dim = 128}}, {},
      nullptr, {.num_entries = 1}, nullptr);
  EXPECT_EQ(cuda_core.code(), absl::StatusCode::kInvalidArgument) << cuda_core;
}

// One prefill batch (sequence s: num_tokens[s] queries at positions starts[s]...) in tiles of
// `tile_rows`, against the CPU reference, in total and per sequence.
void RunPrefillCase(const std::vector<int32_t>& num_tokens, const std::vector<int32_t>& starts,
                    int tile_rows, int key_tile, uint32_t seed, int heads = 8, int kv_heads = 2,
                    KvFormat format = {}) {
  SCOPED_TRACE(::testing::Message()
               << "tile_rows " << tile_rows << " key_tile " << key_tile << " heads " << heads
               << " seed " << seed << " fp8 " << format.fp8);
  std::mt19937 rng(seed);
  const int d = 128, bs = 16;
  const int seqs = static_cast<int>(num_tokens.size());
  int max_end = 0;
  for (int s = 0; s < seqs; ++s) max_end = std::max(max_end, starts[s] + num_tokens[s]);
  const int max_blocks = (max_end + bs - 1) / bs;
  TestCache cache(rng, max_blocks + 5, kv_heads, bs, d, format);
  std::vector<int32_t> tables, q_starts(seqs);
  int rows = 0;
  for (int s = 0; s < seqs; ++s) {
    const auto t = RandomTable(rng, cache.num_blocks, max_blocks);
    tables.insert(tables.end(), t.begin(), t.end());
    q_starts[s] = rows;
    rows += num_tokens[s];
  }
  const auto q = RandomBf16Values(rng, static_cast<size_t>(rows) * heads * d);
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  std::vector<float> want(q.size());
  for (int s = 0; s < seqs; ++s) {
    const size_t off = static_cast<size_t>(q_starts[s]) * heads * d;
    cpu::PagedAttention(q.data() + off, num_tokens[s], heads, cache.CpuView(),
                        std::span<const int32_t>(tables.data() + s * max_blocks, max_blocks),
                        starts[s], scale, want.data() + off);
  }
  std::vector<int32_t> tiles;
  MakePrefillTiles(num_tokens, starts, &tiles, tile_rows);
  DeviceBuffer dq = UploadBf16(q), dout, dqs = Upload(q_starts), dnt = Upload(num_tokens),
               dst = Upload(starts), dtables = Upload(tables), dtiles = Upload(tiles);
  ASSERT_TRUE(dout.Allocate(q.size() * 2).ok());
  Poison(dout);
  AttentionShape shape{.num_heads = heads, .scale = scale, .cache = cache.Layer()};
  PrefillBatch batch{.q_starts = dqs.as<int32_t>(),
                     .num_tokens = dnt.as<int32_t>(),
                     .start_positions = dst.as<int32_t>(),
                     .block_tables = dtables.as<int32_t>(),
                     .max_blocks = max_blocks,
                     .tiles = dtiles.as<int32_t>(),
                     .num_tiles = static_cast<int>(tiles.size() / 2),
                     .tile_rows = tile_rows,
                     .key_tile = key_tile};
  RS_ASSERT_OK(LaunchPrefillAttention(shape, dq.as<bf16>(), dout.as<bf16>(), batch, nullptr));
  const auto got = DownloadBf16(dout, q.size());
  EXPECT_LT(RelL2(got, want), 2e-2);
  // Per sequence too, so a wrong chunk cannot hide in the total.
  for (int s = 0; s < seqs; ++s) {
    const size_t off = static_cast<size_t>(q_starts[s]) * heads * d;
    const size_t n = static_cast<size_t>(num_tokens[s]) * heads * d;
    EXPECT_LT(RelL2(std::vector<float>(got.begin() + off, got.begin() + off + n),
                    std::vector<float>(want.begin() + off, want.begin() + off + n)),
              2e-2)
        << "seq " << s;
  }
}

// Every tile size the device runs: 64 (mma.sync) everywhere, 128 (wgmma) where the selector
// picks it (compute capability 9.0 and a build with the sm_90a kernel).
std::vector<int> TileSizesToTest() {
  std::vector<int> sizes = {kPrefillTile};
  if (DevicePlan(128, 8, 2).prefill_tile_rows == kPrefillTileSm90) {
    sizes.push_back(kPrefillTileSm90);
  }
  return sizes;
}

TEST(CudaPrefillAttentionTest, MatchesCpuOnVariableLengthChunksOverPagedCache) {
  RS_SKIP_WITHOUT_GPU();
  const uint32_t seed = std::random_device{}();
  for (int tile_rows : TileSizesToTest()) {
    // The wgmma kernel with both its K/V tile sizes.
    for (int key_tile : {128, 64}) {
      if (tile_rows != kPrefillTileSm90 && key_tile != 128) continue;
      // Partial tiles, a one-token chunk, chunks after a cached prefix (keys span many tiles).
      RunPrefillCase({100, 64, 1, 130, 7}, {0, 37, 200, 1000, 63}, tile_rows, key_tile, seed);
      // Whole query tiles and one past, from position 0 and from an unaligned prefix.
      RunPrefillCase({384, 129, 256}, {0, 0, 77}, tile_rows, key_tile, seed + 1);
      // GLM-4.5's 12 query heads per kv head.
      RunPrefillCase({100, 7}, {0, 63}, tile_rows, key_tile, seed + 2, 24, 2);
    }
  }
}

// Host side, no GPU needed: every query of every chunk lies in exactly one tile, tiles start at
// multiples of tile_rows, and tiles with more keys come first.
TEST(CudaPrefillAttentionTest, TilesCoverEveryQueryOnceLongestFirst) {
  const std::vector<int32_t> num_tokens = {300, 1, 128, 129, 64};
  const std::vector<int32_t> starts = {0, 5000, 77, 0, 1000};
  for (int tile_rows : {kPrefillTile, kPrefillTileSm90}) {
    SCOPED_TRACE(::testing::Message() << "tile_rows " << tile_rows);
    std::vector<int32_t> tiles;
    MakePrefillTiles(num_tokens, starts, &tiles, tile_rows);
    ASSERT_EQ(tiles.size() % 2, 0u);
    int total = 0;
    for (int32_t n : num_tokens) total += n;
    EXPECT_LE(static_cast<int>(tiles.size() / 2),
              total / kPrefillTile + static_cast<int>(num_tokens.size()));
    std::vector<std::vector<int>> covered(num_tokens.size());
    for (size_t s = 0; s < num_tokens.size(); ++s) covered[s].assign(num_tokens[s], 0);
    int64_t last_keys = INT64_MAX;
    for (size_t t = 0; t < tiles.size(); t += 2) {
      const int seq = tiles[t];
      const int q0 = tiles[t + 1];
      ASSERT_GE(seq, 0);
      ASSERT_LT(seq, static_cast<int>(num_tokens.size()));
      EXPECT_EQ(q0 % tile_rows, 0);
      const int nq = std::min(tile_rows, num_tokens[seq] - q0);
      ASSERT_GT(nq, 0);
      for (int i = 0; i < nq; ++i) ++covered[seq][q0 + i];
      const int64_t keys = starts[seq] + q0 + nq;
      EXPECT_LE(keys, last_keys);
      last_keys = keys;
    }
    for (size_t s = 0; s < num_tokens.size(); ++s) {
      for (int i = 0; i < num_tokens[s]; ++i)
        EXPECT_EQ(covered[s][i], 1) << "seq " << s << " q " << i;
    }
  }
}

TEST(CudaPrefillAttentionTest, RefusesUnknownTileSizes) {
  RS_SKIP_WITHOUT_GPU();
  PrefillBatch batch{.num_tiles = 1, .tile_rows = 96};
  const AttentionShape shape{.num_heads = 8,
                             .scale = 0.1f,
                             .cache = {.num_kv_heads = 2, .block_size = 16, .head_dim = 128}};
  const absl::Status status = LaunchPrefillAttention(shape, nullptr, nullptr, batch, nullptr);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(std::string(status.message()).find("tile_rows"), std::string::npos) << status;
  batch.tile_rows = kPrefillTileSm90;
  if (!CompiledKernelsOfThisBuild().sm90a_prefill) {
    // No wgmma kernel in this build.
    EXPECT_EQ(LaunchPrefillAttention(shape, nullptr, nullptr, batch, nullptr).code(),
              absl::StatusCode::kInvalidArgument);
  } else {
    batch.key_tile = 96;
    const absl::Status key_tile = LaunchPrefillAttention(shape, nullptr, nullptr, batch, nullptr);
    EXPECT_EQ(key_tile.code(), absl::StatusCode::kInvalidArgument) << key_tile;
    EXPECT_NE(std::string(key_tile.message()).find("key_tile"), std::string::npos) << key_tile;
  }
}

}  // namespace
}  // namespace ringserve::cuda

namespace ringserve::cuda {
namespace {

// An fp8 (e4m3) cache with per-layer scales, against the CPU reference reading the same codes
// (so the tolerances are the bf16 cache's): decode on both kernels, with sinks and a sliding
// window, the fused input stage, and prefill on every tile size.
TEST(CudaFp8KvCacheTest, DecodeMatchesCpuOnTheSameCodes) {
  RS_SKIP_WITHOUT_GPU();
  const uint32_t seed = std::random_device{}();
  const KernelOptions cuda_core{.decode_attention_tensor_cores = false};
  // Head dim 128: the tensor-core kernel (where the device has it), then the CUDA-core one.
  RunDecodeCase(128, 32, 8, {1, 17, 64, 65, 600, 2000}, seed, kDecodePartition, {}, 0, false,
                kFp8Scaled);
  RunDecodeCase(128, 16, 2, {5, 600, 33}, seed + 1, 64, {}, 0, false, kFp8Scaled);
  RunDecodeCase(128, 32, 8, {1, 200, 513}, seed + 2, 256, cuda_core, 0, false, kFp8Scaled);
  RunDecodeCase(64, 8, 2, {3, 130, 700, 1100}, seed + 3, 256, cuda_core, 128, true, kFp8Scaled);
  RunDecodeCase(8, 4, 2, {1, 5, 40}, seed + 4, kDecodePartition, cuda_core, 0, false,
                {.fp8 = true});
}

TEST(CudaFp8KvCacheTest, FromQkvMatchesPrepareThenAttention) {
  RS_SKIP_WITHOUT_GPU();
  if (DevicePlan(128, 32, 8).decode_attention != DecodeAttentionKernel::kTensorCore) {
    GTEST_SKIP() << "no tensor-core decode kernel here";
  }
  const uint32_t seed = std::random_device{}();
  RunDecodeFromQkvCase(32, 8, {1, 17, 160, 600}, kDecodePartition, true, seed, kFp8Scaled);
  RunDecodeFromQkvCase(16, 2, {33, 2, 1025}, 32, false, seed + 1, kFp8Scaled);
}

TEST(CudaFp8KvCacheTest, PrefillMatchesCpuOnTheSameCodes) {
  RS_SKIP_WITHOUT_GPU();
  const uint32_t seed = std::random_device{}();
  for (int tile_rows : TileSizesToTest()) {
    for (int key_tile : {128, 64}) {
      if (tile_rows != kPrefillTileSm90 && key_tile != 128) continue;
      RunPrefillCase({100, 64, 1, 130, 7}, {0, 37, 200, 1000, 63}, tile_rows, key_tile, seed, 8, 2,
                     kFp8Scaled);
      RunPrefillCase({384, 129, 256}, {0, 0, 77}, tile_rows, key_tile, seed + 1, 8, 2, kFp8Scaled);
    }
  }
}

// The QKV prepare stores e4m3(x / scale) of what it stores in a bf16 cache: each decoded code
// is within e4m3's rounding (half a step: 2^-4 relative, 2^-10 scale below the normals) of the
// bf16 value, and slots < 0 are skipped.
TEST(CudaFp8KvCacheTest, QkvPrepareStoresScaledE4m3) {
  RS_SKIP_WITHOUT_GPU();
  std::mt19937 rng(31);
  const int tokens = 5, heads = 8, kv_heads = 2, d = 128, bs = 4, blocks = 3;
  const int width = (heads + 2 * kv_heads) * d;
  const auto qkv = RandomBf16Values(rng, static_cast<size_t>(tokens) * width, 3.0f);
  std::vector<int32_t> positions(tokens), slots(tokens);
  for (int t = 0; t < tokens; ++t) {
    positions[t] = 11 * t + 3;
    slots[t] = t == 2 ? -1 : (5 * t + 1) % (blocks * bs);
  }
  const std::vector<float> inv_freq = cpu::RopeInvFreq(d, 10000.0);
  DeviceBuffer dqkv = UploadBf16(qkv), dpos = Upload(positions), dslots = Upload(slots),
               dinv = Upload(inv_freq), dq, k16, v16, k8, v8;
  const size_t cache_elems = static_cast<size_t>(blocks) * kv_heads * bs * d;
  ASSERT_TRUE(dq.Allocate(static_cast<size_t>(tokens) * heads * d * 2).ok());
  ASSERT_TRUE(k16.Allocate(cache_elems * 2).ok());
  ASSERT_TRUE(v16.Allocate(cache_elems * 2).ok());
  ASSERT_TRUE(k8.Allocate(cache_elems).ok());
  ASSERT_TRUE(v8.Allocate(cache_elems).ok());
  for (DeviceBuffer* b : {&k16, &v16, &k8, &v8}) {
    ASSERT_EQ(cudaMemset(b->get(), 0, b->bytes()), cudaSuccess);
  }
  const float k_scale = 0.25f, v_scale = 0.0625f;
  const KvCacheLayer layers[2] = {{k16.as<bf16>(), v16.as<bf16>(), kv_heads, bs, d},
                                  {.num_kv_heads = kv_heads,
                                   .block_size = bs,
                                   .head_dim = d,
                                   .k8 = k8.as<uint8_t>(),
                                   .v8 = v8.as<uint8_t>(),
                                   .k_scale = k_scale,
                                   .v_scale = v_scale}};
  for (const KvCacheLayer& layer : layers) {
    RS_ASSERT_OK(LaunchQkvPrepare({.qkv = dqkv.as<bf16>(),
                                   .positions = dpos.as<int32_t>(),
                                   .inv_freq = dinv.as<float>(),
                                   .slots = dslots.as<int32_t>(),
                                   .q_out = dq.as<bf16>(),
                                   .cache = layer,
                                   .num_tokens = tokens,
                                   .num_heads = heads},
                                  nullptr));
  }
  const auto ref_k = DownloadBf16(k16, cache_elems), ref_v = DownloadBf16(v16, cache_elems);
  const auto codes_k = Download<uint8_t>(k8, cache_elems);
  const auto codes_v = Download<uint8_t>(v8, cache_elems);
  int nonzero = 0;
  for (size_t i = 0; i < cache_elems; ++i) {
    for (const auto& [ref, code, scale] :
         {std::tuple{ref_k[i], codes_k[i], k_scale}, std::tuple{ref_v[i], codes_v[i], v_scale}}) {
      const float got = Fp8E4M3ToFloat(code) * scale;
      const float bound = std::fabs(ref) * (0.0625f + 0.008f) + scale * std::ldexp(1.0f, -10);
      ASSERT_LE(std::fabs(got - ref), bound) << "element " << i << " ref " << ref;
      nonzero += ref != 0.0f;
      if (ref == 0.0f) {
        EXPECT_EQ(code, 0) << "element " << i;  // unwritten (slot -1) stays 0
      }
    }
  }
  EXPECT_GT(nonzero, 2000);  // 4 slots x 2 heads x 128 values of K and of V written
}

}  // namespace
}  // namespace ringserve::cuda
