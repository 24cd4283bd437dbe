// Conformance of the CPU model slice with Hugging Face transformers on the golden fixtures
// (tests/fixtures/models/<arch>, written by scripts/make_fixtures.py).
//
// Tolerance (fp32 vs fp32): per prompt, max|ours - transformers| <= 1e-4 * max|transformers| +
// 1e-5 over all logits compared; greedy continuations must match token for token.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <numeric>
#include <random>

#include "common/status_macros.h"
#include "fmt/format.h"
#include "gtest/gtest.h"
#include "ring/model_config.h"
#include "stage/model/model_slice.h"
#include "stage/model/safetensors.h"
#include "stage/model/slice_weights.h"
#include "stage/model/testing/safetensors_writer.h"
#include "tests/golden/golden_fixture.h"

namespace ringserve::golden {
namespace {

constexpr int kBlockSize = 4;  // sequences of 5..43 tokens span 2..11 blocks
constexpr int kNumBlocks = 64;

// Slices chained by hand, as the ring does: hidden states of one feed the next.
struct Chain {
  std::vector<std::unique_ptr<ModelSlice>> slices;

  absl::StatusOr<std::vector<float>> Forward(const MicroBatch& batch) {
    std::vector<float> hidden;
    for (auto& slice : slices) {
      RS_ASSIGN_OR_RETURN(hidden, slice->Forward(batch, hidden));
    }
    return hidden;
  }
};

// `num_slices` contiguous slices covering every layer (one a layer when the model has fewer).
absl::StatusOr<Chain> LoadChain(const std::string& dir, int num_slices) {
  RS_ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(dir));
  num_slices = std::min(num_slices, config.num_layers);
  Chain chain;
  int first = 0;
  for (int s = 0; s < num_slices; ++s) {
    const int last = (s + 1) * config.num_layers / num_slices;
    RS_ASSIGN_OR_RETURN(auto slice, ModelSlice::LoadCpu({.model_dir = dir,
                                                         .layers = {first, last},
                                                         .kv_block_size = kBlockSize,
                                                         .kv_num_blocks = kNumBlocks}));
    chain.slices.push_back(std::move(slice));
    first = last;
  }
  return chain;
}

// Scattered, out-of-order block tables: sequence i gets blocks perm[i * per_seq ...].
std::vector<std::vector<int32_t>> BlockTables(int num_seqs, int per_seq, uint32_t seed) {
  std::vector<int32_t> perm(kNumBlocks);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937(seed));
  std::vector<std::vector<int32_t>> tables;
  for (int i = 0; i < num_seqs; ++i) {
    tables.emplace_back(perm.begin() + i * per_seq, perm.begin() + (i + 1) * per_seq);
  }
  return tables;
}

SequenceChunk Chunk(uint64_t seq, int32_t start, int32_t n, const std::vector<int32_t>& table,
                    LogitsMode mode) {
  return {.seq_id = seq,
          .start_position = start,
          .num_tokens = n,
          .block_table = table,
          .logits = mode};
}

class GoldenTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    dir_ = FixtureDir(GetParam());
    auto fixture = LoadGoldenFixture(dir_);
    ASSERT_TRUE(fixture.ok()) << fixture.status();
    fixture_ = *std::move(fixture);
    ASSERT_GE(fixture_.prompts.size(), 3u);
  }

  // All prompts in one micro-batch, logits for every position; checks against transformers.
  std::vector<float> RunAllPositions(Chain& chain) {
    MicroBatch batch;
    const auto tables = BlockTables(static_cast<int>(fixture_.prompts.size()), 16, 42);
    for (size_t i = 0; i < fixture_.prompts.size(); ++i) {
      const auto& ids = fixture_.prompts[i].token_ids;
      batch.chunks.push_back(
          Chunk(i, 0, static_cast<int32_t>(ids.size()), tables[i], LogitsMode::kAllTokens));
      batch.token_ids.insert(batch.token_ids.end(), ids.begin(), ids.end());
    }
    auto logits = chain.Forward(batch);
    EXPECT_TRUE(logits.ok()) << logits.status();
    return logits.ok() ? *logits : std::vector<float>();
  }

  // Compares the all-positions logits of every prompt; returns the worst relative error.
  float ExpectMatchesGolden(const std::vector<float>& logits, const std::string& what) {
    const int64_t vocab = fixture_.vocab_size;
    int64_t row = 0;
    float worst = 0;
    for (size_t i = 0; i < fixture_.prompts.size(); ++i) {
      const GoldenPrompt& p = fixture_.prompts[i];
      const int64_t rows = static_cast<int64_t>(p.token_ids.size());
      if (static_cast<int64_t>(logits.size()) < (row + rows) * vocab) {
        ADD_FAILURE() << what << ": too few logits";
        return INFINITY;
      }
      const Diff d = Compare(std::span(logits).subspan(row * vocab, rows * vocab), p.logits);
      EXPECT_TRUE(WithinTolerance(d)) << what << " prompt " << i << ": max|diff| " << d.max_abs_diff
                                      << " vs max|ref| " << d.max_abs_ref;
      worst = std::max(worst, d.max_abs_diff / d.max_abs_ref);
      row += rows;
    }
    return worst;
  }

  std::string dir_;
  GoldenFixture fixture_;
};

TEST_P(GoldenTest, ConfigMatchesFixtureAndRopeFrequenciesMatchTransformers) {
  auto config = LoadModelConfig(dir_);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(ArchitectureName(config->architecture), fixture_.architecture);
  EXPECT_EQ(config->vocab_size, fixture_.vocab_size);
  ASSERT_FALSE(fixture_.rope_inv_freq.empty());
  const std::vector<float> inv_freq = RopeInverseFrequencies(config->rope, config->rotary_dim);
  ASSERT_EQ(inv_freq.size(), fixture_.rope_inv_freq.size());
  for (size_t i = 0; i < inv_freq.size(); ++i) {
    EXPECT_NEAR(inv_freq[i], fixture_.rope_inv_freq[i], 1e-6 * fixture_.rope_inv_freq[i])
        << "i=" << i;
  }
}

TEST_P(GoldenTest, AllPositionLogitsMatchTransformers) {
  auto chain = LoadChain(dir_, 1);
  ASSERT_TRUE(chain.ok()) << chain.status();
  const float worst = ExpectMatchesGolden(RunAllPositions(*chain), "one slice");
  std::printf("[measured] %s (transformers %s, torch %s): worst max|diff|/max|ref| = %.3g\n",
              GetParam().c_str(), fixture_.transformers_version.c_str(),
              fixture_.torch_version.c_str(), worst);
}

TEST_P(GoldenTest, SplitIntoTwoAndThreeSlicesGivesTheSameLogits) {
  auto one = LoadChain(dir_, 1);
  ASSERT_TRUE(one.ok()) << one.status();
  const std::vector<float> want = RunAllPositions(*one);
  for (int num_slices : {2, 3}) {
    auto chain = LoadChain(dir_, num_slices);
    ASSERT_TRUE(chain.ok()) << chain.status();
    const std::vector<float> got = RunAllPositions(*chain);
    // Same ops in the same order: identical, not merely close.
    EXPECT_EQ(got, want) << num_slices << " slices";
    ExpectMatchesGolden(got, fmt::format("{} slices", num_slices));
  }
}

// Prefill (one prompt in two chunks over two micro-batches, mixed with other prompts), then
// batched decode steps through the paged cache; every greedy token must match transformers.
void RunGreedy(const GoldenFixture& fixture, Chain& chain) {
  const int n = static_cast<int>(fixture.prompts.size());
  const auto tables = BlockTables(n, 16, 7);
  const int64_t vocab = fixture.vocab_size;
  std::vector<int32_t> next(n), length(n);
  auto check = [&](int seq, int step, std::span<const float> row) {
    const GoldenPrompt& p = fixture.prompts[seq];
    const Diff d = Compare(row, std::span(p.greedy_logits).subspan(step * vocab, vocab));
    EXPECT_TRUE(WithinTolerance(d)) << "prompt " << seq << " step " << step << ": max|diff| "
                                    << d.max_abs_diff << " vs max|ref| " << d.max_abs_ref;
    next[seq] = ArgMax(row);
    EXPECT_EQ(next[seq], p.greedy_token_ids[step]) << "prompt " << seq << " step " << step;
  };
  const auto& p0 = fixture.prompts[0].token_ids;
  const auto& p1 = fixture.prompts[1].token_ids;
  const auto& p2 = fixture.prompts[2].token_ids;
  const int32_t split = static_cast<int32_t>(p2.size() / 2);
  {
    MicroBatch a;
    a.chunks.push_back(
        Chunk(0, 0, static_cast<int32_t>(p0.size()), tables[0], LogitsMode::kLastToken));
    a.chunks.push_back(Chunk(2, 0, split, tables[2], LogitsMode::kNone));
    a.token_ids.insert(a.token_ids.end(), p0.begin(), p0.end());
    a.token_ids.insert(a.token_ids.end(), p2.begin(), p2.begin() + split);
    auto logits = chain.Forward(a);
    ASSERT_TRUE(logits.ok()) << logits.status();
    ASSERT_EQ(static_cast<int64_t>(logits->size()), vocab);
    check(0, 0, *logits);
  }
  {
    MicroBatch b;
    b.chunks.push_back(Chunk(2, split, static_cast<int32_t>(p2.size()) - split, tables[2],
                             LogitsMode::kLastToken));
    b.chunks.push_back(
        Chunk(1, 0, static_cast<int32_t>(p1.size()), tables[1], LogitsMode::kLastToken));
    b.token_ids.insert(b.token_ids.end(), p2.begin() + split, p2.end());
    b.token_ids.insert(b.token_ids.end(), p1.begin(), p1.end());
    auto logits = chain.Forward(b);
    ASSERT_TRUE(logits.ok()) << logits.status();
    ASSERT_EQ(static_cast<int64_t>(logits->size()), 2 * vocab);
    check(2, 0, std::span(*logits).subspan(0, vocab));
    check(1, 0, std::span(*logits).subspan(vocab, vocab));
  }
  for (int i = 0; i < n; ++i) length[i] = static_cast<int32_t>(fixture.prompts[i].token_ids.size());
  const int steps = static_cast<int>(fixture.prompts[0].greedy_token_ids.size());
  for (int step = 1; step < steps; ++step) {
    MicroBatch decode;
    for (int i = n - 1; i >= 0; --i) {  // a different chunk order than the prefill
      decode.chunks.push_back(Chunk(i, length[i], 1, tables[i], LogitsMode::kLastToken));
      decode.token_ids.push_back(next[i]);
      ++length[i];
    }
    auto logits = chain.Forward(decode);
    ASSERT_TRUE(logits.ok()) << logits.status();
    for (int r = 0; r < n; ++r)
      check(n - 1 - r, step, std::span(*logits).subspan(r * vocab, vocab));
    if (::testing::Test::HasFailure()) return;  // one divergence makes the rest noise
  }
}

TEST_P(GoldenTest, GreedyContinuationMatchesTransformersTokenForToken) {
  auto chain = LoadChain(dir_, 1);
  ASSERT_TRUE(chain.ok()) << chain.status();
  RunGreedy(fixture_, *chain);
}

TEST_P(GoldenTest, GreedyContinuationThroughThreeSlices) {
  auto chain = LoadChain(dir_, 3);
  ASSERT_TRUE(chain.ok()) << chain.status();
  RunGreedy(fixture_, *chain);
}

INSTANTIATE_TEST_SUITE_P(
    Architectures, GoldenTest,
    ::testing::Values("llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "mixtral", "qwen2_moe",
                      "glm4_moe", "gpt_oss", "deepseek_v3", "deepseek_v3_nolora", "deepseek_v2",
                      "deepseek_v3_moe", "deepseek_v2_moe", "deepseek_v2_moe_group",
                      "deepseek_v3_latent512", "deepseek_v3_moe_latent512",
                      "deepseek_v2_moe_latent512",
                      // Config variants: sliding windows, YaRN, defaults
                      // left out, other routing switches.
                      "mistral_window", "qwen2_window", "qwen2_yarn", "qwen3_moe_alt",
                      "qwen3_moe_window", "mixtral_window", "qwen2_moe_alt", "glm4_moe_alt",
                      "gpt_oss_alt", "gpt_oss_yarn", "deepseek_v3_moe_alt", "deepseek_v2_moe_alt"),
    [](const auto& info) { return info.param; });

// Quantized checkpoints (tests/fixtures/models/quant, scripts/make_quant_fixtures.py): the slice
// dequantizes at load; transformers ran on the same dequantized weights.
INSTANTIATE_TEST_SUITE_P(Quantized, GoldenTest,
                         ::testing::Values("quant/fp8_block", "quant/fp8_hf", "quant/ct_int4",
                                           "quant/ct_int8", "quant/ct_fp8", "quant/gptq_int4",
                                           "quant/gptq_int8", "quant/awq_int4"),
                         [](const auto& info) { return info.param.substr(6); });

// The conformance check can fail: one weight changed in a copy of a fixture breaks it.
struct Perturbation {
  std::string arch;
  std::string tensor;
};

class PerturbationTest : public ::testing::TestWithParam<Perturbation> {};

TEST_P(PerturbationTest, ChangingOneWeightBreaksConformance) {
  const std::string src = FixtureDir(GetParam().arch);
  auto fixture = LoadGoldenFixture(src);
  ASSERT_TRUE(fixture.ok()) << fixture.status();
  testing::TempDir tmp;
  for (const char* name :
       {"config.json", "model.safetensors", "model.safetensors.index.json",
        "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"}) {
    if (std::ifstream(src + "/" + name)) {
      ASSERT_TRUE(testing::CopyFile(src + "/" + name, tmp.path() + "/" + name).ok());
    }
  }
  auto check = [&](bool expect_match) {
    auto chain = LoadChain(tmp.path(), 1);
    ASSERT_TRUE(chain.ok()) << chain.status();
    MicroBatch batch;
    const auto& ids = fixture->prompts[2].token_ids;
    batch.chunks.push_back(Chunk(0, 0, static_cast<int32_t>(ids.size()), BlockTables(1, 16, 3)[0],
                                 LogitsMode::kAllTokens));
    batch.token_ids = ids;
    auto logits = chain->Forward(batch);
    ASSERT_TRUE(logits.ok()) << logits.status();
    const Diff d = Compare(*logits, fixture->prompts[2].logits);
    EXPECT_EQ(WithinTolerance(d), expect_match) << "max|diff| " << d.max_abs_diff;
  };
  check(true);  // the unchanged copy conforms

  // Patch element 0 of the tensor in the copied file: +0.25.
  std::string file;
  uint64_t offset = 0;
  {
    auto opened = SafetensorsFile::Open(src + "/model.safetensors");
    ASSERT_TRUE(opened.ok()) << opened.status();
    const TensorInfo* info = (*opened)->Find(GetParam().tensor);
    ASSERT_NE(info, nullptr) << GetParam().tensor;
    ASSERT_EQ(info->dtype, DType::kF32);
    offset = info->offset;
    file = tmp.path() + "/model.safetensors";
  }
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  float value = 0;
  f.seekg(static_cast<std::streamoff>(offset));
  f.read(reinterpret_cast<char*>(&value), sizeof(value));
  value += 0.25f;
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(reinterpret_cast<const char*>(&value), sizeof(value));
  f.close();
  check(false);
}

INSTANTIATE_TEST_SUITE_P(
    Weights, PerturbationTest,
    ::testing::Values(
        Perturbation{"llama", "model.layers.1.mlp.down_proj.weight"},
        Perturbation{"qwen2", "model.layers.2.self_attn.k_proj.bias"},
        Perturbation{"qwen3", "model.layers.0.self_attn.q_norm.weight"},
        Perturbation{"mixtral", "model.layers.1.block_sparse_moe.experts.0.w2.weight"},
        Perturbation{"qwen2_moe", "model.layers.1.mlp.shared_expert_gate.weight"},
        Perturbation{"glm4_moe", "model.layers.1.mlp.gate.e_score_correction_bias"},
        Perturbation{"gpt_oss", "model.layers.0.self_attn.sinks"},
        Perturbation{"deepseek_v3", "model.layers.1.self_attn.kv_b_proj.weight"},
        Perturbation{"deepseek_v2", "model.layers.0.self_attn.kv_a_layernorm.weight"},
        Perturbation{"deepseek_v3_moe", "model.layers.2.mlp.gate.e_score_correction_bias"},
        Perturbation{"deepseek_v2_moe_group", "model.layers.1.mlp.shared_experts.up_proj.weight"}),
    [](const auto& info) { return info.param.arch; });

}  // namespace
}  // namespace ringserve::golden
