// One DeepSeek-V2/V3 layer's multi-head latent attention weights on the GPU (bf16, the
// checkpoint's [out, in] layouts), for the CUDA slice: allocated in one buffer, loaded from the
// checkpoint under MlaAttentionTensorSpecs' names (stage/model/slice_weights.h) or filled with
// random values (benchmarks). The attention itself is CudaMlaAttention (cuda_mla_attention.h).
// Not thread-safe; owns its device memory.
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "kernels/cuda/cuda_utils.h"
#include "ring/model_config.h"
#include "stage/cuda/cuda_mla_attention.h"
#include "stage/cuda/cuda_moe_layer.h"
#include "stage/model/safetensors.h"

namespace ringserve::cuda {

class CudaMlaLayerWeights {
 public:
  // InvalidArgument without config.mla or with attention_bias (CudaMlaAttention has no biases).
  static absl::StatusOr<std::unique_ptr<CudaMlaLayerWeights>> Create(const ModelConfig& config);

  // Loads layer `layer`'s MLA tensors through `upload` (the slice's loader). Errors name the
  // tensor.
  absl::Status Load(const ModelConfig& config, int layer, const CudaMoeLayer::UploadFn& upload);
  // Uniform random weights with std 0.02, norms 1 +- 0.1. Synchronizes `stream`.
  absl::Status Randomize(uint64_t seed, cudaStream_t stream);

  const CudaMlaWeights& weights() const { return w_; }
  int64_t weight_bytes() const { return static_cast<int64_t>(buffer_.bytes()); }

 private:
  CudaMlaLayerWeights() = default;

  MlaConfig mla_;
  int64_t hidden_ = 0;
  int64_t heads_ = 0;
  DeviceBuffer buffer_;
  CudaMlaWeights w_;
};

}  // namespace ringserve::cuda
