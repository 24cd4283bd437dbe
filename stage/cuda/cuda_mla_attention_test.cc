// The CUDA MLA layer (cuda_mla_attention.h) against the CPU reference (cpu_mla_attention.h) on
// random bf16-rounded weights at DeepSeek's latent sizes (kv_lora_rank 512, rope 64, nope 128,
// v 128; 4 heads, hidden 256), with and without q low-rank: two sequences prefilled in one step
// (the second in two chunks across steps), then decoded over their compressed caches. Tolerance
// (relative L2 of the layer output) 3e-2: bf16 activations and probabilities against fp32.
#include "stage/cuda/cuda_mla_attention.h"

#include <random>

#include "gtest/gtest.h"
#include "kernels/cuda/test_util.h"
#include "stage/model/cpu_mla_attention.h"
#include "stage/model/latent_kv_cache.h"

namespace ringserve::cuda {
namespace {

using testing::DownloadBf16;
using testing::RandomBf16Values;
using testing::RelL2;
using testing::Upload;
using testing::UploadBf16;

ModelConfig MlaTestConfig(int q_lora_rank) {
  ModelConfig c;
  c.architecture = Architecture::kDeepseekV3;
  c.hidden_size = 256;
  c.num_heads = 4;
  c.num_kv_heads = 4;
  c.head_dim = 64;
  c.max_position_embeddings = 4096;
  MlaConfig m;
  m.q_lora_rank = q_lora_rank;
  m.kv_lora_rank = 512;
  m.qk_nope_head_dim = 128;
  m.qk_rope_head_dim = 64;
  m.v_head_dim = 128;
  m.rope_interleave = true;
  m.softmax_scale = 1.1 / std::sqrt(192.0);
  m.rope_attention_factor = 0.95;
  c.mla = m;
  return c;
}

struct Step {
  std::vector<SequenceChunk> chunks;
};

class CudaMlaAttentionTest : public ::testing::TestWithParam<int> {};  // q_lora_rank

TEST_P(CudaMlaAttentionTest, PrefillChunksAndDecodesMatchTheCpuReference) {
  RS_SKIP_WITHOUT_GPU();
  const ModelConfig config = MlaTestConfig(GetParam());
  const MlaConfig& m = *config.mla;
  const int hidden = config.hidden_size, heads = config.num_heads;
  std::mt19937 rng(3);
  auto weight = [&](int64_t rows, int64_t cols) {
    return RandomBf16Values(rng, rows * cols, 1.0f / std::sqrt(static_cast<float>(cols)));
  };
  auto norm = [&](int64_t n) {
    std::vector<float> v = RandomBf16Values(rng, n, 0.1f);
    for (float& x : v) x = BF16ToFloat(FloatToBF16(x + 1.0f));
    return v;
  };
  MlaWeights cw;
  if (m.q_lora_rank > 0) {
    cw.q_a_w = weight(m.q_lora_rank, hidden);
    cw.q_a_norm = norm(m.q_lora_rank);
    cw.q_b_w = weight(heads * m.qk_head_dim(), m.q_lora_rank);
  } else {
    cw.q_w = weight(heads * m.qk_head_dim(), hidden);
  }
  cw.kv_a_w = weight(m.latent_cache_dim(), hidden);
  cw.kv_a_norm = norm(m.kv_lora_rank);
  cw.kv_b_w = weight(heads * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank);
  cw.o_w = weight(hidden, heads * m.v_head_dim);
  DeviceBuffer d_q_a = UploadBf16(cw.q_a_w), d_q_a_norm = UploadBf16(cw.q_a_norm),
               d_q_b = UploadBf16(cw.q_b_w), d_q = UploadBf16(cw.q_w),
               d_kv_a = UploadBf16(cw.kv_a_w), d_kv_a_norm = UploadBf16(cw.kv_a_norm),
               d_kv_b = UploadBf16(cw.kv_b_w), d_o = UploadBf16(cw.o_w);
  auto ptr = [](const DeviceBuffer& b, const std::vector<float>& host) {
    return host.empty() ? nullptr : static_cast<const bf16*>(b.get());
  };
  const CudaMlaWeights gw{.q_a = ptr(d_q_a, cw.q_a_w),
                          .q_a_norm = ptr(d_q_a_norm, cw.q_a_norm),
                          .q_b = ptr(d_q_b, cw.q_b_w),
                          .q = ptr(d_q, cw.q_w),
                          .kv_a = ptr(d_kv_a, cw.kv_a_w),
                          .kv_a_norm = ptr(d_kv_a_norm, cw.kv_a_norm),
                          .kv_b = ptr(d_kv_b, cw.kv_b_w),
                          .o = ptr(d_o, cw.o_w)};

  const int block_size = 16, num_blocks = 8;
  LatentKvCache cpu_cache({.num_layers = 1,
                           .num_blocks = num_blocks,
                           .block_size = block_size,
                           .latent_dim = m.kv_lora_rank,
                           .rope_dim = m.qk_rope_head_dim});
  DeviceBuffer d_cache;
  ASSERT_TRUE(d_cache.Allocate(int64_t{num_blocks} * block_size * kMlaRowDim * 2).ok());
  const MlaCacheLayer gpu_cache{.data = static_cast<bf16*>(d_cache.get()),
                                .block_stride = block_size * kMlaRowDim,
                                .block_size = block_size};
  const std::vector<float> inv_freq = RopeInverseFrequencies(config.rope, m.qk_rope_head_dim);
  DeviceBuffer d_freq = Upload(inv_freq);
  auto attention = CudaMlaAttention::Create(config, 64, 132);
  ASSERT_TRUE(attention.ok()) << attention.status();
  auto gemm = GemmRunner::Create({.tune = false});
  ASSERT_TRUE(gemm.ok()) << gemm.status();

  // Sequence 0: blocks {3, 5}, 21 tokens at once then decodes; sequence 1: block {1}, 5 then 4
  // tokens (a chunk over the first chunk's cache), then decodes.
  const std::vector<std::vector<int32_t>> tables = {{3, 5}, {1, 0}};
  const std::vector<Step> steps = {
      {{{.seq_id = 0, .start_position = 0, .num_tokens = 21, .block_table = tables[0]},
        {.seq_id = 1, .start_position = 0, .num_tokens = 5, .block_table = tables[1]}}},
      {{{.seq_id = 1, .start_position = 5, .num_tokens = 4, .block_table = tables[1]},
        {.seq_id = 0, .start_position = 21, .num_tokens = 1, .block_table = tables[0]}}},
      {{{.seq_id = 0, .start_position = 22, .num_tokens = 1, .block_table = tables[0]},
        {.seq_id = 1, .start_position = 9, .num_tokens = 1, .block_table = tables[1]}}},
  };
  std::vector<int32_t> flat_tables;
  for (const auto& t : tables) flat_tables.insert(flat_tables.end(), t.begin(), t.end());
  DeviceBuffer d_tables = Upload(flat_tables);
  for (size_t s = 0; s < steps.size(); ++s) {
    std::vector<int32_t> positions, slots, context_lens, table_rows;
    int max_context = 0;
    for (const SequenceChunk& c : steps[s].chunks) {
      for (int32_t i = 0; i < c.num_tokens; ++i) {
        const int32_t p = c.start_position + i;
        positions.push_back(p);
        slots.push_back(c.block_table[p / block_size] * block_size + p % block_size);
        context_lens.push_back(p + 1);
        table_rows.push_back(static_cast<int32_t>(c.seq_id));
        max_context = std::max(max_context, p + 1);
      }
    }
    const int n = static_cast<int>(positions.size());
    const std::vector<float> h = RandomBf16Values(rng, static_cast<size_t>(n) * hidden);
    std::vector<float> want(static_cast<size_t>(n) * hidden);
    MlaAttention({.config = &config,
                  .weights = &cw,
                  .chunks = steps[s].chunks,
                  .positions = positions.data(),
                  .inv_freq = inv_freq.data(),
                  .kv = cpu_cache.Layer(0),
                  .path = std::nullopt},
                 h.data(), want.data());

    DeviceBuffer d_h = UploadBf16(h), d_out, d_pos = Upload(positions), d_slots = Upload(slots),
                 d_ctx = Upload(context_lens), d_rows = Upload(table_rows);
    ASSERT_TRUE(d_out.Allocate(static_cast<int64_t>(n) * hidden * 2).ok());
    RS_ASSERT_OK((*attention)
                     ->Forward(gw, gpu_cache,
                               {.positions = static_cast<const int32_t*>(d_pos.get()),
                                .slots = static_cast<const int32_t*>(d_slots.get()),
                                .context_lens = static_cast<const int32_t*>(d_ctx.get()),
                                .table_rows = static_cast<const int32_t*>(d_rows.get()),
                                .block_tables = static_cast<const int32_t*>(d_tables.get()),
                                .max_blocks = 2,
                                .num_tokens = n,
                                .max_context = max_context},
                               static_cast<const float*>(d_freq.get()),
                               static_cast<const bf16*>(d_h.get()), static_cast<bf16*>(d_out.get()),
                               **gemm, nullptr));
    EXPECT_LT(RelL2(DownloadBf16(d_out, want.size()), want), 3e-2) << "step " << s;
  }
}

INSTANTIATE_TEST_SUITE_P(QLowRank, CudaMlaAttentionTest, ::testing::Values(0, 128),
                         [](const auto& info) {
                           return info.param > 0 ? std::string("QLowRank") : std::string("QProj");
                         });

TEST(CudaMlaAttentionCreateTest, RefusesShapesItDoesNotRun) {
  ModelConfig c = MlaTestConfig(0);
  c.mla->kv_lora_rank = 16;
  auto a = CudaMlaAttention::Create(c, 8, 132);
  ASSERT_FALSE(a.ok());
  EXPECT_NE(std::string(a.status().message()).find("kv_lora_rank 16"), std::string::npos);
  c = MlaTestConfig(0);
  c.mla->attention_bias = true;
  EXPECT_FALSE(CudaMlaAttention::Create(c, 8, 132).ok());
}

}  // namespace
}  // namespace ringserve::cuda
