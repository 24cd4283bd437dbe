// DeepSeek (multi-head latent attention) conformance beyond golden_test.cc's logits: the
// softmax scale and rope factor against transformers', the MTP layer against the reference in
// scripts/make_mla_fixtures.py (the published formula), and what the MoE fixtures need.
#include <cmath>
#include <fstream>
#include <numeric>
#include <sstream>

#include "fmt/format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "ring/model_config.h"
#include "stage/model/cpu_model_slice.h"
#include "stage/model/cpu_mtp_layer.h"
#include "stage/model/safetensors.h"
#include "tests/golden/golden_fixture.h"

namespace ringserve::golden {
namespace {

using ::testing::HasSubstr;

nlohmann::json ReadGoldenJson(const std::string& dir) {
  std::ifstream in(dir + "/golden.json");
  std::stringstream text;
  text << in.rdbuf();
  return nlohmann::json::parse(text.str());
}

// golden.bin floats [offset, offset + count).
std::vector<float> ReadBin(const std::string& dir, int64_t offset, int64_t count) {
  std::ifstream in(dir + "/golden.bin", std::ios::binary);
  in.seekg(offset * 4);
  std::vector<float> out(count);
  in.read(reinterpret_cast<char*>(out.data()), count * 4);
  EXPECT_TRUE(in.good()) << dir << "/golden.bin too short";
  return out;
}

class MlaFixtureTest : public ::testing::TestWithParam<std::string> {};

TEST_P(MlaFixtureTest, SoftmaxScaleAndRopeFactorMatchTransformers) {
  const std::string dir = FixtureDir(GetParam());
  auto config = LoadModelConfig(dir);
  ASSERT_TRUE(config.ok()) << config.status();
  ASSERT_TRUE(config->mla.has_value());
  const nlohmann::json golden = ReadGoldenJson(dir);
  EXPECT_NEAR(config->mla->softmax_scale, golden.at("softmax_scale").get<double>(), 1e-12);
  EXPECT_NEAR(config->mla->rope_attention_factor, golden.at("rope_attention_scaling").get<double>(),
              1e-12);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, MlaFixtureTest,
                         ::testing::Values("deepseek_v3", "deepseek_v3_nolora", "deepseek_v2",
                                           "deepseek_v3_moe", "deepseek_v2_moe",
                                           "deepseek_v2_moe_group"),
                         [](const auto& info) { return info.param; });

class MtpTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = FixtureDir("deepseek_v3");
    auto config = LoadModelConfig(dir_);
    ASSERT_TRUE(config.ok()) << config.status();
    config_ = *config;
    auto weights = SafetensorsModel::Open(dir_);
    ASSERT_TRUE(weights.ok()) << weights.status();
    auto mtp = CpuMtpLayer::Load(config_, **weights, quant::QuantConfig{}, /*kv_block_size=*/4,
                                 /*kv_num_blocks=*/32);
    ASSERT_TRUE(mtp.ok()) << mtp.status();
    mtp_ = *std::move(mtp);
    golden_ = ReadGoldenJson(dir_);
  }

  struct Entry {
    std::vector<int32_t> ids;   // the prompt
    std::vector<float> hidden;  // [ids.size(), hidden] main hidden after model.norm
    std::vector<float> logits;  // [ids.size() - 1, vocab]
  };
  Entry LoadEntry(int i) {
    const nlohmann::json& e = golden_.at("mtp").at("entries").at(i);
    Entry entry;
    entry.ids = golden_.at("prompts")
                    .at(e.at("prompt").get<int>())
                    .at("token_ids")
                    .get<std::vector<int32_t>>();
    entry.hidden = ReadBin(dir_, e.at("hidden_offset").get<int64_t>(),
                           e.at("hidden_rows").get<int64_t>() * config_.hidden_size);
    entry.logits = ReadBin(dir_, e.at("logits_offset").get<int64_t>(),
                           e.at("logits_rows").get<int64_t>() * config_.vocab_size);
    return entry;
  }

  void ExpectRowsMatch(std::span<const float> got, std::span<const float> want,
                       const std::string& what) {
    const Diff d = Compare(got, want);
    EXPECT_TRUE(WithinTolerance(d))
        << what << ": max|diff| " << d.max_abs_diff << " vs max|ref| " << d.max_abs_ref;
  }

  std::string dir_;
  ModelConfig config_;
  std::unique_ptr<CpuMtpLayer> mtp_;
  nlohmann::json golden_;
};

TEST_F(MtpTest, PromptAtOnceMatchesTheReference) {
  const std::vector<int32_t> table = {5, 9, 2, 30, 17, 0, 11, 8, 3, 21};
  for (int i = 0; i < 2; ++i) {
    const Entry e = LoadEntry(i);
    const int32_t n = static_cast<int32_t>(e.ids.size()) - 1;
    MicroBatch batch;
    batch.chunks.push_back({.seq_id = static_cast<uint64_t>(i),
                            .start_position = 0,
                            .num_tokens = n,
                            .block_table = table,
                            .logits = LogitsMode::kAllTokens});
    batch.token_ids.assign(e.ids.begin() + 1, e.ids.end());
    auto logits = mtp_->Forward(
        batch, std::span(e.hidden).subspan(0, static_cast<size_t>(n) * config_.hidden_size));
    ASSERT_TRUE(logits.ok()) << logits.status();
    ExpectRowsMatch(*logits, e.logits, fmt::format("entry {}", i));
  }
}

TEST_F(MtpTest, ChunkThenDecodesOverItsCacheMatchTheReference) {
  const Entry e = LoadEntry(1);  // 40 tokens: 39 rows
  const int32_t n = static_cast<int32_t>(e.ids.size()) - 1;
  const int64_t hidden = config_.hidden_size, vocab = config_.vocab_size;
  const std::vector<int32_t> table = {7, 1, 12, 4, 25, 19, 6, 14, 28, 10};
  const int32_t prefill = 17;
  MicroBatch first;
  first.chunks.push_back({.seq_id = 1,
                          .start_position = 0,
                          .num_tokens = prefill,
                          .block_table = table,
                          .logits = LogitsMode::kAllTokens});
  first.token_ids.assign(e.ids.begin() + 1, e.ids.begin() + 1 + prefill);
  auto logits = mtp_->Forward(first, std::span(e.hidden).subspan(0, prefill * hidden));
  ASSERT_TRUE(logits.ok()) << logits.status();
  ExpectRowsMatch(*logits, std::span(e.logits).subspan(0, prefill * vocab), "prefill");
  for (int32_t p = prefill; p < n; ++p) {
    MicroBatch step;
    step.chunks.push_back(
        {.seq_id = 1, .start_position = p, .num_tokens = 1, .block_table = table});
    step.token_ids = {e.ids[p + 1]};
    auto row = mtp_->Forward(step, std::span(e.hidden).subspan(p * hidden, hidden));
    ASSERT_TRUE(row.ok()) << row.status();
    ExpectRowsMatch(*row, std::span(e.logits).subspan(p * vocab, vocab),
                    fmt::format("decode at {}", p));
  }
}

TEST_F(MtpTest, RefusesAMismatchedHiddenInput) {
  MicroBatch batch;
  batch.chunks.push_back({.seq_id = 1, .start_position = 0, .num_tokens = 2, .block_table = {0}});
  batch.token_ids = {3, 4};
  std::vector<float> hidden(config_.hidden_size);  // one row for two tokens
  auto logits = mtp_->Forward(batch, hidden);
  ASSERT_FALSE(logits.ok());
  EXPECT_THAT(std::string(logits.status().message()), HasSubstr("main_hidden"));
}

TEST(MtpLoadTest, OnlyTheLastSliceHoldsTheMtpLayer) {
  const std::string dir = FixtureDir("deepseek_v3");
  auto last = CpuModelSlice::Load({.model_dir = dir, .layers = {2, 4}});
  ASSERT_TRUE(last.ok()) << last.status();
  ASSERT_NE((*last)->mtp(), nullptr);
  EXPECT_EQ((*last)->mtp()->layer_index(), 4);
  auto first = CpuModelSlice::Load({.model_dir = dir, .layers = {0, 3}});
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ((*first)->mtp(), nullptr);
  // Without MTP in the checkpoint the last slice loads without it.
  auto plain = CpuModelSlice::Load({.model_dir = FixtureDir("deepseek_v2"), .layers = {0, 3}});
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ((*plain)->mtp(), nullptr);
}

// The MoE fixtures' layers from first_k_dense_replace on are MoE blocks with the family's
// router (their logits are golden_test.cc's); a slice of the MoE layers alone loads only them.
TEST(MlaMoeFixtureTest, LayersFromFirstKDenseReplaceAreMoeWithTheFamilysRouter) {
  struct Case {
    const char* arch;
    RouterScoring scoring;
    int n_group, topk_group;
    float routed_scaling_factor;
  };
  for (const Case& c : {Case{"deepseek_v3_moe", RouterScoring::kSigmoidGroupedTopK, 4, 2, 2.5f},
                        Case{"deepseek_v2_moe", RouterScoring::kSoftmaxTopK, 1, 1, 1.0f},
                        Case{"deepseek_v2_moe_group", RouterScoring::kSoftmaxTopK, 4, 2, 1.5f}}) {
    auto config = LoadModelConfig(FixtureDir(c.arch));
    ASSERT_TRUE(config.ok()) << c.arch << ": " << config.status();
    EXPECT_FALSE(config->moe.IsMoeLayer(0)) << c.arch;
    EXPECT_TRUE(config->moe.IsMoeLayer(1)) << c.arch;
    EXPECT_TRUE(config->moe.IsMoeLayer(2)) << c.arch;
    EXPECT_EQ(config->moe.router.scoring, c.scoring) << c.arch;
    EXPECT_EQ(config->moe.router.n_group, c.n_group) << c.arch;
    EXPECT_EQ(config->moe.router.topk_group, c.topk_group) << c.arch;
    EXPECT_FLOAT_EQ(config->moe.router.routed_scaling_factor, c.routed_scaling_factor) << c.arch;
    auto slice = CpuModelSlice::Load({.model_dir = FixtureDir(c.arch), .layers = {1, 3}});
    ASSERT_TRUE(slice.ok()) << c.arch << ": " << slice.status();
  }
}

}  // namespace
}  // namespace ringserve::golden
