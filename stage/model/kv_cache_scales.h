// The per-layer scales of an fp8 KV cache (ring/kv_cache_dtype.h), read from the checkpoint.
//
// compressed-tensors checkpoints quantized with a `kv_cache_scheme` (llm-compressor, strategy
// tensor) store one fp32 scale per layer for the keys and one for the values, as
// `model.layers.N.self_attn.k_scale` and `.v_scale` (shape [] or [1]): the cache holds
// e4m3(x / scale). vLLM reads the same tensors; where a checkpoint has none (every bf16
// checkpoint) the scales are 1.0, as vLLM's default: e4m3 then covers |x| <= 448 with 3
// mantissa bits, ample for the K/V of the models we serve (post-norm projections, |x| of a few
// units to a few tens; the e4m3 rounding error is then at most 2^-4 relative).
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "ring/micro_batch.h"
#include "stage/model/safetensors.h"

namespace ringserve {

struct KvCacheScales {
  std::vector<float> k;  // [layers.size()], local layer order
  std::vector<float> v;
  bool from_checkpoint = false;  // whether any layer had its scales in the checkpoint
};

// The scales of `layers`: a layer's k_scale / v_scale tensors when the checkpoint has them
// (both or neither), 1.0 otherwise. InvalidArgument naming the tensor for a scale that is not
// one positive finite float (per-head or per-channel KV scales are not supported) or a layer
// with only one of the two.
absl::StatusOr<KvCacheScales> LoadKvCacheScales(SafetensorsModel& weights, LayerRange layers);

}  // namespace ringserve
