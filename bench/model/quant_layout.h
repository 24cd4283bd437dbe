// The quantized checkpoint layouts make_random_model writes (--quant): each linear weight
// M.weight [out, in] of the decoder layers becomes the tensors the hub stores for its format,
// with random codes and constant scales chosen so that the weights have about init_std, and
// config.json gets the format's quantization_config. The loader (stage/model/quantized_weights.h)
// reads them as any checkpoint of that format.
//
//   int4-g128  compressed-tensors pack-quantized, int 4 bits, symmetric, group 128:
//              M.weight_packed I32 [out, in / 8], M.weight_scale BF16 [out, in / 128],
//              M.weight_shape I64 [2]
//   int8       compressed-tensors pack-quantized, int 8 bits, symmetric, channel:
//              M.weight_packed I32 [out, in / 4], M.weight_scale BF16 [out, 1], M.weight_shape
//   fp8-block  quant_method fp8 (DeepSeek / Qwen): M.weight F8_E4M3 [out, in],
//              M.weight_scale_inv F32 [ceil(out / 128), ceil(in / 128)]
// "mxfp4" is refused: the loader reads MXFP4 only for gpt-oss experts, not dense layers.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "bench/model/random_model.h"
#include "nlohmann/json.hpp"

namespace ringserve {

// "none", "int4-g128", "int8", "fp8-block"; InvalidArgument naming the value otherwise.
absl::StatusOr<CheckpointQuant> ParseCheckpointQuant(std::string_view name);
std::string_view CheckpointQuantName(CheckpointQuant quant);

// The stored tensors of linear weight `weight` ("...proj.weight", [out, in]) under `quant`
// (kNone: the weight itself). InvalidArgument when in is not a multiple of the packing.
absl::StatusOr<std::vector<CheckpointTensor>> QuantizedParts(const CheckpointTensor& weight,
                                                             CheckpointQuant quant,
                                                             double init_std);

// config.json's quantization_config for `quant` (null for kNone).
nlohmann::ordered_json QuantizationConfig(CheckpointQuant quant);

// A stored tensor's bytes (little-endian, as safetensors holds them).
struct StoredTensor {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape = {};
  std::string bytes = {};
};

// The trained weight `values` ([out, in] row-major) of linear weight `name` quantized into the
// parts above by the format's reference quantizer: compressed-tensors' symmetric min/max
// observer (scale = absmax / 7.5 for int4 per group of 128, / 127.5 for int8 per channel, in
// bf16; q = clamp(round(w / scale))), and fine-grained FP8 (scale = block absmax / 448 in fp32,
// q = the nearest e4m3). InvalidArgument as QuantizedParts.
absl::StatusOr<std::vector<StoredTensor>> QuantizeWeight(const std::string& name, int64_t out,
                                                         int64_t in, std::span<const float> values,
                                                         CheckpointQuant quant);

}  // namespace ringserve
