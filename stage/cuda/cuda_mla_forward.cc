// The CUDA slice's DeepSeek-V2/V3 layers (config.mla): their weights and attention scratch, and
// one layer's forward: input norm, multi-head latent attention over the paged latent cache
// (CudaMlaAttention: absorbed up-projections, every token one entry of the decode kernel, so
// prefill chunks read the earlier chunks' compressed rows), post-attention norm, then the dense
// MLP (layers before first_k_dense_replace) or the MoE block (CudaMoeLayer).
#include <algorithm>

#include "absl/status/status.h"
#include "common/status_macros.h"
#include "kernels/cuda/elementwise.h"
#include "stage/cuda/cuda_model_slice.h"

namespace ringserve::cuda {

absl::Status CudaModelSlice::AllocateMlaWeights() {
  mla_.clear();
  mla_attention_.reset();
  if (!config_.mla) return absl::OkStatus();
  if (!quant_.empty()) {
    return absl::InvalidArgumentError(
        "CUDA backend does not run quantized multi-head latent attention checkpoints yet; use "
        "device: cpu");
  }
  // The attention first: it refuses the sizes its kernels do not run before any weight loads.
  int num_sms = 0;
  RS_CUDA_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, cuda_.device));
  RS_ASSIGN_OR_RETURN(
      mla_attention_,
      CudaMlaAttention::Create(config_, std::max(cuda_.max_batch_tokens, cuda_.max_graph_batch),
                               num_sms, kernels_.mla_decode));
  mla_.resize(options_.layers.size());
  for (auto& layer : mla_) {
    RS_ASSIGN_OR_RETURN(layer, CudaMlaLayerWeights::Create(config_));
  }
  return absl::OkStatus();
}

absl::Status CudaModelSlice::TuneMlaGemms(int tokens) {
  if (mla_.empty() || tokens > cuda_.max_batch_tokens) return absl::OkStatus();
  return mla_attention_->TuneGemms(mla_[0]->weights(), tokens, normed_.as<bf16>(), proj_.as<bf16>(),
                                   *gemm_, stream_);
}

absl::Status CudaModelSlice::RunMlaLayer(int l, const CudaMlaTokens& tokens) {
  const ModelConfig& c = config_;
  const LayerWeights& w = layers_[l];
  const int t = tokens.num_tokens;
  const int h = c.hidden_size, inter = c.intermediate_size;
  const float eps = c.rms_norm_eps;
  float* residual = residual_.as<float>();
  // The layer's rows of the latent pool: kv_values_per_token_layer() values per token.
  const MlaCacheLayer cache{.data = kv_buffer_.as<bf16>() + 2 * l * kv_layer_elems_,
                            .block_stride = int64_t{options_.kv_block_size} * kMlaRowDim,
                            .block_size = options_.kv_block_size};
  // The previous layer's MLP output is still to be added (not on layer 0).
  RS_RETURN_IF_ERROR(LaunchAddRmsNorm(residual, l == 0 ? nullptr : proj_.as<bf16>(), nullptr,
                                      w.input_norm, normed_.as<bf16>(), t, h, eps, stream_));
  RS_RETURN_IF_ERROR(mla_attention_->Forward(mla_[l]->weights(), cache, tokens,
                                             inv_freq_.as<float>(), normed_.as<bf16>(),
                                             proj_.as<bf16>(), *gemm_, stream_));
  RS_RETURN_IF_ERROR(LaunchAddRmsNorm(residual, proj_.as<bf16>(), nullptr, w.post_norm,
                                      normed_.as<bf16>(), t, h, eps, stream_));
  if (moe_[l] != nullptr) {
    // Left in proj_ for the next layer's (or the slice's final) add.
    return moe_[l]->Forward(normed_.as<bf16>(), t, nullptr, proj_.as<bf16>(), *moe_ws_, l, stream_);
  }
  RS_RETURN_IF_ERROR(gemm_->Linear(normed_.as<bf16>(), w.gate_up, gate_up_.get(), OutType::kBF16, t,
                                   2 * inter, h, stream_));
  RS_RETURN_IF_ERROR(LaunchSiluMul(gate_up_.as<bf16>(), act_.as<bf16>(), t, inter, stream_));
  return gemm_->Linear(act_.as<bf16>(), w.down, proj_.get(), OutType::kBF16, t, h, inter, stream_);
}

}  // namespace ringserve::cuda
