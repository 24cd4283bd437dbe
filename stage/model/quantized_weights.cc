#include "stage/model/quantized_weights.h"

#include <algorithm>
#include <optional>

#include "absl/status/status.h"
#include "common/status_macros.h"
#include "fmt/format.h"
#include "fmt/ranges.h"
#include "stage/model/quant/awq.h"
#include "stage/model/quant/compressed_tensors.h"
#include "stage/model/quant/fp8_block.h"
#include "stage/model/quant/gptq.h"
#include "stage/model/quant/mxfp4.h"

namespace ringserve {
namespace {

using quant::CompressedScheme;
using quant::QTensor;
using quant::QuantConfig;
using quant::QuantMethod;

constexpr std::string_view kWeightSuffix = ".weight";

// "model.layers.3.mlp.down_proj.weight" -> "model.layers.3.mlp.down_proj"; gpt-oss's stacked
// experts are named as their module ("model.layers.3.mlp.experts.down_proj").
std::string ModuleOf(const TensorSpec& spec) {
  if (spec.stacked_experts) return spec.name;
  return spec.name.substr(0, spec.name.size() - kWeightSuffix.size());
}

class ModuleReader {
 public:
  ModuleReader(SafetensorsModel& weights, std::string module)
      : weights_(weights), module_(std::move(module)) {}

  absl::StatusOr<QTensor> Get(const std::string& suffix) {
    RS_ASSIGN_OR_RETURN(TensorView view, weights_.GetAnyShape(module_ + "." + suffix));
    return QTensor{.name = view.info->name,
                   .dtype = view.info->dtype,
                   .shape = view.info->shape,
                   .bytes = view.bytes};
  }
  bool Has(const std::string& suffix) const { return weights_.Contains(module_ + "." + suffix); }

 private:
  SafetensorsModel& weights_;
  std::string module_;
};

}  // namespace

quant::Fp8BlockGrid GridOf(const CompressedScheme& s, int64_t out, int64_t in) {
  switch (s.strategy) {
    case CompressedScheme::Strategy::kTensor:
      return {out, in};
    case CompressedScheme::Strategy::kChannel:
      return {1, in};
    case CompressedScheme::Strategy::kGroup:
      return {1, s.group_size};
    case CompressedScheme::Strategy::kBlock:
      return {s.block_rows, s.block_cols};
  }
  return {out, in};
}

namespace {

absl::StatusOr<std::vector<int8_t>> ToInt8(const std::vector<int64_t>& values, const QTensor& t) {
  std::vector<int8_t> out(values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    if (values[i] < -128 || values[i] > 127) {
      return absl::InvalidArgumentError(
          fmt::format("tensor \"{}\": value {} at {} is outside int8", t.name, values[i], i));
    }
    out[i] = static_cast<int8_t>(values[i]);
  }
  return out;
}

absl::StatusOr<std::vector<float>> ReadCompressed(ModuleReader& m, const CompressedScheme& s,
                                                  int64_t out, int64_t in) {
  const quant::Fp8BlockGrid grid = GridOf(s, out, in);
  const std::vector<int64_t> shape = {out, in};
  if (s.storage == CompressedScheme::Storage::kFloat) {
    RS_ASSIGN_OR_RETURN(QTensor weight, m.Get("weight"));
    RS_RETURN_IF_ERROR(quant::CheckShape(weight, shape));
    RS_ASSIGN_OR_RETURN(QTensor scale, m.Get("weight_scale"));
    return quant::DequantizeFp8(weight, scale, grid);
  }
  quant::IntDequantArgs args{.rows = out, .cols = in, .grid = grid, .zero_points = {}, .g_idx = {}};
  const int64_t grid_rows = quant::CeilDiv(out, grid.block_rows);
  const int64_t grid_cols = quant::CeilDiv(in, grid.block_cols);
  std::vector<int8_t> q;
  if (s.storage == CompressedScheme::Storage::kPacked) {
    RS_ASSIGN_OR_RETURN(QTensor packed, m.Get("weight_packed"));
    RS_ASSIGN_OR_RETURN(q, quant::UnpackCompressedInt32(packed, s.num_bits, out, in, 1));
    if (m.Has("weight_shape")) {
      RS_ASSIGN_OR_RETURN(QTensor stored_shape, m.Get("weight_shape"));
      RS_ASSIGN_OR_RETURN(std::vector<int64_t> dims, quant::ReadIntegers(stored_shape));
      if (dims != shape) {
        return absl::InvalidArgumentError(
            fmt::format("tensor \"{}\" says [{}], the model needs [{}, {}]", stored_shape.name,
                        fmt::join(dims, ", "), out, in));
      }
    }
  } else {
    RS_ASSIGN_OR_RETURN(QTensor weight, m.Get("weight"));
    RS_RETURN_IF_ERROR(quant::CheckDType(weight, {DType::kI8}));
    RS_RETURN_IF_ERROR(quant::CheckShape(weight, shape));
    q.assign(reinterpret_cast<const int8_t*>(weight.bytes.data()),
             reinterpret_cast<const int8_t*>(weight.bytes.data()) + weight.bytes.size());
  }
  if (!s.symmetric) {
    RS_ASSIGN_OR_RETURN(QTensor zero, m.Get("weight_zero_point"));
    if (zero.dtype == DType::kI32) {  // packed along the rows (pack-quantized group / channel)
      RS_ASSIGN_OR_RETURN(args.zero_points,
                          quant::UnpackCompressedInt32(zero, s.num_bits, grid_rows, grid_cols, 0));
    } else {
      RS_RETURN_IF_ERROR(quant::CheckGridShape(zero, grid_rows, grid_cols, "zero points"));
      RS_ASSIGN_OR_RETURN(std::vector<int64_t> values, quant::ReadIntegers(zero));
      RS_ASSIGN_OR_RETURN(args.zero_points, ToInt8(values, zero));
    }
  }
  if (s.strategy == CompressedScheme::Strategy::kGroup && m.Has("weight_g_idx")) {
    RS_ASSIGN_OR_RETURN(QTensor g_idx, m.Get("weight_g_idx"));
    RS_RETURN_IF_ERROR(quant::CheckShape(g_idx, std::vector<int64_t>{in}));
    RS_ASSIGN_OR_RETURN(args.g_idx, quant::ReadIntegers(g_idx));
  }
  RS_ASSIGN_OR_RETURN(QTensor scale, m.Get("weight_scale"));
  return quant::DequantizeCompressedInt(q, scale, args);
}

// gpt-oss's stacked experts from MXFP4: the stored [E, out, in] (rows first) transposed to the
// bf16 checkpoint's [E, in, out] = spec.shape, as transformers' convert_moe_packed_tensors does.
// One expert at a time, so the host holds the result and one expert's values.
absl::StatusOr<std::vector<float>> ReadMxfp4Experts(SafetensorsModel& weights,
                                                    const TensorSpec& spec) {
  const int64_t e = spec.shape[0], in = spec.shape[1], out = spec.shape[2];
  std::vector<float> w(static_cast<size_t>(e * in * out));
  for (int64_t x = 0; x < e; ++x) {
    RS_ASSIGN_OR_RETURN(Mxfp4Expert stored, Mxfp4ExpertTensors(weights, spec, x));
    RS_ASSIGN_OR_RETURN(std::vector<float> rows_first,
                        quant::DequantizeMxfp4(stored.blocks, stored.scales));
    float* dst = w.data() + x * in * out;
    for (int64_t o = 0; o < out; ++o) {
      for (int64_t i = 0; i < in; ++i) dst[i * out + o] = rows_first[o * in + i];
    }
  }
  return w;
}

absl::StatusOr<std::vector<float>> ReadQuantized(SafetensorsModel& weights,
                                                 const QuantConfig& config,
                                                 const quant::LinearStorage& storage,
                                                 const TensorSpec& spec) {
  if (spec.stacked_experts) {
    if (storage.method == QuantMethod::kMxfp4) return ReadMxfp4Experts(weights, spec);
    return absl::InvalidArgumentError(fmt::format(
        "tensor \"{}\": gpt-oss's stacked experts are read quantized only as quant_method mxfp4 "
        "(or list them in modules_to_not_convert)",
        spec.name));
  }
  ModuleReader m(weights, ModuleOf(spec));
  const int64_t out = spec.shape[0], in = spec.shape[1];
  switch (storage.method) {
    case QuantMethod::kFp8: {
      RS_ASSIGN_OR_RETURN(QTensor weight, m.Get("weight"));
      RS_RETURN_IF_ERROR(quant::CheckShape(weight, spec.shape));
      RS_ASSIGN_OR_RETURN(QTensor scale, m.Get("weight_scale_inv"));
      return quant::DequantizeFp8(weight, scale, {config.block_rows, config.block_cols});
    }
    case QuantMethod::kCompressedTensors:
      return ReadCompressed(m, *storage.scheme, out, in);
    case QuantMethod::kGptq: {
      RS_ASSIGN_OR_RETURN(QTensor qweight, m.Get("qweight"));
      RS_ASSIGN_OR_RETURN(QTensor qzeros, m.Get("qzeros"));
      RS_ASSIGN_OR_RETURN(QTensor scales, m.Get("scales"));
      std::optional<QTensor> g_idx;
      if (m.Has("g_idx")) {
        RS_ASSIGN_OR_RETURN(g_idx, m.Get("g_idx"));
      } else if (config.desc_act) {
        return absl::NotFoundError(fmt::format(
            "tensor \"{}.g_idx\" not found: GPTQ with desc_act needs it", ModuleOf(spec)));
      }
      return quant::DequantizeGptq(qweight, qzeros, scales, g_idx ? &*g_idx : nullptr,
                                   {.out_features = out,
                                    .in_features = in,
                                    .bits = config.bits,
                                    .group_size = config.group_size,
                                    .zero_offset = config.gptq_zero_offset});
    }
    case QuantMethod::kAwq: {
      RS_ASSIGN_OR_RETURN(QTensor qweight, m.Get("qweight"));
      RS_ASSIGN_OR_RETURN(QTensor qzeros, m.Get("qzeros"));
      RS_ASSIGN_OR_RETURN(QTensor scales, m.Get("scales"));
      return quant::DequantizeAwq(
          qweight, qzeros, scales,
          {.out_features = out, .in_features = in, .group_size = config.group_size});
    }
    case QuantMethod::kNone:
    case QuantMethod::kMxfp4:
      break;
  }
  return absl::InternalError(fmt::format("{}: no dequantization for quant_method {}", spec.name,
                                         quant::QuantMethodName(storage.method)));
}

}  // namespace

bool IsQuantizedWeight(const quant::QuantConfig& quant, const TensorSpec& spec) {
  const bool linear = spec.linear && spec.shape.size() == 2 && spec.name.ends_with(kWeightSuffix);
  if (!linear && !(spec.stacked_experts && spec.shape.size() == 3)) return false;
  return quant::StorageOf(quant, ModuleOf(spec)).method != QuantMethod::kNone;
}

bool StoredUnquantized(SafetensorsModel& weights, const quant::QuantConfig& quant,
                       const TensorSpec& spec) {
  if (quant.method != QuantMethod::kFp8 || spec.stacked_experts) return false;
  absl::StatusOr<TensorView> view = weights.GetAnyShape(spec.name);
  if (!view.ok()) return false;
  const DType dtype = view->info->dtype;
  return dtype == DType::kF32 || dtype == DType::kF16 || dtype == DType::kBF16;
}

absl::StatusOr<std::vector<float>> ReadWeightFloat(SafetensorsModel& weights,
                                                   const quant::QuantConfig& quant,
                                                   const TensorSpec& spec) {
  if (!IsQuantizedWeight(quant, spec) || StoredUnquantized(weights, quant, spec)) {
    return weights.ReadFloat(spec.name, spec.shape);
  }
  const quant::LinearStorage storage = quant::StorageOf(quant, ModuleOf(spec));
  absl::StatusOr<std::vector<float>> w = ReadQuantized(weights, quant, storage, spec);
  if (!w.ok()) {
    return absl::Status(
        w.status().code(),
        fmt::format("{} (quant_method {}{}{})", std::string(w.status().message()),
                    quant::QuantMethodName(storage.method), storage.scheme ? ", config group " : "",
                    storage.scheme ? storage.scheme->group_name : ""));
  }
  return w;
}

absl::StatusOr<Mxfp4Expert> Mxfp4ExpertTensors(SafetensorsModel& weights, const TensorSpec& spec,
                                               int64_t expert) {
  const int64_t e = spec.shape[0], in = spec.shape[1], out = spec.shape[2];
  RS_ASSIGN_OR_RETURN(TensorView blocks_view, weights.GetAnyShape(spec.name + "_blocks"));
  RS_ASSIGN_OR_RETURN(TensorView scales_view, weights.GetAnyShape(spec.name + "_scales"));
  const std::vector<int64_t>& bshape = blocks_view.info->shape;
  const std::vector<int64_t>& sshape = scales_view.info->shape;
  if (DTypeSize(blocks_view.info->dtype) != 1 || DTypeSize(scales_view.info->dtype) != 1 ||
      bshape.size() != 4 || bshape[0] != e || bshape[1] != out || bshape[2] * 32 != in ||
      bshape[3] != 16 || sshape != std::vector<int64_t>{e, out, bshape[2]}) {
    return absl::InvalidArgumentError(fmt::format(
        "MXFP4 tensors \"{0}_blocks\" [{1}] / \"{0}_scales\" [{2}] do not hold [{3}, {4}, {5}] "
        "as [E, out, in / 32, 16] / [E, out, in / 32] of U8",
        spec.name, fmt::join(bshape, ", "), fmt::join(sshape, ", "), e, out, in));
  }
  if (expert < 0 || expert >= e) {
    return absl::InvalidArgumentError(
        fmt::format("MXFP4 tensor \"{}\": expert {} of {}", spec.name, expert, e));
  }
  const int64_t block_bytes = out * bshape[2] * 16, scale_bytes = out * bshape[2];
  return Mxfp4Expert{
      .blocks = {.name = blocks_view.info->name,
                 .dtype = blocks_view.info->dtype,
                 .shape = {out, bshape[2], 16},
                 .bytes = blocks_view.bytes.subspan(expert * block_bytes, block_bytes)},
      .scales = {.name = scales_view.info->name,
                 .dtype = scales_view.info->dtype,
                 .shape = {out, bshape[2]},
                 .bytes = scales_view.bytes.subspan(expert * scale_bytes, scale_bytes)}};
}

absl::StatusOr<std::vector<float>> ReadMxfp4Float(SafetensorsModel& weights,
                                                  const std::string& name,
                                                  std::span<const int64_t> expected_shape) {
  auto q = [&](const std::string& suffix) -> absl::StatusOr<QTensor> {
    RS_ASSIGN_OR_RETURN(TensorView view, weights.GetAnyShape(name + suffix));
    return QTensor{.name = view.info->name,
                   .dtype = view.info->dtype,
                   .shape = view.info->shape,
                   .bytes = view.bytes};
  };
  RS_ASSIGN_OR_RETURN(QTensor blocks, q("_blocks"));
  RS_ASSIGN_OR_RETURN(QTensor scales, q("_scales"));
  std::vector<int64_t> shape(blocks.shape.begin(), blocks.shape.end());
  if (shape.size() >= 2) {
    shape.pop_back();
    shape.back() *= 32;
  }
  if (!std::equal(shape.begin(), shape.end(), expected_shape.begin(), expected_shape.end())) {
    return absl::InvalidArgumentError(fmt::format(
        "MXFP4 tensor \"{}_blocks\" [{}] dequantizes to [{}], expected [{}]", name,
        fmt::join(blocks.shape, ", "), fmt::join(shape, ", "), fmt::join(expected_shape, ", ")));
  }
  return quant::DequantizeMxfp4(blocks, scales);
}

}  // namespace ringserve
