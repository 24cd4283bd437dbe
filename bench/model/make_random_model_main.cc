// make_random_model: writes a random-weight Hugging Face model directory in a real shape.
//
//   make_random_model --shape llama-3.1-8b --out /data/llama-8b-random
//   make_random_model --shape qwen3-8b --layers 4 --out /tmp/qwen3-4l --dtype bf16
//   make_random_model --shape deepseek-v3 --first_layer 3 --layers 4 --out /tmp/dsv3-3-6
//   make_random_model --shape llama-3.1-8b --quant int4-g128 --out /data/llama-8b-int4
//
// Flags (--help lists them with their defaults): --shape NAME (KnownShapeNames()), --out DIR,
// --layers N (override the layer count; with --first_layer the number of layers written),
// --first_layer F (write only layers [F, F + N) of the shape's model: config.json keeps every
// layer, the safetensors hold only that stage's tensors), --dtype bf16|f16|f32, --seed N,
// --shard_mb N, --threads N, --tokenizers_dir DIR, --notokenizer, --quant none|int4-g128|int8|
// fp8-block (the decoder's linear layers in a hub layout: bench/model/quant_layout.h; on MoE
// shapes every expert and shared expert too, routers float -- e.g.
//   make_random_model --shape qwen3-30b-a3b --layers 2 --quant fp8-block --out /tmp/q3moe-fp8
//   make_random_model --shape deepseek-v3 --first_layer 3 --layers 1 --quant fp8-block ...).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/flags/flag.h"
#include "bench/model/quant_layout.h"
#include "bench/model/random_model.h"
#include "common/flags.h"
#include "fmt/format.h"

#ifndef RINGSERVE_TOKENIZERS_DIR
#define RINGSERVE_TOKENIZERS_DIR ".deps/tokenizers"
#endif

ABSL_FLAG(std::string, shape, "",
          "model shape: llama-3.1-8b, qwen3-8b, qwen3-30b-a3b, deepseek-v3, glm-4.5-air, tiny, "
          "tiny-qwen3, tiny-qwen3-moe, tiny-deepseek-v3, tiny-glm4-moe");
ABSL_FLAG(std::string, out, "", "output model directory");
ABSL_FLAG(int, layers, 0,
          "layer count (0: the shape's); with --first_layer, how many layers to write");
ABSL_FLAG(int, first_layer, -1,
          "write only layers [first_layer, first_layer + layers) of the shape's full model "
          "(-1: a whole model of --layers layers)");
ABSL_FLAG(std::string, dtype, "bf16", "weight dtype: bf16, f16 or f32");
ABSL_FLAG(uint64_t, seed, 0, "random seed");
ABSL_FLAG(std::string, quant, "none",
          "linear layers quantized as the hub stores them: none, int4-g128 (compressed-tensors), "
          "int8 (compressed-tensors, per channel), fp8-block (quant_method fp8, 128x128)");
ABSL_FLAG(int64_t, shard_mb, 5120, "safetensors shard size, MiB");
ABSL_FLAG(int, threads, 0, "writer threads (0: all cores)");
ABSL_FLAG(std::string, tokenizers_dir, RINGSERVE_TOKENIZERS_DIR,
          "where <tokenizer>/tokenizer.json is (the fetched npm assets)");
ABSL_FLAG(bool, tokenizer, true, "copy the shape's tokenizer; --notokenizer: none");

namespace {

int Usage(const std::string& error) {
  std::fprintf(stderr, "make_random_model: %s (see --help)\n", error.c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  ringserve::ParseCommandLineFlags(
      argc, argv,
      "Writes a random-weight Hugging Face model directory in a real shape.\n"
      "usage: make_random_model --shape=NAME --out=DIR [--layers=N] [--dtype=bf16|f16|f32] ...");
  ringserve::RandomModelOptions options;
  const std::string shape_name = absl::GetFlag(FLAGS_shape);
  options.output_dir = absl::GetFlag(FLAGS_out);
  const int layers = absl::GetFlag(FLAGS_layers);
  if (layers < 0) return Usage("--layers needs an integer >= 0");
  const std::string dtype = absl::GetFlag(FLAGS_dtype);
  if (dtype == "bf16") {
    options.dtype = ringserve::DType::kBF16;
  } else if (dtype == "f16") {
    options.dtype = ringserve::DType::kF16;
  } else if (dtype == "f32") {
    options.dtype = ringserve::DType::kF32;
  } else {
    return Usage("--dtype must be bf16, f16 or f32");
  }
  options.seed = absl::GetFlag(FLAGS_seed);
  auto quant = ringserve::ParseCheckpointQuant(absl::GetFlag(FLAGS_quant));
  if (!quant.ok()) return Usage(std::string(quant.status().message()));
  options.quant = *quant;
  if (absl::GetFlag(FLAGS_shard_mb) < 1) return Usage("--shard_mb needs an integer >= 1");
  options.max_shard_bytes = absl::GetFlag(FLAGS_shard_mb) << 20;
  if (absl::GetFlag(FLAGS_threads) < 0) return Usage("--threads needs an integer >= 0");
  options.num_threads = absl::GetFlag(FLAGS_threads);
  options.tokenizers_dir =
      absl::GetFlag(FLAGS_tokenizer) ? absl::GetFlag(FLAGS_tokenizers_dir) : "";
  if (shape_name.empty() || options.output_dir.empty()) {
    return Usage("--shape and --out are required");
  }
  auto shape = ringserve::FindShape(shape_name);
  if (!shape.ok()) return Usage(std::string(shape.status().message()));
  options.shape = *shape;
  const int first_layer = absl::GetFlag(FLAGS_first_layer);
  if (first_layer >= 0) {
    if (layers < 1) return Usage("--first_layer needs --layers N >= 1");
    if (first_layer + layers > options.shape.num_layers) {
      return Usage(fmt::format("layers [{}, {}) exceed the {} layers of {}", first_layer,
                               first_layer + layers, options.shape.num_layers, shape_name));
    }
    options.first_layer = first_layer;
    options.last_layer = first_layer + layers;
  } else if (layers > 0) {
    options.shape.num_layers = static_cast<int>(layers);
  }
  auto result = ringserve::WriteRandomModel(options);
  if (!result.ok()) {
    std::fprintf(stderr, "make_random_model: %s\n", std::string(result.status().message()).c_str());
    return 1;
  }
  const std::string written = options.last_layer > 0
                                  ? fmt::format("layers [{}, {}) of {}", options.first_layer,
                                                options.last_layer, options.shape.num_layers)
                                  : fmt::format("{} layers", options.shape.num_layers);
  fmt::print("wrote {} ({}): {:.2f} GB in {} file(s), {:.1f} s, {:.2f} GB/s\n", options.output_dir,
             written, result->total_bytes / 1e9, result->files.size(), result->seconds,
             result->total_bytes / 1e9 / std::max(result->seconds, 1e-9));
  return 0;
}
