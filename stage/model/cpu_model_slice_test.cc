#include "stage/model/cpu_model_slice.h"

#include <random>

#include "fmt/format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "stage/model/slice_weights.h"
#include "stage/model/testing/safetensors_writer.h"

namespace ringserve {
namespace {

using ::testing::HasSubstr;
using testing::SafetensorsBytes;
using testing::TempDir;
using testing::TensorToWrite;
using testing::WriteFile;

constexpr char kTinyConfig[] = R"({
  "architectures": ["LlamaForCausalLM"], "hidden_size": 8, "intermediate_size": 16,
  "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 10,
  "max_position_embeddings": 64, "rms_norm_eps": 1e-5, "tie_word_embeddings": %s})";

// A random-weight checkpoint of kTinyConfig holding the tensors of `layers` only (plus
// embeddings / final norm / lm_head as asked).
void WriteTinyModel(const std::string& dir, LayerRange layers, bool embed, bool head, bool tied,
                    const std::string& skip = "") {
  std::string config_text = kTinyConfig;
  config_text.replace(config_text.find("%s"), 2, tied ? "true" : "false");
  ASSERT_TRUE(WriteFile(dir + "/config.json", config_text).ok());
  auto config = ParseModelConfig(config_text);
  ASSERT_TRUE(config.ok()) << config.status();
  std::vector<TensorSpec> specs;
  if (embed) specs.push_back(EmbeddingSpec(*config));
  for (int l = layers.first; l < layers.last; ++l) {
    for (auto& s : LayerTensorSpecs(*config, l)) specs.push_back(s);
  }
  if (head) {
    specs.push_back(FinalNormSpec(*config));
    if (!tied) specs.push_back({"lm_head.weight", {10, 8}});
  }
  std::mt19937 rng(5);
  std::normal_distribution<float> dist(0.0f, 0.3f);
  std::vector<TensorToWrite> tensors;
  for (const auto& s : specs) {
    if (s.name == skip) continue;
    int64_t n = 1;
    for (int64_t d : s.shape) n *= d;
    TensorToWrite t{.name = s.name, .dtype = DType::kBF16, .shape = s.shape, .values = {}};
    for (int64_t i = 0; i < n; ++i) t.values.push_back(dist(rng));
    tensors.push_back(std::move(t));
  }
  ASSERT_TRUE(WriteFile(dir + "/model.safetensors", SafetensorsBytes(tensors)).ok());
}

SliceOptions Options(const std::string& dir, LayerRange layers) {
  return {.model_dir = dir, .layers = layers, .kv_block_size = 4, .kv_num_blocks = 8};
}

TEST(CpuModelSliceTest, LoadsOnlyTheTensorsOfItsSlice) {
  TempDir dir;
  WriteTinyModel(dir.path(), {0, 1}, /*embed=*/true, /*head=*/false, /*tied=*/false);
  auto first = CpuModelSlice::Load(Options(dir.path(), {0, 1}));
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_TRUE((*first)->is_first());
  EXPECT_FALSE((*first)->is_last());
  auto rest = CpuModelSlice::Load(Options(dir.path(), {1, 2}));
  ASSERT_FALSE(rest.ok());
  EXPECT_EQ(rest.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(rest.status().message()),
              HasSubstr("tensor \"model.layers.1.input_layernorm.weight\" not found"));
}

TEST(CpuModelSliceTest, LastSliceUsesEmbeddingsWhenTiedAndNeedsLmHeadOtherwise) {
  TempDir tied;
  WriteTinyModel(tied.path(), {1, 2}, /*embed=*/true, /*head=*/true, /*tied=*/true);
  auto last = CpuModelSlice::Load(Options(tied.path(), {1, 2}));
  ASSERT_TRUE(last.ok()) << last.status();
  EXPECT_TRUE((*last)->is_last());

  TempDir untied;
  WriteTinyModel(untied.path(), {1, 2}, /*embed=*/true, /*head=*/true, /*tied=*/false,
                 /*skip=*/"lm_head.weight");
  auto missing = CpuModelSlice::Load(Options(untied.path(), {1, 2}));
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("\"lm_head.weight\" not found"));
}

TEST(CpuModelSliceTest, RejectsBadRangesAndKvOptions) {
  TempDir dir;
  WriteTinyModel(dir.path(), {0, 2}, true, true, false);
  for (LayerRange bad : {LayerRange{1, 1}, LayerRange{-1, 1}, LayerRange{0, 3}}) {
    auto slice = CpuModelSlice::Load(Options(dir.path(), bad));
    ASSERT_FALSE(slice.ok());
    EXPECT_THAT(std::string(slice.status().message()), HasSubstr("layer range"));
  }
  SliceOptions options = Options(dir.path(), {0, 2});
  options.kv_block_size = 0;
  EXPECT_EQ(CpuModelSlice::Load(options).status().code(), absl::StatusCode::kInvalidArgument);
}

class MalformedBatchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    WriteTinyModel(dir_.path(), {0, 2}, true, true, false);
    auto first = CpuModelSlice::Load(Options(dir_.path(), {0, 1}));
    ASSERT_TRUE(first.ok()) << first.status();
    first_ = *std::move(first);
    auto second = CpuModelSlice::Load(Options(dir_.path(), {1, 2}));
    ASSERT_TRUE(second.ok()) << second.status();
    second_ = *std::move(second);
    // Fill some KV so that "unchanged" means something.
    MicroBatch warm = Valid();
    auto hidden = first_->Forward(warm, {});
    ASSERT_TRUE(hidden.ok()) << hidden.status();
    ASSERT_TRUE(second_->Forward(warm, *hidden).ok());
    hidden_ = *hidden;
  }

  static MicroBatch Valid() {
    MicroBatch batch;
    batch.chunks.push_back({.seq_id = 1,
                            .start_position = 0,
                            .num_tokens = 5,
                            .block_table = {3, 6},
                            .logits = LogitsMode::kLastToken});
    batch.chunks.push_back({.seq_id = 2,
                            .start_position = 0,
                            .num_tokens = 2,
                            .block_table = {0},
                            .logits = LogitsMode::kLastToken});
    batch.token_ids = {1, 2, 3, 4, 5, 6, 7};
    return batch;
  }

  void ExpectRejected(const MicroBatch& batch, const std::string& message) {
    const std::vector<float> kv_first(first_->kv_cache().data().begin(),
                                      first_->kv_cache().data().end());
    const std::vector<float> kv_second(second_->kv_cache().data().begin(),
                                       second_->kv_cache().data().end());
    auto result = first_->Forward(batch, {});
    if (result.ok()) result = second_->Forward(batch, hidden_);
    ASSERT_FALSE(result.ok()) << message;
    EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(result.status().message()), HasSubstr(message));
    EXPECT_TRUE(std::equal(kv_first.begin(), kv_first.end(), first_->kv_cache().data().begin()));
    EXPECT_TRUE(std::equal(kv_second.begin(), kv_second.end(), second_->kv_cache().data().begin()));
  }

  TempDir dir_;
  std::unique_ptr<CpuModelSlice> first_;
  std::unique_ptr<CpuModelSlice> second_;
  std::vector<float> hidden_;
};

TEST_F(MalformedBatchTest, RejectsEveryMalformationWithoutTouchingTheCache) {
  ExpectRejected(MicroBatch{}, "no chunks");
  MicroBatch b = Valid();
  b.token_ids.pop_back();
  ExpectRejected(b, "6 token ids for 7 tokens");
  b = Valid();
  b.token_ids[3] = 10;
  ExpectRejected(b, "token id 10 at index 3 outside the vocabulary [0, 10)");
  b = Valid();
  b.chunks[1].num_tokens = 0;
  ExpectRejected(b, "chunk 1 (seq 2): num_tokens 0");
  b = Valid();
  b.chunks[1].start_position = -1;
  ExpectRejected(b, "start_position -1");
  b = Valid();
  b.chunks[0].block_table = {3};
  ExpectRejected(b, "chunk 0 (seq 1): block table has 1 blocks, positions [0, 5) need 2");
  b = Valid();
  b.chunks[1].block_table = {8};
  ExpectRejected(b, "block id 8 at table index 0 outside [0, 8)");
  b = Valid();
  b.chunks[0].block_table = {3, -2};
  ExpectRejected(b, "block id -2");
  b = Valid();
  b.chunks[1].start_position = 63;
  b.chunks[1].block_table = std::vector<int32_t>(17, 1);
  ExpectRejected(b, "exceed max_position_embeddings 64");
  // Not the first slice: hidden_in must be [total_tokens, hidden].
  b = Valid();
  auto result = second_->Forward(b, std::span<const float>(hidden_).subspan(8));
  ASSERT_FALSE(result.ok());
  EXPECT_THAT(std::string(result.status().message()),
              HasSubstr("hidden_in has 48 floats, expected 7 tokens x hidden 8 = 56"));
}

TEST_F(MalformedBatchTest, LogitsRowsFollowEachChunksMode) {
  MicroBatch b = Valid();
  b.chunks[0].logits = LogitsMode::kAllTokens;
  b.chunks[1].logits = LogitsMode::kNone;
  auto hidden = first_->Forward(b, {});
  ASSERT_TRUE(hidden.ok());
  EXPECT_EQ(hidden->size(), 7u * 8);
  auto logits = second_->Forward(b, *hidden);
  ASSERT_TRUE(logits.ok()) << logits.status();
  EXPECT_EQ(logits->size(), 5u * 10);
  b.chunks[0].logits = LogitsMode::kNone;
  logits = second_->Forward(b, *hidden);
  ASSERT_TRUE(logits.ok()) << logits.status();
  EXPECT_TRUE(logits->empty());
}

}  // namespace
}  // namespace ringserve
