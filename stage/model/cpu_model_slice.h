// The CPU reference implementation of ModelSlice (model_slice.h): fp32 weights and activations
// in host memory, the ops of kernels/cpu, a PagedKvCache (a LatentKvCache and
// cpu_mla_attention for DeepSeek's multi-head latent attention), and the host sampler. Created
// by ModelSlice::LoadCpu; this header is for code that needs the concrete type (tests, tools).
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "ring/model_config.h"
#include "stage/model/cpu_mla_attention.h"
#include "stage/model/cpu_moe.h"
#include "stage/model/cpu_mtp_layer.h"
#include "stage/model/kv_cache.h"
#include "stage/model/latent_kv_cache.h"
#include "stage/model/model_slice.h"

namespace ringserve {

class CpuModelSlice : public ModelSlice {
 public:
  // Loads config.json and the slice's tensors (converted to fp32) from options.model_dir.
  // InvalidArgument for a bad layer range or KV options; loader errors name file and tensor.
  static absl::StatusOr<std::unique_ptr<CpuModelSlice>> Load(const SliceOptions& options);

  const ModelConfig& config() const override { return config_; }
  const SliceOptions& options() const override { return options_; }
  // A host buffer (HostActivationBuffer) that grows to the batch.
  ActivationBuffer& activations() override { return *activations_; }
  const ActivationBuffer& activations() const override { return *activations_; }
  absl::Status Prepare(const MicroBatch& batch) override;
  absl::Status Run(const MicroBatch& batch) override;
  // Through stage/sampling (SampleTokens, TokenLogprob).
  absl::StatusOr<SampledRows> Sample(const MicroBatch& batch,
                                     std::span<const RowSampling> rows) override;
  absl::StatusOr<std::vector<float>> LogitsToHost() override;
  // Wall time between the two calls.
  void BeginStepTiming() override;
  void EndStepTiming() override;
  int64_t TakeStepMicros() override;

  // The cache of models with ordinary heads (config().mla unset).
  const PagedKvCache& kv_cache() const { return *kv_; }
  // The cache of multi-head latent attention models (config().mla set).
  const LatentKvCache& latent_kv_cache() const { return *latent_kv_; }
  // The last slice of a DeepSeek checkpoint with a (dense) MTP layer holds it; else null.
  CpuMtpLayer* mtp() { return mtp_.get(); }
  // The last slice: model.norm's weight ([hidden]; after Run, activations() hold every row's
  // hidden state before it).
  std::span<const float> final_norm() const { return final_norm_; }

 private:
  struct LayerWeights {
    std::vector<float> input_norm, q_w, q_b, k_w, k_b, v_w, v_b, q_norm, k_norm, o_w, o_b, sinks,
        post_norm, gate_w, up_w, down_w;
    std::unique_ptr<CpuMoeLayer> moe;  // MoE layers only (then gate_w/up_w/down_w are empty)
    MlaWeights mla;                    // DeepSeek attention (config_.mla)
  };

  CpuModelSlice() = default;
  // Checks everything Run relies on before anything is written.
  absl::Status Validate(const MicroBatch& batch, std::span<const float> hidden_in) const;
  // One decoder layer on the residual stream x [tokens, hidden].
  void RunLayer(int local_layer, const MicroBatch& batch, const std::vector<int32_t>& positions,
                std::vector<float>& x);
  // Attention with ordinary heads: h [tokens, hidden] (normed input) -> o_proj output, in place.
  void RunAttention(int local_layer, const MicroBatch& batch, const std::vector<int32_t>& positions,
                    std::vector<float>& h);
  // x += mlp(post_attention_layernorm(x)); h is scratch [tokens, hidden].
  void RunMlp(const LayerWeights& w, int64_t tokens, std::vector<float>& x, std::vector<float>& h);

  ModelConfig config_;
  SliceOptions options_;
  std::vector<float> inv_freq_;  // [rotary_dim / 2] (MLA: qk_rope_head_dim / 2)
  std::vector<LayerWeights> layers_;
  std::vector<float> embedding_;   // [vocab, hidden], first slice only
  std::vector<float> final_norm_;  // [hidden], last slice only
  std::vector<float> lm_head_;     // [vocab, hidden], last slice only
  std::unique_ptr<PagedKvCache> kv_;
  std::unique_ptr<LatentKvCache> latent_kv_;
  std::unique_ptr<CpuMtpLayer> mtp_;
  std::unique_ptr<HostActivationBuffer> activations_;
  std::vector<float> logits_;  // [rows, vocab] of the last Run, last slice only
  bool has_logits_ = false;
  absl::Time step_start_;
  int64_t step_us_ = 0;  // timed steps not yet taken
};

}  // namespace ringserve
