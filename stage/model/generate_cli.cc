// generate_cli: runs a whole model as one CPU slice and prints a greedy continuation.
//   generate_cli [--model DIR] [--prompt_ids 1,2,3] [--max_tokens 16] [--ignore_eos]
// Defaults: the tiny Qwen2 golden fixture and its first golden prompt, so the demo runs with no
// arguments (and its output can be checked against transformers' greedy continuation).
// Stops at an EOS id of config.json or generation_config.json (as the coordinator does; unless
// --ignore_eos). Prints the generated token ids (space-separated) on stdout; logs and timing go
// to stderr.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/statusor.h"
#include "common/flags.h"
#include "common/logging.h"
#include "ring/generation_config.h"
#include "spdlog/sinks/stdout_color_sinks.h"
#include "stage/model/model_slice.h"

ABSL_FLAG(std::string, model, "",
          "model directory (empty: the tiny Qwen2 golden fixture, tests/fixtures/models/qwen2)");
ABSL_FLAG(std::string, prompt_ids, "",
          "prompt token ids, e.g. 1,2,3 (empty: the fixture's first golden prompt)");
ABSL_FLAG(int, max_tokens, 16, "tokens to generate (1 to 2^20)");
ABSL_FLAG(bool, ignore_eos, false,
          "generate max_tokens whatever comes (else stop at an EOS id of config.json or "
          "generation_config.json)");

namespace ringserve {
namespace {

struct Args {
  std::string model_dir;
  std::vector<int32_t> prompt_ids = {111, 403, 294, 117, 140};
  int max_tokens = 16;
  bool ignore_eos = false;
};

constexpr char kUsage[] =
    "Runs a whole model as one CPU slice and prints a greedy continuation.\n"
    "usage: generate_cli [--model=DIR] [--prompt_ids=1,2,3] [--max_tokens=N] [--ignore_eos]";

std::string DefaultModelDir() {
  const std::string relative = "tests/fixtures/models/qwen2";
  if (std::filesystem::exists(relative + "/config.json")) return relative;
  return RINGSERVE_DEFAULT_MODEL_DIR;
}

bool ParseIds(const std::string& text, std::vector<int32_t>& ids) {
  ids.clear();
  size_t pos = 0;
  while (pos <= text.size()) {
    const size_t comma = std::min(text.find(',', pos), text.size());
    const std::string item = text.substr(pos, comma - pos);
    char* end = nullptr;
    const long value = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || value < 0 || value > INT32_MAX) return false;
    ids.push_back(static_cast<int32_t>(value));
    pos = comma + 1;
  }
  return !ids.empty();
}

bool ParseArgs(int argc, char** argv, Args& args) {
  ParseCommandLineFlags(argc, argv, kUsage);
  args.model_dir = absl::GetFlag(FLAGS_model);
  if (args.model_dir.empty()) args.model_dir = DefaultModelDir();
  if (const std::string ids = absl::GetFlag(FLAGS_prompt_ids); !ids.empty()) {
    if (!ParseIds(ids, args.prompt_ids)) return false;
  }
  args.max_tokens = absl::GetFlag(FLAGS_max_tokens);
  if (args.max_tokens <= 0 || args.max_tokens > 1 << 20) return false;
  args.ignore_eos = absl::GetFlag(FLAGS_ignore_eos);
  return true;
}

int Run(const Args& args) {
  constexpr int kBlockSize = 16;
  const int positions = static_cast<int>(args.prompt_ids.size()) + args.max_tokens;
  const int num_blocks = (positions + kBlockSize - 1) / kBlockSize;
  SliceOptions options{.model_dir = args.model_dir,
                       .layers = {0, 0},
                       .kv_block_size = kBlockSize,
                       .kv_num_blocks = num_blocks};
  auto config = LoadModelConfig(args.model_dir);
  if (!config.ok()) {
    std::fprintf(stderr, "error: %s\n", std::string(config.status().message()).c_str());
    return 1;
  }
  // Where the server stops: config.json's EOS ids and those generation_config.json adds.
  auto eos = LoadEosTokenIds(args.model_dir, *config);
  if (!eos.ok()) {
    std::fprintf(stderr, "error: %s\n", std::string(eos.status().message()).c_str());
    return 1;
  }
  options.layers = {0, config->num_layers};
  const auto start = std::chrono::steady_clock::now();
  auto slice = ModelSlice::LoadCpu(options);
  if (!slice.ok()) {
    std::fprintf(stderr, "error: %s\n", std::string(slice.status().message()).c_str());
    return 1;
  }
  const auto loaded = std::chrono::steady_clock::now();
  std::vector<int32_t> block_table(num_blocks);
  for (int i = 0; i < num_blocks; ++i) block_table[i] = i;

  MicroBatch batch;
  batch.chunks.push_back({.seq_id = 0,
                          .start_position = 0,
                          .num_tokens = static_cast<int32_t>(args.prompt_ids.size()),
                          .block_table = block_table,
                          .logits = LogitsMode::kLastToken});
  batch.token_ids = args.prompt_ids;
  std::vector<int32_t> generated;
  int32_t position = 0;
  while (static_cast<int>(generated.size()) < args.max_tokens) {
    auto logits = (*slice)->Forward(batch, {});
    if (!logits.ok()) {
      std::fprintf(stderr, "error: %s\n", std::string(logits.status().message()).c_str());
      return 1;
    }
    int32_t best = 0;
    for (size_t i = 1; i < logits->size(); ++i) {
      if ((*logits)[i] > (*logits)[best]) best = static_cast<int32_t>(i);
    }
    generated.push_back(best);
    std::printf("%s%d", generated.size() == 1 ? "" : " ", best);
    std::fflush(stdout);
    if (!args.ignore_eos && std::find(eos->begin(), eos->end(), best) != eos->end()) break;
    position += batch.chunks[0].num_tokens;
    batch.chunks[0].start_position = position;
    batch.chunks[0].num_tokens = 1;
    batch.token_ids = {best};
  }
  std::printf("\n");
  std::fflush(stdout);
  const auto done = std::chrono::steady_clock::now();
  const double load_s = std::chrono::duration<double>(loaded - start).count();
  const double gen_s = std::chrono::duration<double>(done - loaded).count();
  std::fprintf(stderr, "%s: %zu prompt tokens, %zu generated in %.3f s (%.1f tok/s), load %.3f s\n",
               args.model_dir.c_str(), args.prompt_ids.size(), generated.size(), gen_s,
               generated.size() / std::max(gen_s, 1e-9), load_s);
  return 0;
}

}  // namespace
}  // namespace ringserve

int main(int argc, char** argv) {
  // Logs go to stderr: stdout carries only the generated ids.
  spdlog::set_default_logger(spdlog::stderr_color_mt("generate_cli"));
  ringserve::InitLogging("generate_cli");
  ringserve::Args args;
  if (!ringserve::ParseArgs(argc, argv, args)) {
    std::fputs(ringserve::kUsage, stderr);
    return 2;
  }
  return ringserve::Run(args);
}
