#include "bench/model/quant_layout.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/status/status.h"
#include "common/dtype.h"
#include "common/status_macros.h"
#include "fmt/format.h"
#include "stage/model/quant/packed_matrix.h"

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

absl::StatusOr<std::vector<StoredTensor>> QuantizeWeight(const std::string& name, int64_t out,
                                                         int64_t in, std::span<const float> values,
                                                         CheckpointQuant quant) {
  RS_ASSIGN_OR_RETURN(const std::vector<CheckpointTensor> parts,
                      QuantizedParts({.name = name, .shape = {out, in}}, quant, 0.02));
  std::vector<StoredTensor> stored;
  for (const CheckpointTensor& p : parts) {
    StoredTensor t{.name = p.name, .dtype = p.dtype.value_or(DType::kBF16), .shape = p.shape};
    t.bytes.assign(static_cast<size_t>(p.NumElements()) * DTypeSize(t.dtype), '\0');
    stored.push_back(std::move(t));
  }
  auto put = [](StoredTensor& t, int64_t i, const void* v, size_t size) {
    std::memcpy(t.bytes.data() + i * size, v, size);
  };
  if (quant == CheckpointQuant::kFp8Block) {
    StoredTensor &weight = stored[0], &scale = stored[1];
    const int64_t grid_cols = scale.shape[1];
    for (int64_t br = 0; br < scale.shape[0]; ++br) {
      for (int64_t bc = 0; bc < grid_cols; ++bc) {
        const int64_t r1 = std::min(out, (br + 1) * kGroup), c1 = std::min(in, (bc + 1) * kGroup);
        float amax = 0;
        for (int64_t r = br * kGroup; r < r1; ++r) {
          for (int64_t c = bc * kGroup; c < c1; ++c)
            amax = std::max(amax, std::fabs(values[r * in + c]));
        }
        const float s = amax > 0 ? amax / 448.0f : 1.0f;
        put(scale, br * grid_cols + bc, &s, 4);
        for (int64_t r = br * kGroup; r < r1; ++r) {
          for (int64_t c = bc * kGroup; c < c1; ++c) {
            weight.bytes[r * in + c] =
                static_cast<char>(quant::NearestE4m3(values[r * in + c] / s));
          }
        }
      }
    }
    return stored;
  }
  const int bits = quant == CheckpointQuant::kInt4G128 ? 4 : 8;
  const int64_t per_word = 32 / bits, group = quant == CheckpointQuant::kInt4G128 ? kGroup : in;
  const float qmax = static_cast<float>((1 << (bits - 1)) - 1), qmin = -qmax - 1;
  StoredTensor &packed = stored[0], &scale = stored[1], &shape = stored[2];
  for (int64_t r = 0; r < out; ++r) {
    for (int64_t g = 0; g < in / group; ++g) {
      float amax = 0;
      for (int64_t c = g * group; c < (g + 1) * group; ++c) {
        amax = std::max(amax, std::fabs(values[r * in + c]));
      }
      const uint16_t s_bits = FloatToBF16(amax > 0 ? amax / ((qmax - qmin) / 2) : 1.0f);
      put(scale, r * (in / group) + g, &s_bits, 2);
      const float s = BF16ToFloat(s_bits);
      for (int64_t c = g * group; c < (g + 1) * group; ++c) {
        const float q = std::clamp(std::nearbyint(values[r * in + c] / s), qmin, qmax);
        const uint32_t code = static_cast<uint32_t>(q - qmin);  // q + 2^(bits - 1)
        uint32_t word;
        const int64_t at = r * (in / per_word) + c / per_word;
        std::memcpy(&word, packed.bytes.data() + at * 4, 4);
        word |= code << (bits * (c % per_word));
        std::memcpy(packed.bytes.data() + at * 4, &word, 4);
      }
    }
  }
  const int64_t dims[2] = {out, in};
  put(shape, 0, dims, sizeof(dims));
  return stored;
}

}  // namespace ringserve
