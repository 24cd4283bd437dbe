#include "bench/model/random_model.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "fmt/format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "ring/model_config.h"
#include "stage/model/model_slice.h"
#include "stage/model/safetensors.h"
#include "stage/model/slice_weights.h"

namespace ringserve {
namespace {

namespace fs = std::filesystem;

int64_t NumParams(const ModelShape& shape) {
  int64_t total = 0;
  for (const CheckpointTensor& spec : CheckpointTensors(shape)) total += spec.NumElements();
  return total;
}

std::string TokenizersDir() {
  const char* source = std::getenv("RINGSERVE_SOURCE_DIR");
  return (fs::path(source ? source : ".") / ".deps" / "tokenizers").string();
}

std::string ReadFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

class RandomModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) /
           ("random_model_" +
            std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  RandomModelOptions Tiny(const std::string& shape_name = "tiny") {
    RandomModelOptions options;
    options.output_dir = dir_.string();
    options.shape = *FindShape(shape_name);
    options.seed = 7;
    options.num_threads = 2;
    if (fs::exists(fs::path(TokenizersDir()) / options.shape.tokenizer / "tokenizer.json")) {
      options.tokenizers_dir = TokenizersDir();
    }
    return options;
  }

  fs::path dir_;
};

TEST(ModelShapeTest, RealShapesHaveTheRealParameterCounts) {
  // Llama-3.1-8B: 8,030,261,248 parameters (16.06 GB in bf16).
  EXPECT_EQ(NumParams(*FindShape("llama-3.1-8b")), 8030261248);
  // Qwen3-8B: 8.19 B parameters (lm_head untied).
  EXPECT_NEAR(static_cast<double>(NumParams(*FindShape("qwen3-8b"))), 8.19e9, 0.01e9);
  // Qwen3-30B-A3B: 30.5 B parameters.
  EXPECT_NEAR(static_cast<double>(NumParams(*FindShape("qwen3-30b-a3b"))), 30.53e9, 0.01e9);
  // DeepSeek-V3: 671 B parameters without its MTP layer.
  EXPECT_NEAR(static_cast<double>(NumParams(*FindShape("deepseek-v3"))), 671.0e9, 0.1e9);
  EXPECT_EQ(FindShape("gpt-5").status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(FindShape("gpt-5").status().message()),
              ::testing::HasSubstr("llama-3.1-8b"));
}

TEST(ModelShapeTest, ConfigsParseWithTheModelCore) {
  for (const std::string& name : KnownShapeNames()) {
    SCOPED_TRACE(name);
    ModelShape shape = *FindShape(name);
    auto config = ParseModelConfig(ConfigJson(shape, DType::kBF16), name + "/config.json");
    ASSERT_TRUE(config.ok()) << config.status();
    EXPECT_EQ(config->num_layers, shape.num_layers);
    EXPECT_EQ(config->hidden_size, shape.hidden_size);
    EXPECT_EQ(config->num_kv_heads, shape.num_kv_heads);
    EXPECT_EQ(config->head_dim, shape.head_dim);
    EXPECT_EQ(config->vocab_size, shape.vocab_size);
    EXPECT_EQ(config->qk_norm, shape.qk_norm);
    EXPECT_EQ(config->tie_word_embeddings, shape.tie_word_embeddings);
    EXPECT_EQ(config->eos_token_ids, shape.eos_token_ids);
    EXPECT_EQ(config->rope.type, shape.llama3_rope_scaling ? RopeType::kLlama3
                                 : shape.mla.enabled()     ? RopeType::kYarn
                                                           : RopeType::kDefault);
    EXPECT_EQ(config->dtype, DType::kBF16);
    EXPECT_EQ(config->moe.router.num_experts, shape.num_experts);
    EXPECT_EQ(config->mla.has_value(), shape.mla.enabled());
    // The checkpoint holds exactly the tensors the model core reads.
    std::vector<std::string> core, written;
    for (int layer = 0; layer < shape.num_layers; ++layer) {
      for (const TensorSpec& spec : LayerTensorSpecs(*config, layer)) core.push_back(spec.name);
    }
    for (const CheckpointTensor& t : CheckpointTensors(shape)) {
      if (t.name.starts_with("model.layers.")) written.push_back(t.name);
    }
    std::sort(core.begin(), core.end());
    std::sort(written.begin(), written.end());
    EXPECT_EQ(core, written);
  }
}

TEST_F(RandomModelTest, TinyMoeModelRunsInTheCpuSlice) {
  RandomModelOptions options = Tiny("tiny-qwen3-moe");
  auto result = WriteRandomModel(options);
  ASSERT_TRUE(result.ok()) << result.status();
  auto slice = ModelSlice::LoadCpu(
      {.model_dir = dir_.string(), .layers = {0, 2}, .kv_block_size = 16, .kv_num_blocks = 4});
  ASSERT_TRUE(slice.ok()) << slice.status();
  MicroBatch batch;
  batch.chunks.push_back(SequenceChunk{.seq_id = 1,
                                       .start_position = 0,
                                       .num_tokens = 4,
                                       .block_table = {0},
                                       .logits = LogitsMode::kLastToken});
  batch.token_ids = {151643, 9707, 11, 1879};
  auto logits = (*slice)->Forward(batch, {});
  ASSERT_TRUE(logits.ok()) << logits.status();
  ASSERT_EQ(logits->size(), static_cast<size_t>(options.shape.vocab_size));
  for (float v : *logits) ASSERT_TRUE(std::isfinite(v));
}

// GLM-4.5's layout: a dense first layer, then sigmoid-routed experts with a correction bias, a
// shared expert, q/k/v biases and partial rotary; the CPU slice reads every tensor.
TEST_F(RandomModelTest, TinyGlmMoeModelRunsInTheCpuSlice) {
  RandomModelOptions options = Tiny("tiny-glm4-moe");
  auto result = WriteRandomModel(options);
  ASSERT_TRUE(result.ok()) << result.status();
  auto config = LoadModelConfig(dir_.string());
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_FALSE(config->moe.IsMoeLayer(0));
  EXPECT_TRUE(config->moe.IsMoeLayer(1));
  EXPECT_EQ(config->rotary_dim, config->head_dim / 2);
  EXPECT_EQ(config->moe.shared_intermediate_size, 32);
  auto slice = ModelSlice::LoadCpu(
      {.model_dir = dir_.string(), .layers = {0, 3}, .kv_block_size = 16, .kv_num_blocks = 4});
  ASSERT_TRUE(slice.ok()) << slice.status();
  MicroBatch batch;
  batch.chunks.push_back(SequenceChunk{.seq_id = 1,
                                       .start_position = 0,
                                       .num_tokens = 4,
                                       .block_table = {0},
                                       .logits = LogitsMode::kLastToken});
  batch.token_ids = {151329, 9707, 11, 1879};
  auto logits = (*slice)->Forward(batch, {});
  ASSERT_TRUE(logits.ok()) << logits.status();
  for (float v : *logits) ASSERT_TRUE(std::isfinite(v));
}

TEST_F(RandomModelTest, TinyModelLoadsAndRunsInTheCpuSlice) {
  RandomModelOptions options = Tiny();
  auto result = WriteRandomModel(options);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_THAT(result->files, ::testing::ElementsAre("model.safetensors"));
  EXPECT_EQ(result->total_bytes, NumParams(options.shape) * 2);
  if (!options.tokenizers_dir.empty()) {
    EXPECT_EQ(ReadFile(dir_ / "tokenizer.json"),
              ReadFile(fs::path(TokenizersDir()) / "llama3" / "tokenizer.json"));
  }

  // The header: 8-byte little-endian length, JSON padded so the data starts 8-byte aligned.
  std::string file = ReadFile(dir_ / "model.safetensors");
  ASSERT_GT(file.size(), 8u);
  uint64_t header_size = 0;
  for (int i = 0; i < 8; ++i) header_size |= uint64_t{static_cast<uint8_t>(file[i])} << (8 * i);
  EXPECT_EQ((8 + header_size) % 8, 0u);
  auto header = nlohmann::json::parse(file.substr(8, header_size));
  EXPECT_EQ(header["__metadata__"]["format"], "pt");
  EXPECT_EQ(file.size(), 8 + header_size + static_cast<uint64_t>(result->total_bytes));

  auto weights = SafetensorsModel::Open(dir_.string());
  ASSERT_TRUE(weights.ok()) << weights.status();
  std::vector<std::string> expected_names;
  for (const CheckpointTensor& spec : CheckpointTensors(options.shape)) {
    expected_names.push_back(spec.name);
  }
  std::sort(expected_names.begin(), expected_names.end());
  EXPECT_EQ((*weights)->TensorNames(), expected_names);
  const std::vector<int64_t> embed_shape = {options.shape.vocab_size, options.shape.hidden_size};
  auto embed = (*weights)->ReadFloat("model.embed_tokens.weight", embed_shape);
  ASSERT_TRUE(embed.ok()) << embed.status();
  double sum = 0;
  double sum_sq = 0;
  for (float v : *embed) {
    sum += v;
    sum_sq += static_cast<double>(v) * v;
  }
  const double mean = sum / embed->size();
  const double stddev = std::sqrt(sum_sq / embed->size() - mean * mean);
  EXPECT_NEAR(mean, 0.0, 1e-4);
  EXPECT_NEAR(stddev, 0.02, 0.0005);
  const std::vector<int64_t> norm_shape = {options.shape.hidden_size};
  auto norm = (*weights)->ReadFloat("model.norm.weight", norm_shape);
  ASSERT_TRUE(norm.ok());
  EXPECT_THAT(*norm, ::testing::Each(1.0f));

  SliceOptions slice_options;
  slice_options.model_dir = dir_.string();
  slice_options.layers = {0, options.shape.num_layers};
  slice_options.kv_block_size = 16;
  slice_options.kv_num_blocks = 4;
  auto slice = ModelSlice::LoadCpu(slice_options);
  ASSERT_TRUE(slice.ok()) << slice.status();
  MicroBatch batch;
  batch.chunks.push_back(SequenceChunk{.seq_id = 1,
                                       .start_position = 0,
                                       .num_tokens = 5,
                                       .block_table = {0},
                                       .logits = LogitsMode::kLastToken});
  batch.token_ids = {128000, 9906, 11, 1917, 0};
  auto logits = (*slice)->Forward(batch, {});
  ASSERT_TRUE(logits.ok()) << logits.status();
  ASSERT_EQ(logits->size(), static_cast<size_t>(options.shape.vocab_size));
  for (float v : *logits) ASSERT_TRUE(std::isfinite(v));
}

TEST_F(RandomModelTest, ShardsWithAnIndexAndLayerOverride) {
  RandomModelOptions options = Tiny("tiny-qwen3");
  options.shape.num_layers = 3;
  options.dtype = DType::kF32;
  options.max_shard_bytes = 8 << 20;  // the f32 embeddings alone are 39 MB
  auto result = WriteRandomModel(options);
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_GE(result->files.size(), 2u);
  EXPECT_EQ(result->files[0],
            fmt::format("model-00001-of-{:05d}.safetensors", result->files.size()));
  auto index = nlohmann::json::parse(ReadFile(dir_ / "model.safetensors.index.json"));
  EXPECT_EQ(index["metadata"]["total_size"].get<int64_t>(), result->total_bytes);
  EXPECT_EQ(index["weight_map"].size(), CheckpointTensors(options.shape).size());

  auto config = LoadModelConfig(dir_.string());
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->num_layers, 3);
  EXPECT_TRUE(config->qk_norm);
  EXPECT_EQ(config->dtype, DType::kF32);

  auto weights = SafetensorsModel::Open(dir_.string());
  ASSERT_TRUE(weights.ok()) << weights.status();
  for (const CheckpointTensor& spec : CheckpointTensors(options.shape)) {
    auto tensor = (*weights)->Get(spec.name, spec.shape);
    ASSERT_TRUE(tensor.ok()) << spec.name << ": " << tensor.status();
  }
  SliceOptions slice_options;
  slice_options.model_dir = dir_.string();
  slice_options.layers = {1, 3};  // a middle-to-last slice of the sharded checkpoint
  auto slice = ModelSlice::LoadCpu(slice_options);
  ASSERT_TRUE(slice.ok()) << slice.status();
}

TEST(ModelShapeTest, DeepseekV3HoldsTheLatentCacheAndItsMoeLayout) {
  auto config = ParseModelConfig(ConfigJson(*FindShape("deepseek-v3"), DType::kBF16), "dsv3");
  ASSERT_TRUE(config.ok()) << config.status();
  // 1,152 KV bytes per token and layer in bf16: the latent (512) and the rope key (64).
  EXPECT_EQ(config->kv_values_per_token_layer() * 2, 1152);
  EXPECT_FALSE(config->moe.IsMoeLayer(2));
  EXPECT_TRUE(config->moe.IsMoeLayer(3));
  EXPECT_EQ(config->moe.router.scoring, RouterScoring::kSigmoidGroupedTopK);
  EXPECT_EQ(config->moe.shared_intermediate_size, 2048);
}

// A stage's slice of a DeepSeek-V3 checkpoint: only its layers' tensors are written, exactly the
// ones the model core reads for that slice, and the CPU slice runs on them.
TEST_F(RandomModelTest, DeepseekLayerSliceHoldsOnlyThatStagesTensorsAndRuns) {
  RandomModelOptions options = Tiny("tiny-deepseek-v3");
  options.tokenizers_dir.clear();
  options.first_layer = 1;  // the dense layer 0 is another stage's; 1 and 2 are MoE
  options.last_layer = 3;
  auto result = WriteRandomModel(options);
  ASSERT_TRUE(result.ok()) << result.status();
  auto config = LoadModelConfig(dir_.string());
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->num_layers, 4);
  auto weights = SafetensorsModel::Open(dir_.string());
  ASSERT_TRUE(weights.ok()) << weights.status();
  std::vector<std::string> core, written = (*weights)->TensorNames();
  for (const TensorSpec& spec : SliceTensorSpecs(*config, {1, 3}, **weights)) {
    core.push_back(spec.name);
  }
  std::sort(core.begin(), core.end());
  std::sort(written.begin(), written.end());
  EXPECT_EQ(core, written);
  EXPECT_FALSE((*weights)->Contains("model.embed_tokens.weight"));
  EXPECT_FALSE((*weights)->Contains("model.layers.0.mlp.gate_proj.weight"));

  auto slice = ModelSlice::LoadCpu(
      {.model_dir = dir_.string(), .layers = {1, 3}, .kv_block_size = 16, .kv_num_blocks = 4});
  ASSERT_TRUE(slice.ok()) << slice.status();
  MicroBatch batch;
  batch.chunks.push_back(
      SequenceChunk{.seq_id = 1, .start_position = 0, .num_tokens = 3, .block_table = {0}});
  std::vector<float> hidden(3 * options.shape.hidden_size);
  for (size_t i = 0; i < hidden.size(); ++i) hidden[i] = std::sin(0.37f * static_cast<float>(i));
  auto out = (*slice)->Forward(batch, hidden);
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->size(), hidden.size());
  for (float v : *out) ASSERT_TRUE(std::isfinite(v));
  // A range past the model is refused by name.
  options.last_layer = 5;
  EXPECT_THAT(std::string(WriteRandomModel(options).status().message()),
              ::testing::HasSubstr("layers [1, 5)"));
}

TEST_F(RandomModelTest, SameSeedSameBytesWhateverTheThreadCount) {
  RandomModelOptions options = Tiny();
  options.tokenizers_dir.clear();
  options.num_threads = 1;
  ASSERT_TRUE(WriteRandomModel(options).ok());
  const std::string one_thread = ReadFile(dir_ / "model.safetensors");
  options.num_threads = 3;
  ASSERT_TRUE(WriteRandomModel(options).ok());
  EXPECT_TRUE(ReadFile(dir_ / "model.safetensors") == one_thread);
  options.seed = 8;
  ASSERT_TRUE(WriteRandomModel(options).ok());
  EXPECT_FALSE(ReadFile(dir_ / "model.safetensors") == one_thread);
}

TEST_F(RandomModelTest, MissingTokenizerIsAnError) {
  RandomModelOptions options = Tiny();
  options.tokenizers_dir = (dir_ / "no-such-dir").string();
  auto result = WriteRandomModel(options);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(result.status().message()), ::testing::HasSubstr("tokenizer.json"));
}

}  // namespace
}  // namespace ringserve
