#include "bench/model/quant_layout.h"

#include <cmath>

#include "absl/status/status.h"
#include "common/dtype.h"
#include "fmt/format.h"

namespace ringserve {
namespace {

constexpr int64_t kGroup = 128;

// Standard deviation of the values random codes stand for: uniform integers of `bits` bits, or
// the e4m3 codes the writer draws (uniform bytes, NaN codes moved to the largest finite ones).
double IntCodeStd(int bits) {
  const double levels = std::exp2(bits);
  return std::sqrt((levels * levels - 1) / 12);
}

double E4m3CodeStd() {
  double sum = 0;
  for (int c = 0; c < 256; ++c) {
    const int code = (c & 0x7f) == 0x7f ? c - 1 : c;
    const double v = Fp8E4M3ToFloat(static_cast<uint8_t>(code));
    sum += v * v;
  }
  return std::sqrt(sum / 256);
}

std::string ModuleOf(const std::string& weight_name) {
  return weight_name.substr(0, weight_name.size() - std::string(".weight").size());
}

}  // namespace

absl::StatusOr<CheckpointQuant> ParseCheckpointQuant(std::string_view name) {
  for (CheckpointQuant q : {CheckpointQuant::kNone, CheckpointQuant::kInt4G128,
                            CheckpointQuant::kInt8, CheckpointQuant::kFp8Block}) {
    if (CheckpointQuantName(q) == name) return q;
  }
  if (name == "mxfp4") {
    return absl::InvalidArgumentError(
        "--quant mxfp4: MXFP4 checkpoints hold only gpt-oss experts; dense layers cannot be "
        "written in it (the CUDA benchmark quantizes random weights to fp4 on load instead: "
        "stage_bench --quant fp4)");
  }
  return absl::InvalidArgumentError(
      fmt::format("--quant {}: expected none, int4-g128, int8 or fp8-block", name));
}

std::string_view CheckpointQuantName(CheckpointQuant quant) {
  switch (quant) {
    case CheckpointQuant::kNone:
      return "none";
    case CheckpointQuant::kInt4G128:
      return "int4-g128";
    case CheckpointQuant::kInt8:
      return "int8";
    case CheckpointQuant::kFp8Block:
      return "fp8-block";
  }
  return "?";
}

absl::StatusOr<std::vector<CheckpointTensor>> QuantizedParts(const CheckpointTensor& weight,
                                                             CheckpointQuant quant,
                                                             double init_std) {
  if (quant == CheckpointQuant::kNone) return std::vector<CheckpointTensor>{weight};
  const std::string module = ModuleOf(weight.name);
  const int64_t out = weight.shape.at(0), in = weight.shape.at(1);
  using Fill = CheckpointTensor::Fill;
  if (quant == CheckpointQuant::kFp8Block) {
    return std::vector<CheckpointTensor>{
        {.name = weight.name,
         .shape = {out, in},
         .fill = Fill::kRandomE4m3,
         .dtype = DType::kF8E4M3},
        {.name = module + ".weight_scale_inv",
         .shape = {(out + kGroup - 1) / kGroup, (in + kGroup - 1) / kGroup},
         .fill = Fill::kConstant,
         .dtype = DType::kF32,
         .constant = static_cast<float>(init_std / E4m3CodeStd())}};
  }
  const int bits = quant == CheckpointQuant::kInt4G128 ? 4 : 8;
  const int64_t per_word = 32 / bits;
  const int64_t group = quant == CheckpointQuant::kInt4G128 ? kGroup : in;
  if (in % per_word != 0 || in % group != 0) {
    return absl::InvalidArgumentError(
        fmt::format("{}: {} input features do not pack into {} ({} a word, groups of {})",
                    weight.name, in, CheckpointQuantName(quant), per_word, group));
  }
  return std::vector<CheckpointTensor>{
      {.name = module + ".weight_packed",
       .shape = {out, in / per_word},
       .fill = Fill::kRandomBits,
       .dtype = DType::kI32},
      {.name = module + ".weight_scale",
       .shape = {out, in / group},
       .fill = Fill::kConstant,
       .dtype = DType::kBF16,
       .constant = static_cast<float>(init_std / IntCodeStd(bits))},
      {.name = module + ".weight_shape",
       .shape = {2},
       .fill = Fill::kInts,
       .dtype = DType::kI64,
       .ints = {out, in}}};
}

nlohmann::ordered_json QuantizationConfig(CheckpointQuant quant) {
  nlohmann::ordered_json q;
  if (quant == CheckpointQuant::kNone) return q;
  if (quant == CheckpointQuant::kFp8Block) {
    q["quant_method"] = "fp8";
    q["activation_scheme"] = "dynamic";
    q["fmt"] = "e4m3";
    q["weight_block_size"] = {kGroup, kGroup};
    q["modules_to_not_convert"] = {"lm_head"};
    return q;
  }
  const bool int4 = quant == CheckpointQuant::kInt4G128;
  nlohmann::ordered_json weights;
  weights["num_bits"] = int4 ? 4 : 8;
  weights["type"] = "int";
  weights["symmetric"] = true;
  weights["strategy"] = int4 ? "group" : "channel";
  weights["group_size"] = int4 ? nlohmann::ordered_json(kGroup) : nlohmann::ordered_json();
  weights["dynamic"] = false;
  weights["actorder"] = nullptr;
  nlohmann::ordered_json group;
  group["targets"] = {"Linear"};
  group["format"] = "pack-quantized";
  group["weights"] = weights;
  group["input_activations"] = nullptr;
  group["output_activations"] = nullptr;
  q["quant_method"] = "compressed-tensors";
  q["format"] = "pack-quantized";
  q["quantization_status"] = "compressed";
  q["ignore"] = {"lm_head"};
  q["config_groups"] = {{"group_0", group}};
  return q;
}

}  // namespace ringserve
