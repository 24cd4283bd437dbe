#include "stage/model/packed_weights.h"

#include <cmath>

#include "absl/status/status.h"
#include "common/dtype.h"
#include "common/status_macros.h"
#include "fmt/format.h"
#include "stage/model/quant/mxfp4.h"
#include "stage/model/quant/quant_tensor.h"
#include "stage/model/quantized_weights.h"

namespace ringserve {
namespace {

using quant::CompressedScheme;
using quant::PackedFormat;
using quant::QuantMethod;

// What to pack into: format, the stored scale tensor, and how its grid maps onto rows.
struct ScaleSource {
  PackedFormat format = PackedFormat::kInt8;
  std::string scale_suffix;
  int64_t block_rows = 1, block_cols = 1;  // the stored grid's blocks (row-major [R, C])
  bool transposed = false;                 // stored [groups, out] (gptq, awq)
};

std::optional<ScaleSource> SourceOf(const quant::QuantConfig& q,
                                    const quant::LinearStorage& storage, int64_t out, int64_t in,
                                    std::string* why_not) {
  auto int_format = [&](int bits) -> std::optional<PackedFormat> {
    if (bits == 4) return PackedFormat::kInt4;
    if (bits == 8) return PackedFormat::kInt8;
    *why_not = fmt::format("{}-bit integers", bits);
    return std::nullopt;
  };
  switch (storage.method) {
    case QuantMethod::kFp8:
      return ScaleSource{PackedFormat::kFp8, "weight_scale_inv", q.block_rows, q.block_cols};
    case QuantMethod::kCompressedTensors: {
      const CompressedScheme& s = *storage.scheme;
      const quant::Fp8BlockGrid grid = GridOf(s, out, in);
      if (s.storage == CompressedScheme::Storage::kFloat) {
        return ScaleSource{PackedFormat::kFp8, "weight_scale", grid.block_rows, grid.block_cols};
      }
      if (s.storage == CompressedScheme::Storage::kDense) {
        *why_not = "dense storage";
        return std::nullopt;
      }
      const std::optional<PackedFormat> f = int_format(s.num_bits);
      if (!f) return std::nullopt;
      return ScaleSource{*f, "weight_scale", grid.block_rows, grid.block_cols};
    }
    case QuantMethod::kGptq:
    case QuantMethod::kAwq: {
      const std::optional<PackedFormat> f = int_format(q.bits);
      if (!f) return std::nullopt;
      return ScaleSource{*f, "scales", 1, q.group_size > 0 ? q.group_size : in, true};
    }
    case QuantMethod::kNone:
    case QuantMethod::kMxfp4:
      break;
  }
  *why_not = fmt::format("quant_method {}", quant::QuantMethodName(storage.method));
  return std::nullopt;
}

// PackExact's answer as a PackedWeight: a value it cannot hold exactly (FailedPrecondition)
// means "keep the dequantized matrix", with the reason; other errors pass through.
absl::StatusOr<PackedWeight> FromPackExact(absl::StatusOr<quant::PackedMatrix> packed) {
  PackedWeight result;
  if (packed.status().code() == absl::StatusCode::kFailedPrecondition) {
    result.why_not = std::string(packed.status().message());
    return result;
  }
  RS_RETURN_IF_ERROR(packed.status());
  result.matrix = *std::move(packed);
  return result;
}

}  // namespace

absl::StatusOr<PackedWeight> ReadPackedWeight(SafetensorsModel& weights,
                                              const quant::QuantConfig& quant,
                                              const TensorSpec& spec) {
  PackedWeight result;
  if (!IsQuantizedWeight(quant, spec) || StoredUnquantized(weights, quant, spec)) {
    result.why_not = "not quantized";
    return result;
  }
  const std::string module = spec.name.substr(0, spec.name.size() - std::string(".weight").size());
  const int64_t out = spec.shape[0], in = spec.shape[1];
  const std::optional<ScaleSource> source =
      SourceOf(quant, quant::StorageOf(quant, module), out, in, &result.why_not);
  if (!source) return result;
  RS_ASSIGN_OR_RETURN(std::vector<float> w, ReadWeightFloat(weights, quant, spec));
  RS_ASSIGN_OR_RETURN(TensorView view, weights.GetAnyShape(module + "." + source->scale_suffix));
  const quant::QTensor scale{.name = view.info->name,
                             .dtype = view.info->dtype,
                             .shape = view.info->shape,
                             .bytes = view.bytes};
  RS_ASSIGN_OR_RETURN(std::vector<float> stored, quant::ReadScales(scale));
  const int64_t groups = quant::CeilDiv(in, source->block_cols);
  const int64_t grid_rows = source->transposed ? 1 : quant::CeilDiv(out, source->block_rows);
  if (static_cast<int64_t>(stored.size()) !=
      (source->transposed ? groups * out : grid_rows * groups)) {
    return absl::InvalidArgumentError(
        fmt::format("tensor \"{}\" holds {} scales, expected {}", scale.name, stored.size(),
                    source->transposed ? groups * out : grid_rows * groups));
  }
  std::vector<float> scales(out * groups);
  for (int64_t r = 0; r < out; ++r) {
    for (int64_t g = 0; g < groups; ++g) {
      scales[r * groups + g] =
          source->transposed ? stored[g * out + r] : stored[(r / source->block_rows) * groups + g];
    }
  }
  return FromPackExact(quant::PackExact(w, out, in, source->format, source->block_cols, scales));
}

absl::StatusOr<PackedWeight> ReadPackedMxfp4Expert(SafetensorsModel& weights,
                                                   const TensorSpec& spec, int64_t expert) {
  RS_ASSIGN_OR_RETURN(Mxfp4Expert stored, Mxfp4ExpertTensors(weights, spec, expert));
  const int64_t out = stored.blocks.shape[0], in = stored.blocks.shape[1] * 32;
  RS_ASSIGN_OR_RETURN(std::vector<float> w, quant::DequantizeMxfp4(stored.blocks, stored.scales));
  std::vector<float> scales(stored.scales.bytes.size());
  // e8m0 255 (NaN) held as 0: its block packs only if all its values are 0 (the rule gives 0 for
  // the code 0 and infinities otherwise), so that the kernels never multiply by NaN.
  for (size_t i = 0; i < scales.size(); ++i) {
    const float v = E8M0ToFloat(stored.scales.bytes[i]);
    scales[i] = std::isfinite(v) ? v : 0.0f;
  }
  return FromPackExact(quant::PackExact(w, out, in, PackedFormat::kFp4, 32, scales));
}

}  // namespace ringserve
