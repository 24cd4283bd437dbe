// make_random_model: writes a random-weight Hugging Face model directory in a real shape.
//
//   make_random_model --shape llama-3.1-8b --out /data/llama-8b-random
//   make_random_model --shape qwen3-8b --layers 4 --out /tmp/qwen3-4l --dtype bf16
//
// Flags: --shape NAME (llama-3.1-8b, qwen3-8b, tiny, tiny-qwen3), --out DIR, --layers N
// (override the layer count), --dtype bf16|f16|f32, --seed N, --shard-mb N (default 5120),
// --threads N (default: all cores), --tokenizers-dir DIR (default: the fetched npm assets),
// --no-tokenizer.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "bench/model/random_model.h"
#include "fmt/format.h"

#ifndef RINGSERVE_TOKENIZERS_DIR
#define RINGSERVE_TOKENIZERS_DIR ".deps/tokenizers"
#endif

namespace {

int Usage(const std::string& error) {
  std::fprintf(stderr,
               "%s\nusage: make_random_model --shape NAME --out DIR [--layers N] "
               "[--dtype bf16|f16|f32] [--seed N] [--shard-mb N] [--threads N] "
               "[--tokenizers-dir DIR | --no-tokenizer]\n",
               error.c_str());
  return 2;
}

bool ParseInt(const std::string& text, long long min, long long* out) {
  char* end = nullptr;
  long long value = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || value < min) return false;
  *out = value;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  std::string shape_name;
  ringserve::RandomModelOptions options;
  options.tokenizers_dir = RINGSERVE_TOKENIZERS_DIR;
  long long layers = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--no-tokenizer") {
      options.tokenizers_dir.clear();
      continue;
    }
    if (i + 1 >= argc) return Usage("missing value for " + flag);
    const std::string value = argv[++i];
    long long number = 0;
    if (flag == "--shape") {
      shape_name = value;
    } else if (flag == "--out") {
      options.output_dir = value;
    } else if (flag == "--layers") {
      if (!ParseInt(value, 1, &layers)) return Usage("--layers needs an integer >= 1");
    } else if (flag == "--dtype") {
      if (value == "bf16") {
        options.dtype = ringserve::DType::kBF16;
      } else if (value == "f16") {
        options.dtype = ringserve::DType::kF16;
      } else if (value == "f32") {
        options.dtype = ringserve::DType::kF32;
      } else {
        return Usage("--dtype must be bf16, f16 or f32");
      }
    } else if (flag == "--seed") {
      if (!ParseInt(value, 0, &number)) return Usage("--seed needs an integer >= 0");
      options.seed = static_cast<uint64_t>(number);
    } else if (flag == "--shard-mb") {
      if (!ParseInt(value, 1, &number)) return Usage("--shard-mb needs an integer >= 1");
      options.max_shard_bytes = static_cast<int64_t>(number) << 20;
    } else if (flag == "--threads") {
      if (!ParseInt(value, 1, &number)) return Usage("--threads needs an integer >= 1");
      options.num_threads = static_cast<int>(number);
    } else if (flag == "--tokenizers-dir") {
      options.tokenizers_dir = value;
    } else {
      return Usage("unknown flag " + flag);
    }
  }
  if (shape_name.empty() || options.output_dir.empty()) {
    return Usage("--shape and --out are required");
  }
  auto shape = ringserve::FindShape(shape_name);
  if (!shape.ok()) return Usage(std::string(shape.status().message()));
  options.shape = *shape;
  if (layers > 0) options.shape.num_layers = static_cast<int>(layers);
  auto result = ringserve::WriteRandomModel(options);
  if (!result.ok()) {
    std::fprintf(stderr, "make_random_model: %s\n", std::string(result.status().message()).c_str());
    return 1;
  }
  fmt::print("wrote {} ({} layers): {:.2f} GB in {} file(s), {:.1f} s, {:.2f} GB/s\n",
             options.output_dir, options.shape.num_layers, result->total_bytes / 1e9,
             result->files.size(), result->seconds,
             result->total_bytes / 1e9 / std::max(result->seconds, 1e-9));
  return 0;
}
