#include "stage/model/testing/quantized_copy.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "absl/status/status.h"
#include "common/dtype.h"
#include "common/status_macros.h"
#include "fmt/format.h"
#include "nlohmann/json.hpp"
#include "ring/model_config.h"
#include "stage/model/quant/awq.h"
#include "stage/model/quant/mxfp4.h"
#include "stage/model/safetensors.h"
#include "stage/model/slice_weights.h"
#include "stage/model/testing/safetensors_writer.h"

namespace ringserve::testing {
namespace {

using Json = nlohmann::ordered_json;

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

template <typename T>
std::string Raw(const std::vector<T>& values) {
  std::string bytes(values.size() * sizeof(T), '\0');
  std::memcpy(bytes.data(), values.data(), bytes.size());
  return bytes;
}

float Half(float v) { return HalfToFloat(FloatToHalf(v)); }

// The stored parts of one weight and what they dequantize to.
struct Quantized {
  std::vector<TensorToWrite> parts;
  std::vector<float> dequantized;
};

Quantized Fp8Block(const std::string& m, int64_t out, int64_t in, const std::vector<float>& w,
                   int64_t block, bool ue8m0) {
  const int64_t rows = CeilDiv(out, block), cols = CeilDiv(in, block);
  std::vector<float> scales(rows * cols);
  for (int64_t rb = 0; rb < rows; ++rb) {
    for (int64_t cb = 0; cb < cols; ++cb) {
      float amax = 0;
      for (int64_t r = rb * block; r < std::min(out, (rb + 1) * block); ++r) {
        for (int64_t c = cb * block; c < std::min(in, (cb + 1) * block); ++c) {
          amax = std::max(amax, std::abs(w[r * in + c]));
        }
      }
      float s = amax > 0 ? amax / 448.0f : 1.0f;
      if (ue8m0) s = std::exp2(std::ceil(std::log2(s)));
      scales[rb * cols + cb] = s;
    }
  }
  std::vector<uint8_t> q(out * in);
  Quantized result;
  result.dequantized.resize(out * in);
  for (int64_t r = 0; r < out; ++r) {
    for (int64_t c = 0; c < in; ++c) {
      const float s = scales[(r / block) * cols + c / block];
      q[r * in + c] = FloatToFp8E4M3(w[r * in + c] / s);
      result.dequantized[r * in + c] = Fp8E4M3ToFloat(q[r * in + c]) * s;
    }
  }
  result.parts.push_back({.name = m + ".weight",
                          .dtype = DType::kF8E4M3,
                          .shape = {out, in},
                          .values = {},
                          .raw = Raw(q)});
  result.parts.push_back({.name = m + ".weight_scale_inv",
                          .dtype = DType::kF32,
                          .shape = {rows, cols},
                          .values = scales,
                          .raw = {}});
  return result;
}

Quantized CompressedFp8(const std::string& m, int64_t out, int64_t in,
                        const std::vector<float>& w) {
  Quantized result;
  result.dequantized.resize(out * in);
  std::vector<float> scales(out);
  std::vector<uint8_t> q(out * in);
  for (int64_t r = 0; r < out; ++r) {
    float amax = 0;
    for (int64_t c = 0; c < in; ++c) amax = std::max(amax, std::abs(w[r * in + c]));
    scales[r] = amax > 0 ? amax / 448.0f : 1.0f;
    for (int64_t c = 0; c < in; ++c) {
      q[r * in + c] = FloatToFp8E4M3(w[r * in + c] / scales[r]);
      result.dequantized[r * in + c] = Fp8E4M3ToFloat(q[r * in + c]) * scales[r];
    }
  }
  result.parts = {{.name = m + ".weight",
                   .dtype = DType::kF8E4M3,
                   .shape = {out, in},
                   .values = {},
                   .raw = Raw(q)},
                  {.name = m + ".weight_scale",
                   .dtype = DType::kF32,
                   .shape = {out, 1},
                   .values = scales,
                   .raw = {}}};
  return result;
}

Quantized CompressedInt4(const std::string& m, int64_t out, int64_t in, const std::vector<float>& w,
                         int64_t group) {
  const int64_t groups = CeilDiv(in, group), words = CeilDiv(in, 8);
  std::vector<float> scales(out * groups);
  std::vector<uint32_t> packed(out * words, 0);
  Quantized result;
  result.dequantized.resize(out * in);
  for (int64_t r = 0; r < out; ++r) {
    for (int64_t g = 0; g < groups; ++g) {
      float amax = 0;
      for (int64_t c = g * group; c < std::min(in, (g + 1) * group); ++c) {
        amax = std::max(amax, std::abs(w[r * in + c]));
      }
      scales[r * groups + g] = amax > 0 ? amax / 7.0f : 1.0f;
    }
    for (int64_t c = 0; c < in; ++c) {
      const float s = scales[r * groups + c / group];
      const int q = static_cast<int>(std::clamp(std::nearbyint(w[r * in + c] / s), -8.0f, 7.0f));
      packed[r * words + c / 8] |= static_cast<uint32_t>(q + 8) << (4 * (c % 8));
      result.dequantized[r * in + c] = static_cast<float>(q) * s;
    }
  }
  result.parts = {{.name = m + ".weight_packed",
                   .dtype = DType::kI32,
                   .shape = {out, words},
                   .values = {},
                   .raw = Raw(packed)},
                  {.name = m + ".weight_scale",
                   .dtype = DType::kF32,
                   .shape = {out, groups},
                   .values = scales,
                   .raw = {}},
                  {.name = m + ".weight_shape",
                   .dtype = DType::kI64,
                   .shape = {2},
                   .values = {},
                   .raw = Raw(std::vector<int64_t>{out, in})}};
  return result;
}

// GPTQ (symmetric, zero 8 stored as 7) and AWQ (min/max zero points): per (group of inputs,
// output) scales in fp16.
Quantized GptqOrAwq(const std::string& m, int64_t out, int64_t in, const std::vector<float>& w,
                    int64_t group, bool awq) {
  const int64_t groups = in / group;
  std::vector<float> scales(groups * out);
  std::vector<int> zeros(groups * out);
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t o = 0; o < out; ++o) {
      float lo = 0, hi = 0, amax = 0;
      for (int64_t i = g * group; i < (g + 1) * group; ++i) {
        lo = std::min(lo, w[o * in + i]);
        hi = std::max(hi, w[o * in + i]);
        amax = std::max(amax, std::abs(w[o * in + i]));
      }
      float s = awq ? (hi - lo) / 15.0f : amax / 7.0f;
      s = Half(s > 0 ? s : 1.0f);
      scales[g * out + o] = s;
      zeros[g * out + o] =
          awq ? static_cast<int>(std::clamp(-std::nearbyint(lo / s), 0.0f, 15.0f)) : 8;
    }
  }
  std::array<int, 8> position{};  // AWQ: the field holding column j * 8 + p
  for (int k = 0; k < 8; ++k) position[quant::kAwqOrder[k]] = k;
  Quantized result;
  result.dequantized.resize(out * in);
  std::vector<uint32_t> qweight(awq ? in * (out / 8) : (in / 8) * out, 0);
  std::vector<uint32_t> qzeros(groups * (out / 8), 0);
  for (int64_t o = 0; o < out; ++o) {
    for (int64_t i = 0; i < in; ++i) {
      const int64_t g = i / group;
      const float s = scales[g * out + o];
      const int z = zeros[g * out + o];
      const int q = static_cast<int>(
          std::clamp(std::nearbyint(w[o * in + i] / s) + static_cast<float>(z), 0.0f, 15.0f));
      if (awq) {
        qweight[i * (out / 8) + o / 8] |= static_cast<uint32_t>(q) << (4 * position[o % 8]);
      } else {
        qweight[(i / 8) * out + o] |= static_cast<uint32_t>(q) << (4 * (i % 8));
      }
      result.dequantized[o * in + i] = static_cast<float>(q - z) * s;
    }
  }
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t o = 0; o < out; ++o) {
      const int stored = awq ? zeros[g * out + o] : zeros[g * out + o] - 1;
      const int field = awq ? position[o % 8] : static_cast<int>(o % 8);
      qzeros[g * (out / 8) + o / 8] |= static_cast<uint32_t>(stored) << (4 * field);
    }
  }
  result.parts = {
      {.name = m + ".qweight",
       .dtype = DType::kI32,
       .shape = awq ? std::vector<int64_t>{in, out / 8} : std::vector<int64_t>{in / 8, out},
       .values = {},
       .raw = Raw(qweight)},
      {.name = m + ".qzeros",
       .dtype = DType::kI32,
       .shape = {groups, out / 8},
       .values = {},
       .raw = Raw(qzeros)},
      {.name = m + ".scales",
       .dtype = DType::kF16,
       .shape = {groups, out},
       .values = scales,
       .raw = {}}};
  return result;
}

// gpt-oss's stacked experts w [E, in, out] as MXFP4 [E, out, in / 32, 16]; dequantized in w's
// layout.
Quantized Mxfp4(const std::string& name, const std::vector<int64_t>& shape,
                const std::vector<float>& w) {
  const int64_t e = shape[0], in = shape[1], out = shape[2], groups = in / 32;
  std::vector<uint8_t> blocks(e * out * groups * 16, 0), scales(e * out * groups);
  Quantized result;
  result.dequantized.resize(w.size());
  for (int64_t x = 0; x < e; ++x) {
    for (int64_t o = 0; o < out; ++o) {
      for (int64_t g = 0; g < groups; ++g) {
        auto at = [&](int64_t k) { return (x * in + g * 32 + k) * out + o; };
        float amax = 0;
        for (int k = 0; k < 32; ++k) amax = std::max(amax, std::abs(w[at(k)]));
        const int exponent =
            amax > 0 ? std::clamp(static_cast<int>(std::ceil(std::log2(amax / 6.0f))), -127, 127)
                     : -127;
        const int64_t b = (x * out + o) * groups + g;
        scales[b] = static_cast<uint8_t>(exponent + 127);
        for (int k = 0; k < 32; ++k) {
          const float v = std::ldexp(w[at(k)], -exponent);
          int best = 0;
          for (int c = 1; c < 16; ++c) {
            if (std::abs(quant::kFp4Values[c] - v) < std::abs(quant::kFp4Values[best] - v))
              best = c;
          }
          blocks[b * 16 + k / 2] |= static_cast<uint8_t>(best << (4 * (k % 2)));
          result.dequantized[at(k)] = std::ldexp(quant::kFp4Values[best], exponent);
        }
      }
    }
  }
  result.parts = {{.name = name + "_blocks",
                   .dtype = DType::kU8,
                   .shape = {e, out, groups, 16},
                   .values = {},
                   .raw = Raw(blocks)},
                  {.name = name + "_scales",
                   .dtype = DType::kU8,
                   .shape = {e, out, groups},
                   .values = {},
                   .raw = Raw(scales)}};
  return result;
}

bool IsQuantizedName(const std::string& name, size_t rank, CopyFormat format) {
  if (!name.starts_with("model.layers.")) return false;
  if (format == CopyFormat::kMxfp4) {
    return rank == 3 && (name.ends_with(".mlp.experts.gate_up_proj") ||
                         name.ends_with(".mlp.experts.down_proj"));
  }
  if (rank != 2 || name.ends_with("eh_proj.weight")) return false;
  return name.ends_with("_proj.weight") || name.ends_with("_proj_with_mqa.weight") ||
         name.ends_with(".w1.weight") || name.ends_with(".w2.weight") ||
         name.ends_with(".w3.weight");
}

Json QuantizationConfig(const CopyOptions& o) {
  Json keep = Json::array();
  for (const std::string& m : o.keep_float) keep.push_back(m);
  switch (o.format) {
    case CopyFormat::kFp8Block:
    case CopyFormat::kFp8BlockUe8m0: {
      Json q = {{"quant_method", "fp8"},
                {"fmt", "e4m3"},
                {"activation_scheme", "dynamic"},
                {"weight_block_size", {o.block, o.block}},
                {"modules_to_not_convert", keep}};
      if (o.format == CopyFormat::kFp8BlockUe8m0) q["scale_fmt"] = "ue8m0";
      return q;
    }
    case CopyFormat::kCompressedInt4:
    case CopyFormat::kCompressedFp8: {
      const bool fp8 = o.format == CopyFormat::kCompressedFp8;
      Json weights = {{"num_bits", fp8 ? 8 : 4},
                      {"type", fp8 ? "float" : "int"},
                      {"symmetric", true},
                      {"strategy", fp8 ? "channel" : "group"},
                      {"dynamic", false}};
      if (!fp8) weights["group_size"] = o.block;
      keep.push_back("lm_head");
      return {{"quant_method", "compressed-tensors"},
              {"format", fp8 ? "float-quantized" : "pack-quantized"},
              {"quantization_status", "compressed"},
              {"ignore", keep},
              {"config_groups",
               {{"group_0",
                 {{"targets", {"Linear"}},
                  {"format", fp8 ? "float-quantized" : "pack-quantized"},
                  {"input_activations", nullptr},
                  {"output_activations", nullptr},
                  {"weights", weights}}}}}};
    }
    case CopyFormat::kGptq4:
      return {{"quant_method", "gptq"}, {"bits", 4},   {"group_size", o.block},
              {"desc_act", false},      {"sym", true}, {"checkpoint_format", "gptq"}};
    case CopyFormat::kAwq4:
      return {{"quant_method", "awq"}, {"bits", 4},          {"group_size", o.block},
              {"version", "gemm"},     {"zero_point", true}, {"modules_to_not_convert", keep}};
    case CopyFormat::kMxfp4:
      keep.push_back("model.layers.*.self_attn");
      keep.push_back("model.layers.*.mlp.router");
      keep.push_back("model.embed_tokens");
      keep.push_back("lm_head");
      return {{"quant_method", "mxfp4"}, {"modules_to_not_convert", keep}};
  }
  return nullptr;
}

absl::StatusOr<Json> ReadJson(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(fmt::format("cannot read {}", path));
  std::stringstream text;
  text << in.rdbuf();
  return Json::parse(text.str());
}

}  // namespace

absl::StatusOr<QuantizedCopy> WriteQuantizedCopy(const std::string& src_dir,
                                                 const CopyOptions& options,
                                                 const std::string& quant_dir,
                                                 const std::string& float_dir) {
  RS_ASSIGN_OR_RETURN(Json config, ReadJson(src_dir + "/config.json"));
  if (config.contains("quantization_config")) {
    return absl::InvalidArgumentError(fmt::format("{} is already quantized", src_dir));
  }
  RS_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsModel> weights, SafetensorsModel::Open(src_dir));
  QuantizedCopy copy;
  std::vector<TensorToWrite> quantized_tensors, float_tensors;
  for (const std::string& name : weights->TensorNames()) {
    RS_ASSIGN_OR_RETURN(TensorView view, weights->GetAnyShape(name));
    const std::vector<int64_t> shape = view.info->shape;
    RS_ASSIGN_OR_RETURN(std::vector<float> values, weights->ReadFloat(name, shape));
    std::string module = name;
    if (module.ends_with(".weight")) module.resize(module.size() - 7);
    const bool keep =
        std::any_of(options.keep_float.begin(), options.keep_float.end(),
                    [&](const std::string& k) { return module.find(k) != std::string::npos; });
    if (keep || !IsQuantizedName(name, shape.size(), options.format)) {
      quantized_tensors.push_back(
          {.name = name, .dtype = DType::kF32, .shape = shape, .values = values, .raw = {}});
      float_tensors.push_back(quantized_tensors.back());
      continue;
    }
    Quantized q;
    const int64_t out = shape[0], in = shape.size() > 1 ? shape[1] : 0;
    switch (options.format) {
      case CopyFormat::kFp8Block:
      case CopyFormat::kFp8BlockUe8m0:
        q = Fp8Block(module, out, in, values, options.block,
                     options.format == CopyFormat::kFp8BlockUe8m0);
        break;
      case CopyFormat::kCompressedInt4:
        q = CompressedInt4(module, out, in, values, options.block);
        break;
      case CopyFormat::kCompressedFp8:
        q = CompressedFp8(module, out, in, values);
        break;
      case CopyFormat::kGptq4:
      case CopyFormat::kAwq4:
        if (in % options.block != 0 || out % 8 != 0 || in % 8 != 0) {
          return absl::InvalidArgumentError(fmt::format("{} [{}, {}] does not pack in groups of {}",
                                                        name, out, in, options.block));
        }
        q = GptqOrAwq(module, out, in, values, options.block, options.format == CopyFormat::kAwq4);
        break;
      case CopyFormat::kMxfp4:
        if (shape[1] % 32 != 0) {
          return absl::InvalidArgumentError(
              fmt::format("{}: {} inputs are not MXFP4 blocks of 32", name, shape[1]));
        }
        q = Mxfp4(name, shape, values);
        break;
    }
    for (TensorToWrite& part : q.parts) quantized_tensors.push_back(std::move(part));
    float_tensors.push_back(
        {.name = name, .dtype = DType::kF32, .shape = shape, .values = q.dequantized, .raw = {}});
    copy.dequantized[name] = std::move(q.dequantized);
  }
  auto write = [&](const std::string& dir, const std::vector<TensorToWrite>& tensors,
                   bool quantized) -> absl::Status {
    std::filesystem::create_directories(dir);
    Json c = config;
    if (quantized) c["quantization_config"] = QuantizationConfig(options);
    RS_RETURN_IF_ERROR(WriteFile(dir + "/config.json", c.dump(2)));
    if (std::filesystem::exists(src_dir + "/generation_config.json")) {
      RS_RETURN_IF_ERROR(
          CopyFile(src_dir + "/generation_config.json", dir + "/generation_config.json"));
    }
    return WriteFile(dir + "/model.safetensors", SafetensorsBytes(tensors));
  };
  RS_RETURN_IF_ERROR(write(quant_dir, quantized_tensors, true));
  RS_RETURN_IF_ERROR(write(float_dir, float_tensors, false));
  return copy;
}

absl::Status WriteMxfp4ReadyGptOss(const std::string& gpt_oss_fixture, const std::string& dir) {
  RS_ASSIGN_OR_RETURN(Json j, ReadJson(gpt_oss_fixture + "/config.json"));
  j["intermediate_size"] = 32;
  RS_ASSIGN_OR_RETURN(const ModelConfig config, ParseModelConfig(j.dump()));
  std::vector<TensorSpec> specs = {EmbeddingSpec(config),
                                   FinalNormSpec(config),
                                   {"lm_head.weight", {config.vocab_size, config.hidden_size}}};
  for (int layer = 0; layer < config.num_layers; ++layer) {
    for (TensorSpec& spec : LayerTensorSpecs(config, layer)) specs.push_back(std::move(spec));
  }
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 0.15f);
  std::vector<TensorToWrite> tensors;
  for (const TensorSpec& spec : specs) {
    int64_t n = 1;
    for (int64_t d : spec.shape) n *= d;
    std::vector<float> values(n);
    const bool norm = spec.name.find("norm") != std::string::npos;
    for (float& v : values) v = norm ? 1.0f + normal(rng) : normal(rng);
    tensors.push_back({.name = spec.name,
                       .dtype = DType::kF32,
                       .shape = spec.shape,
                       .values = values,
                       .raw = {}});
  }
  std::filesystem::create_directories(dir);
  RS_RETURN_IF_ERROR(WriteFile(dir + "/config.json", j.dump(2)));
  return WriteFile(dir + "/model.safetensors", SafetensorsBytes(tensors));
}

}  // namespace ringserve::testing
