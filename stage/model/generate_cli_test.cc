// generate_cli end to end (the real binary on a real model directory): it stops where the
// coordinator stops, on config.json's EOS ids and on those generation_config.json adds.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "common/testing/temp_dir.h"
#include "gtest/gtest.h"

namespace ringserve {
namespace {

std::string EnvOr(const char* name, const char* fallback) {
  const char* value = std::getenv(name);
  return value != nullptr ? value : fallback;
}

// What `generate_cli --model model_dir` prints on stdout (its stderr is dropped).
std::string RunCli(const std::string& model_dir) {
  const std::string command = EnvOr("RINGSERVE_BINARY_DIR", "build") +
                              "/stage/model/generate_cli --model '" + model_dir + "' 2>/dev/null";
  std::FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return "popen failed";
  std::string out;
  char buffer[256];
  while (std::fgets(buffer, sizeof(buffer), pipe) != nullptr) out += buffer;
  const int status = ::pclose(pipe);
  return status == 0 ? out : out + "(exit status " + std::to_string(status) + ")";
}

TEST(GenerateCliTest, StopsOnTheEosIdsGenerationConfigAdds) {
  // The qwen2 fixture (config.json: eos 2) continues its first golden prompt with
  // 424 399 399 237 94 ...; a generation_config.json that adds 237 ends it there.
  const std::filesystem::path fixture =
      std::filesystem::absolute(EnvOr("RINGSERVE_SOURCE_DIR", ".")) / "tests/fixtures/models/qwen2";
  testing::TempDir dir;
  for (const char* name : {"config.json", "model.safetensors"}) {
    std::filesystem::create_symlink(fixture / name, std::filesystem::path(dir.path()) / name);
  }
  std::ofstream(dir.path() + "/generation_config.json") << R"({"eos_token_id": [2, 237]})";
  EXPECT_EQ(RunCli(dir.path()), "424 399 399 237\n");
  std::ofstream(dir.path() + "/generation_config.json") << R"({"eos_token_id": 2})";
  EXPECT_EQ(RunCli(dir.path()), "424 399 399 237 94 431 399 237 94 431 399 237 431 399 128 139\n");
}

}  // namespace
}  // namespace ringserve
