// config.json's `quantization_config`, parsed and validated once, and the question every loader
// asks of it: how is the linear module `name` stored?
//
// Supported (anything else is refused with InvalidArgument naming the key and its value):
//   quant_method fp8                 fmt e4m3, weight_block_size [r, c], scale_fmt absent/float/
//                                    ue8m0, activation_scheme dynamic/static,
//                                    modules_to_not_convert (+ lm_head unless a list is
//                                    given: transformers' default skip).
//   quant_method compressed-tensors  quantization_status compressed; config_groups whose weights
//   are
//                                    int (1-8 bits, format pack-quantized or int-quantized) or
//                                    float 8 bits (float-quantized / naive-quantized), strategy
//                                    tensor/channel/group/block, symmetric or not, actorder;
//                                    targets and ignore as names, "re:" regexes or "Linear";
//                                    no sparsity_config. Input activation schemes and
//                                    kv_cache_scheme are accepted: weights are dequantized and
//                                    activations and the KV cache stay in full precision.
//   quant_method gptq                bits 2/4/8, group_size, desc_act, sym, checkpoint_format
//                                    gptq/gptq_v2, lm_head, modules_in_block_to_quantize.
//   quant_method awq                 bits 4, version gemm, zero_point true, group_size,
//                                    modules_to_not_convert.
//   quant_method mxfp4               experts only (gpt-oss); modules_to_not_convert.
// Module names are the checkpoint's, without the trailing ".weight":
// "model.layers.3.self_attn.q_proj", "lm_head", "model.layers.3.mlp.experts.7.down_proj"; gpt-oss's
// stacked experts are the modules "model.layers.3.mlp.experts.gate_up_proj" / ".down_proj".
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace ringserve::quant {

enum class QuantMethod { kNone, kFp8, kCompressedTensors, kGptq, kAwq, kMxfp4 };

// "none", "fp8", "compressed-tensors", "gptq", "awq", "mxfp4".
std::string_view QuantMethodName(QuantMethod method);

// How one compressed-tensors config group stores its weights.
struct CompressedScheme {
  enum class Storage {
    kPacked,  // pack-quantized: weight_packed I32, weight_shape, [weight_zero_point packed dim 0]
    kInt,     // int-quantized / naive-quantized int: weight I8, [weight_zero_point I8]
    kFloat,   // float-quantized / naive-quantized float: weight F8_E4M3
    kDense,   // format "dense": stored unquantized
  };
  enum class Strategy { kTensor, kChannel, kGroup, kBlock };

  std::string group_name;  // "group_0", for messages
  Storage storage = Storage::kPacked;
  Strategy strategy = Strategy::kChannel;
  int num_bits = 8;
  bool symmetric = true;
  int64_t group_size = 0;                  // kGroup
  int64_t block_rows = 0, block_cols = 0;  // kBlock
  std::vector<std::string> targets;
};

struct QuantConfig {
  QuantMethod method = QuantMethod::kNone;

  // fp8: block size of weight_scale_inv; scale_fmt ue8m0 (power-of-two scales; read the same).
  int64_t block_rows = 0, block_cols = 0;
  bool scale_ue8m0 = false;

  // gptq / awq.
  int bits = 0;
  int group_size = 0;                           // -1: one group per output channel
  bool desc_act = false;                        // gptq
  bool symmetric = true;                        // gptq "sym"
  int gptq_zero_offset = 1;                     // 1 for checkpoint_format gptq (v1), 0 for gptq_v2
  bool gptq_lm_head = false;                    // gptq "lm_head": the lm_head is quantized too
  std::vector<std::string> gptq_block_modules;  // modules_in_block_to_quantize, flattened

  // fp8 / mxfp4: keys of unquantized modules as transformers 5 reads them (a regular expression
  // matched from the name's start, or a suffix); awq: substrings ("*" matches a layer number).
  std::vector<std::string> modules_to_not_convert;
  // fp8: the file lists modules_to_not_convert. transformers adds its default skip (lm_head)
  // only when the list is null, so with a list lm_head is quantized unless the list names it.
  bool fp8_skip_list_given = false;

  // compressed-tensors.
  std::vector<CompressedScheme> schemes;
  std::vector<std::string> ignore;
};

// How the linear module `module` is stored under `config`.
struct LinearStorage {
  QuantMethod method = QuantMethod::kNone;   // kNone: a plain F32/F16/BF16 `.weight`
  const CompressedScheme* scheme = nullptr;  // kCompressedTensors: the matching group
};

// Parses config.json (the whole object). No `quantization_config` (or null) is kNone.
// InvalidArgument naming `source` and the key for anything unsupported or malformed.
absl::StatusOr<QuantConfig> ParseQuantConfig(const nlohmann::json& config_json,
                                             const std::string& source);
// Reads `model_dir`/config.json (common/bounded_file.h: a regular file of at most
// kMaxConfigJsonBytes) and parses it. NotFound if missing; InvalidArgument naming the path when
// it is not a regular file or is too large.
absl::StatusOr<QuantConfig> LoadQuantConfig(const std::string& model_dir);

// The storage of linear module `module` (see the file comment for names). Pure; thread-safe.
LinearStorage StorageOf(const QuantConfig& config, std::string_view module);

}  // namespace ringserve::quant
