#include "stage/model/kv_cache_scales.h"

#include <cmath>
#include <string>

#include "common/status_macros.h"
#include "fmt/format.h"

namespace ringserve {
namespace {

absl::StatusOr<float> ReadScale(SafetensorsModel& weights, const std::string& name) {
  RS_ASSIGN_OR_RETURN(TensorView view, weights.GetAnyShape(name));
  if (view.info->NumElements() != 1) {
    return absl::InvalidArgumentError(fmt::format(
        "{}: shape {} in {}: only one KV cache scale per layer (kv_cache_scheme strategy tensor) "
        "is supported",
        name, ShapeString(view.info->shape), view.file));
  }
  RS_ASSIGN_OR_RETURN(std::vector<float> value, weights.ReadFloat(name, view.info->shape));
  if (!std::isfinite(value[0]) || value[0] <= 0.0f) {
    return absl::InvalidArgumentError(
        fmt::format("{}: KV cache scale {} is not positive and finite", name, value[0]));
  }
  return value[0];
}

}  // namespace

absl::StatusOr<KvCacheScales> LoadKvCacheScales(SafetensorsModel& weights, LayerRange layers) {
  KvCacheScales scales;
  for (int layer = layers.first; layer < layers.last; ++layer) {
    const std::string k_name = fmt::format("model.layers.{}.self_attn.k_scale", layer);
    const std::string v_name = fmt::format("model.layers.{}.self_attn.v_scale", layer);
    const bool has_k = weights.Contains(k_name), has_v = weights.Contains(v_name);
    if (has_k != has_v) {
      return absl::InvalidArgumentError(
          fmt::format("{}: the checkpoint has this KV cache scale but not {}",
                      has_k ? k_name : v_name, has_k ? v_name : k_name));
    }
    if (!has_k) {
      scales.k.push_back(1.0f);
      scales.v.push_back(1.0f);
      continue;
    }
    RS_ASSIGN_OR_RETURN(const float k, ReadScale(weights, k_name));
    RS_ASSIGN_OR_RETURN(const float v, ReadScale(weights, v_name));
    scales.k.push_back(k);
    scales.v.push_back(v);
    scales.from_checkpoint = true;
  }
  return scales;
}

}  // namespace ringserve
