// DeepSeek (multi-head latent attention) conformance beyond golden_test.cc's logits: the
// softmax scale and rope factor against transformers', the MTP layer against the reference in
// scripts/make_mla_fixtures.py (the published formula), and what the MoE fixtures need.
#include <cmath>
#include <fstream>
#include <numeric>
#include <random>
#include <sstream>

#include "fmt/format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/ops.h"
#include "nlohmann/json.hpp"
#include "ring/model_config.h"
#include "stage/model/cpu_model_slice.h"
#include "stage/model/cpu_mtp_layer.h"
#include "stage/model/safetensors.h"
#include "stage/model/testing/safetensors_writer.h"
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
                                           "deepseek_v2_moe_group", "deepseek_v3_latent512",
                                           "deepseek_v3_moe_latent512",
                                           "deepseek_v2_moe_latent512"),
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

// DeepSeek-V3's own MTP layer has a MoE block. A copy of deepseek_v3_moe gets an MTP layer 3
// whose decoder block is a copy of the MoE layer 2 and whose head norm is model.norm: its
// logits must equal the published formula run with that layer, i.e. the last slice [2, 3)
// applied to h' = eh_proj([enorm(Emb(t)); hnorm(h)]).
TEST(MtpLoadTest, AMoeMtpBlockRunsTheModelsRouterAndExperts) {
  const std::string src = FixtureDir("deepseek_v3_moe");
  testing::TempDir tmp;
  ASSERT_TRUE(testing::CopyFile(src + "/config.json", tmp.path() + "/config.json").ok());
  auto source = SafetensorsModel::Open(src);
  ASSERT_TRUE(source.ok()) << source.status();
  auto config = LoadModelConfig(src);
  ASSERT_TRUE(config.ok()) << config.status();
  const int64_t hidden = config->hidden_size;
  std::vector<testing::TensorToWrite> tensors;
  std::vector<float> model_norm;
  for (const std::string& name : (*source)->TensorNames()) {
    auto view = (*source)->GetAnyShape(name);
    ASSERT_TRUE(view.ok()) << view.status();
    const std::vector<int64_t> shape = view->info->shape;
    auto values = (*source)->ReadFloat(name, shape);
    ASSERT_TRUE(values.ok()) << values.status();
    if (name == "model.norm.weight") model_norm = *values;
    tensors.push_back({.name = name, .shape = shape, .values = *values});
    const std::string layer2 = "model.layers.2.";
    if (name.starts_with(layer2)) {
      tensors.push_back({.name = "model.layers.3." + name.substr(layer2.size()),
                         .shape = shape,
                         .values = *values});
    }
  }
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 0.1f);
  auto random = [&](int64_t n, float offset) {
    std::vector<float> v(n);
    for (float& x : v) x = offset + normal(rng);
    return v;
  };
  const std::vector<float> enorm = random(hidden, 1.0f), hnorm = random(hidden, 1.0f);
  const std::vector<float> eh_proj = random(hidden * 2 * hidden, 0.0f);
  tensors.push_back({.name = "model.layers.3.enorm.weight", .shape = {hidden}, .values = enorm});
  tensors.push_back({.name = "model.layers.3.hnorm.weight", .shape = {hidden}, .values = hnorm});
  tensors.push_back(
      {.name = "model.layers.3.eh_proj.weight", .shape = {hidden, 2 * hidden}, .values = eh_proj});
  tensors.push_back(
      {.name = "model.layers.3.shared_head.norm.weight", .shape = {hidden}, .values = model_norm});
  ASSERT_TRUE(
      testing::WriteFile(tmp.path() + "/model.safetensors", testing::SafetensorsBytes(tensors))
          .ok());

  auto last = CpuModelSlice::Load({.model_dir = tmp.path(), .layers = {2, 3}});
  ASSERT_TRUE(last.ok()) << last.status();
  ASSERT_NE((*last)->mtp(), nullptr) << "the MoE MTP layer was not loaded";
  auto weights = SafetensorsModel::Open(tmp.path());
  ASSERT_TRUE(weights.ok()) << weights.status();
  auto mtp = CpuMtpLayer::Load(*config, **weights, quant::QuantConfig{}, 4, 16);
  ASSERT_TRUE(mtp.ok()) << mtp.status();

  const std::vector<int32_t> next_tokens = {7, 42, 3, 99, 15, 64};
  const int64_t n = static_cast<int64_t>(next_tokens.size());
  const std::vector<float> main_hidden = random(n * hidden, 0.0f);
  MicroBatch batch;
  batch.chunks.push_back({.seq_id = 1,
                          .start_position = 0,
                          .num_tokens = static_cast<int32_t>(n),
                          .block_table = {3, 0},
                          .logits = LogitsMode::kAllTokens});
  batch.token_ids = next_tokens;
  auto got = (*mtp)->Forward(batch, main_hidden);
  ASSERT_TRUE(got.ok()) << got.status();

  // The formula: h' from the embedding and h, then layer 2 (a MoE layer), model.norm, lm_head.
  auto embedding = (*weights)->ReadFloat("model.embed_tokens.weight",
                                         std::vector<int64_t>{config->vocab_size, hidden});
  ASSERT_TRUE(embedding.ok()) << embedding.status();
  std::vector<float> both(n * 2 * hidden), emb(n * hidden), h_prime(n * hidden);
  cpu::Embed(embedding->data(), hidden, next_tokens.data(), n, emb.data());
  for (int64_t t = 0; t < n; ++t) {
    cpu::RmsNorm(emb.data() + t * hidden, enorm.data(), 1, hidden, config->rms_norm_eps,
                 both.data() + t * 2 * hidden);
    cpu::RmsNorm(main_hidden.data() + t * hidden, hnorm.data(), 1, hidden, config->rms_norm_eps,
                 both.data() + t * 2 * hidden + hidden);
  }
  cpu::MatMul(both.data(), eh_proj.data(), nullptr, n, 2 * hidden, hidden, h_prime.data());
  auto want = (*last)->Forward(batch, h_prime);
  ASSERT_TRUE(want.ok()) << want.status();
  const Diff d = Compare(*got, *want);
  EXPECT_TRUE(WithinTolerance(d)) << "max|diff| " << d.max_abs_diff << " vs " << d.max_abs_ref;
}

}  // namespace
}  // namespace ringserve::golden
