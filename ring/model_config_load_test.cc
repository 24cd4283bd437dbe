// LoadModelConfig's reading of config.json from a model directory: what sits at the path is
// not trusted (a FIFO, a device, a huge file), while the hub cache's symlinks keep working; and
// a quantization_config no stage would load is refused here, when the coordinator starts.
#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "common/bounded_file.h"
#include "common/testing/fifo_watchdog.h"
#include "common/testing/temp_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ring/model_config.h"

namespace ringserve {
namespace {

using ::testing::HasSubstr;

constexpr char kLlamaJson[] = R"({
  "architectures": ["LlamaForCausalLM"], "model_type": "llama",
  "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
  "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100,
  "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "hidden_act": "silu",
  "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "bfloat16"
})";

TEST(ModelConfigLoadTest, FollowsASymlinkedConfigAsInAHubCache) {
  testing::TempDir dir;
  std::ofstream(dir.path() + "/blob") << kLlamaJson;
  std::filesystem::create_symlink(dir.path() + "/blob", dir.path() + "/config.json");
  auto config = LoadModelConfig(dir.path());
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->num_layers, 2);
}

TEST(ModelConfigLoadTest, RefusesAFifoConfigWithoutWaitingForAWriter) {
  // Used to block the coordinator (and the stage) forever in open().
  testing::TempDir dir;
  const std::string path = dir.path() + "/config.json";
  ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0);
  absl::StatusOr<ModelConfig> config;
  EXPECT_TRUE(testing::ReturnsWithoutAWriter(path, [&] { config = LoadModelConfig(dir.path()); }))
      << "loading blocked on the FIFO";
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument) << config.status();
  EXPECT_THAT(std::string(config.status().message()), HasSubstr(path));
  EXPECT_THAT(std::string(config.status().message()), HasSubstr("not a regular file"));
}

TEST(ModelConfigLoadTest, RefusesAConfigThatIsASymlinkToDevZero) {
  // Used to read without bound until memory ran out.
  testing::TempDir dir;
  const std::string path = dir.path() + "/config.json";
  std::filesystem::create_symlink("/dev/zero", path);
  auto config = LoadModelConfig(dir.path());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument) << config.status();
  EXPECT_THAT(std::string(config.status().message()), HasSubstr(path));
  EXPECT_THAT(std::string(config.status().message()), HasSubstr("character device"));
}

TEST(ModelConfigLoadTest, RefusesAnOversizedConfigNamingTheLimit) {
  testing::TempDir dir;
  const std::string path = dir.path() + "/config.json";
  { std::ofstream create(path); }
  std::filesystem::resize_file(path, kMaxConfigJsonBytes + 1);
  auto config = LoadModelConfig(dir.path());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument) << config.status();
  EXPECT_THAT(std::string(config.status().message()), HasSubstr(path));
  EXPECT_THAT(std::string(config.status().message()), HasSubstr("(16 MiB)"));
}

// Used to be accepted by the coordinator, which then started its stages only for each to fail
// at load with the checkpoint's weights half read.
TEST(ModelConfigLoadTest, RefusesAQuantMethodNoStageLoadsNamingTheKeyAndTheValue) {
  const std::string llama(kLlamaJson, std::string_view(kLlamaJson).rfind('}'));
  struct Case {
    std::string quantization_config;
    std::string message;
  };
  for (const Case& c : std::vector<Case>{
           {R"({"quant_method": "bitsandbytes", "load_in_4bit": true})",
            R"(unsupported quantization_config.quant_method "bitsandbytes" for LlamaForCausalLM)"},
           {R"({"quant_method": "hqq"})", R"(unsupported quantization_config.quant_method "hqq")"},
           {R"({"quant_method": "mxfp4"})",  // gpt-oss's experts only
            R"(unsupported quantization_config.quant_method "mxfp4" for LlamaForCausalLM)"},
           {R"({"bits": 4})", "quantization_config.quant_method must be a string, got none"},
           {R"({"quant_method": 4})", "quantization_config.quant_method must be a string, got 4"},
           {R"("gptq")", "quantization_config is not an object"}}) {
    testing::TempDir dir;
    const std::string path = dir.path() + "/config.json";
    std::ofstream(path) << llama << R"(, "quantization_config": )" << c.quantization_config << "}";
    auto config = LoadModelConfig(dir.path());
    EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument)
        << c.quantization_config << ": " << config.status();
    EXPECT_THAT(std::string(config.status().message()), HasSubstr(path + ": " + c.message));
  }
}

TEST(ModelConfigLoadTest, AcceptsEveryQuantizedCheckpointTheStagesLoad) {
  const char* source = std::getenv("RINGSERVE_SOURCE_DIR");
  const std::filesystem::path quant =
      std::filesystem::path(source != nullptr ? source : ".") / "tests/fixtures/models/quant";
  int checked = 0;
  for (const auto& entry : std::filesystem::directory_iterator(quant)) {
    if (!std::filesystem::exists(entry.path() / "config.json")) continue;
    auto config = LoadModelConfig(entry.path().string());
    EXPECT_TRUE(config.ok()) << entry.path() << ": " << config.status();
    ++checked;
  }
  EXPECT_GE(checked, 8);  // fp8 (two), compressed-tensors (three), gptq (two), awq
}

}  // namespace
}  // namespace ringserve
