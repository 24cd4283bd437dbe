#include "stage/model/cpu_mla_attention.h"

#include <cmath>
#include <numeric>
#include <random>

#include "gtest/gtest.h"
#include "ring/model_config.h"

namespace ringserve {
namespace {

// A DeepSeek-V3-shaped layer in miniature: q low-rank, YaRN, v_head_dim != qk_nope_head_dim.
ModelConfig TinyConfig(bool q_lora, bool interleave) {
  const std::string json = R"({
    "architectures": ["DeepseekV3ForCausalLM"], "hidden_size": 32, "intermediate_size": 48,
    "num_hidden_layers": 2, "num_attention_heads": 3, "vocab_size": 64,
    "max_position_embeddings": 256, "kv_lora_rank": 12, "qk_nope_head_dim": 6,
    "qk_rope_head_dim": 8, "v_head_dim": 10, "first_k_dense_replace": 2,
    "q_lora_rank": )" + std::string(q_lora ? "16" : "null") +
                           R"(, "rope_interleave": )" + (interleave ? "true" : "false") + R"(,
    "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
                     "mscale": 0.9, "mscale_all_dim": 1.0}, "rope_theta": 10000.0
  })";
  auto config = ParseModelConfig(json, "tiny.json");
  EXPECT_TRUE(config.ok()) << config.status();
  return *config;
}

std::vector<float> Random(std::mt19937& rng, size_t n, float scale, float offset = 0) {
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = offset + dist(rng);
  return v;
}

MlaWeights RandomWeights(const ModelConfig& c, uint32_t seed) {
  std::mt19937 rng(seed);
  const MlaConfig& m = *c.mla;
  const size_t hidden = c.hidden_size, heads = c.num_heads;
  MlaWeights w;
  if (m.q_lora_rank > 0) {
    w.q_a_w = Random(rng, m.q_lora_rank * hidden, 0.2f);
    w.q_a_norm = Random(rng, m.q_lora_rank, 0.1f, 1.0f);
    w.q_b_w = Random(rng, heads * m.qk_head_dim() * m.q_lora_rank, 0.2f);
  } else {
    w.q_w = Random(rng, heads * m.qk_head_dim() * hidden, 0.2f);
  }
  w.kv_a_w = Random(rng, m.latent_cache_dim() * hidden, 0.2f);
  w.kv_a_norm = Random(rng, m.kv_lora_rank, 0.1f, 1.0f);
  w.kv_b_w = Random(rng, heads * (m.qk_nope_head_dim + m.v_head_dim) * m.kv_lora_rank, 0.2f);
  w.o_w = Random(rng, hidden * heads * m.v_head_dim, 0.2f);
  return w;
}

struct MlaRun {
  std::vector<float> out;    // [tokens, hidden], all chunks in order
  std::vector<float> cache;  // the whole pool afterwards
};

// Runs `chunk_sizes` consecutive chunks of one sequence (block table 3, 0, 2) over h.
MlaRun RunChunks(const ModelConfig& c, const MlaWeights& w, const std::vector<float>& h,
                 const std::vector<int>& chunk_sizes, std::optional<MlaPath> path) {
  LatentKvCache cache({.num_layers = 1,
                       .num_blocks = 4,
                       .block_size = 8,
                       .latent_dim = c.mla->kv_lora_rank,
                       .rope_dim = c.mla->qk_rope_head_dim});
  const std::vector<float> inv_freq = RopeInverseFrequencies(c.rope, c.head_dim);
  MlaRun run;
  int32_t start = 0;
  for (int n : chunk_sizes) {
    const std::vector<SequenceChunk> chunks = {
        {.seq_id = 1, .start_position = start, .num_tokens = n, .block_table = {3, 0, 2}}};
    std::vector<int32_t> positions(n);
    std::iota(positions.begin(), positions.end(), start);
    std::vector<float> out(n * c.hidden_size);
    MlaAttention({.config = &c,
                  .weights = &w,
                  .chunks = chunks,
                  .positions = positions.data(),
                  .inv_freq = inv_freq.data(),
                  .kv = cache.Layer(0),
                  .path = path},
                 h.data() + start * c.hidden_size, out.data());
    run.out.insert(run.out.end(), out.begin(), out.end());
    start += n;
  }
  run.cache.assign(cache.data().begin(), cache.data().end());
  return run;
}

float MaxRelDiff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  float diff = 0, ref = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::abs(a[i] - b[i]));
    ref = std::max(ref, std::abs(b[i]));
  }
  return diff / ref;
}

class MlaAttentionTest : public ::testing::TestWithParam<std::tuple<bool, bool>> {};

TEST_P(MlaAttentionTest, AbsorbedAndExpandedPathsAgree) {
  const auto [q_lora, interleave] = GetParam();
  const ModelConfig c = TinyConfig(q_lora, interleave);
  const MlaWeights w = RandomWeights(c, 7);
  std::mt19937 rng(11);
  const std::vector<float> h = Random(rng, 20 * c.hidden_size, 1.0f);
  const MlaRun absorbed = RunChunks(c, w, h, {20}, MlaPath::kAbsorbed);
  const MlaRun expanded = RunChunks(c, w, h, {20}, MlaPath::kExpanded);
  EXPECT_LT(MaxRelDiff(absorbed.out, expanded.out), 1e-5f);
  EXPECT_EQ(absorbed.cache, expanded.cache);  // the same rows written either way
}

TEST_P(MlaAttentionTest, ChunkedPrefillAndDecodeOverTheCacheEqualOneShot) {
  const auto [q_lora, interleave] = GetParam();
  const ModelConfig c = TinyConfig(q_lora, interleave);
  const MlaWeights w = RandomWeights(c, 8);
  std::mt19937 rng(12);
  const std::vector<float> h = Random(rng, 21 * c.hidden_size, 1.0f);
  const MlaRun one_shot = RunChunks(c, w, h, {21}, std::nullopt);
  // Chunks of 9 (expanded), 3 (absorbed), then single-token decodes, all over the cache.
  const MlaRun chunked = RunChunks(c, w, h, {9, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1}, std::nullopt);
  EXPECT_LT(MaxRelDiff(chunked.out, one_shot.out), 1e-5f);
  EXPECT_EQ(chunked.cache, one_shot.cache);
}

INSTANTIATE_TEST_SUITE_P(Layouts, MlaAttentionTest,
                         ::testing::Combine(::testing::Bool(), ::testing::Bool()),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param) ? "QLora" : "QProj") +
                                  (std::get<1>(info.param) ? "Interleaved" : "HalfSplit");
                         });

TEST(MlaAttentionTest, CacheHoldsOnlyTheLatentAndTheRopeKeyOfWrittenPositions) {
  const ModelConfig c = TinyConfig(true, true);
  const MlaWeights w = RandomWeights(c, 9);
  std::mt19937 rng(13);
  const std::vector<float> h = Random(rng, 5 * c.hidden_size, 1.0f);
  const MlaRun run = RunChunks(c, w, h, {5}, std::nullopt);
  const int row = c.mla->kv_lora_rank + c.mla->qk_rope_head_dim;
  ASSERT_EQ(run.cache.size(), static_cast<size_t>(4 * 8 * row));  // 4 blocks x 8 positions
  // Positions 0..4 live in block 3 (the table's first entry); nothing else was written.
  for (size_t i = 0; i < run.cache.size(); ++i) {
    const bool written =
        i >= static_cast<size_t>(3 * 8 * row) && i < static_cast<size_t>((3 * 8 + 5) * row);
    if (!written) {
      ASSERT_EQ(run.cache[i], 0.0f) << "float " << i;
    }
  }
  // The latent part of each row is RMS-normalized (times kv_a_layernorm's weight).
  for (int p = 0; p < 5; ++p) {
    const float* latent = run.cache.data() + (3 * 8 + p) * row;
    double sum = 0;
    for (int i = 0; i < c.mla->kv_lora_rank; ++i) {
      const double unweighted = latent[i] / w.kv_a_norm[i];
      sum += unweighted * unweighted;
    }
    EXPECT_NEAR(sum / c.mla->kv_lora_rank, 1.0, 1e-3) << "position " << p;
  }
  LatentKvCache cache(
      {.num_layers = 3, .num_blocks = 2, .block_size = 16, .latent_dim = 512, .rope_dim = 64});
  EXPECT_EQ(cache.bytes_per_token_layer(), 576 * 4);  // DeepSeek-V3: 1,152 bytes in bf16
  EXPECT_EQ(cache.bytes(), 2 * 3 * 16 * 576 * 4);
}

TEST(MlaAttentionTest, RopeLayoutsGiveTheSameScoresAndScaleByTheFactor) {
  std::mt19937 rng(3);
  const std::vector<float> inv_freq = {1.0f, 0.3f, 0.05f, 0.01f};
  std::vector<float> q = Random(rng, 8, 1.0f), k = Random(rng, 8, 1.0f);
  // The half-split layout of the same pairs: (2i, 2i+1) -> (i, i + 4).
  auto split = [](const std::vector<float>& x) {
    std::vector<float> y(8);
    for (int i = 0; i < 4; ++i) {
      y[i] = x[2 * i];
      y[i + 4] = x[2 * i + 1];
    }
    return y;
  };
  std::vector<float> qs = split(q), ks = split(k);
  RotateMlaRope(q.data(), 8, 17, inv_freq.data(), 0.5f, true);
  RotateMlaRope(k.data(), 8, 5, inv_freq.data(), 0.5f, true);
  RotateMlaRope(qs.data(), 8, 17, inv_freq.data(), 0.5f, false);
  RotateMlaRope(ks.data(), 8, 5, inv_freq.data(), 0.5f, false);
  EXPECT_EQ(split(q), qs);
  float dot = 0, dot_split = 0;
  for (int i = 0; i < 8; ++i) {
    dot += q[i] * k[i];
    dot_split += qs[i] * ks[i];
  }
  EXPECT_NEAR(dot, dot_split, 1e-6f);
  std::vector<float> x = {3.0f, 4.0f, 0, 0, 0, 0, 0, 0};
  RotateMlaRope(x.data(), 8, 2, inv_freq.data(), 0.5f, true);
  EXPECT_NEAR(std::hypot(x[0], x[1]), 2.5f, 1e-6f);  // |(3, 4)| = 5, times the factor
}

TEST(MlaAttentionTest, SelectsAbsorbedForFewQueryTokens) {
  EXPECT_EQ(SelectMlaPath(1), MlaPath::kAbsorbed);
  EXPECT_EQ(SelectMlaPath(kMlaAbsorbedMaxTokens), MlaPath::kAbsorbed);
  EXPECT_EQ(SelectMlaPath(kMlaAbsorbedMaxTokens + 1), MlaPath::kExpanded);
}

}  // namespace
}  // namespace ringserve
