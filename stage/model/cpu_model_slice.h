// The CPU reference implementation of ModelSlice (model_slice.h): fp32 weights and activations
// in host memory, the ops of kernels/cpu, and a PagedKvCache. Created by ModelSlice::LoadCpu;
// this header is for code that needs the concrete type (tests, tools).
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "stage/model/kv_cache.h"
#include "ring/model_config.h"
#include "stage/model/model_slice.h"

namespace ringserve {

class CpuModelSlice : public ModelSlice {
 public:
  // Loads config.json and the slice's tensors (converted to fp32) from options.model_dir.
  // InvalidArgument for a bad layer range or KV options; loader errors name file and tensor.
  static absl::StatusOr<std::unique_ptr<CpuModelSlice>> Load(const SliceOptions& options);

  const ModelConfig& config() const override { return config_; }
  const SliceOptions& options() const override { return options_; }
  absl::StatusOr<std::vector<float>> Forward(const MicroBatch& batch,
                                             std::span<const float> hidden_in) override;

  const PagedKvCache& kv_cache() const { return *kv_; }

 private:
  struct LayerWeights {
    std::vector<float> input_norm, q_w, q_b, k_w, k_b, v_w, v_b, q_norm, k_norm, o_w, o_b,
        post_norm, gate_w, up_w, down_w;
  };

  CpuModelSlice() = default;
  // Checks everything Forward relies on before anything is written.
  absl::Status Validate(const MicroBatch& batch, std::span<const float> hidden_in) const;
  void RunLayer(int local_layer, const MicroBatch& batch, const std::vector<int32_t>& positions,
                std::vector<float>& x);

  ModelConfig config_;
  SliceOptions options_;
  std::vector<float> inv_freq_;  // [head_dim / 2]
  std::vector<LayerWeights> layers_;
  std::vector<float> embedding_;   // [vocab, hidden], first slice only
  std::vector<float> final_norm_;  // [hidden], last slice only
  std::vector<float> lm_head_;     // [vocab, hidden], last slice only
  std::unique_ptr<PagedKvCache> kv_;
};

}  // namespace ringserve
