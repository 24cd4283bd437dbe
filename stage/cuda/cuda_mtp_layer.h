// DeepSeek-V3's multi-token-prediction (MTP) layer on the GPU: the weights of the extra block a
// DeepSeek checkpoint carries after its last decoder layer (model.layers.{num_hidden_layers}.*),
// for the CUDA last slice (CudaModelSlice::RunMtp runs it). The formula is CpuMtpLayer's
// (stage/model/cpu_mtp_layer.h):
//   h'     = eh_proj([enorm(Emb(t_{p+1})); hnorm(h_p)])
//   o      = the MTP decoder block on h' (MLA over its own latent cache, then its dense MLP or
//            MoE block: MoE when the model has MoE layers and its index is >=
//            first_k_dense_replace)
//   logits = shared_head.head(shared_head.norm(o))
// The block reuses the slice's layer code: CudaMlaLayerWeights for its attention, CudaMoeLayer
// for a MoE block. Emb and the head are the layer's own copies (embed_tokens,
// shared_head.head) when the checkpoint has them; else model.embed_tokens is loaded here unless
// the caller passes the slice's, and the head is the slice's lm_head. bf16, one buffer (plus
// the attention's and the MoE block's). Not thread-safe; owns its device memory.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "kernels/cuda/cuda_utils.h"
#include "ring/model_config.h"
#include "stage/cuda/cuda_mla_weights.h"
#include "stage/cuda/cuda_moe_layer.h"
#include "stage/model/safetensors.h"

namespace ringserve::cuda {

class CudaMtpLayer {
 public:
  struct Weights {
    bf16* enorm = nullptr;            // [hidden]
    bf16* hnorm = nullptr;            // [hidden]
    bf16* eh_proj = nullptr;          // [hidden, 2 * hidden]
    bf16* input_norm = nullptr;       // [hidden]
    bf16* post_norm = nullptr;        // [hidden]
    bf16* gate_up = nullptr;          // [2 * intermediate, hidden]; null for a MoE block
    bf16* down = nullptr;             // [hidden, intermediate]; null for a MoE block
    bf16* head_norm = nullptr;        // [hidden] shared_head.norm
    const bf16* embedding = nullptr;  // [vocab, hidden]: own, or the caller's
    const bf16* head = nullptr;       // [vocab, hidden]: own, or the caller's lm_head
  };

  // The layer's config: `config` with the MTP block's MoE flag (CpuMtpLayer's rule).
  static ModelConfig LayerConfig(const ModelConfig& config);

  // Allocates the layer of `config` (the model's config) as `weights` holds it. NotFound when
  // the checkpoint has no MTP layer (no model.layers.{num_layers}.eh_proj.weight);
  // InvalidArgument without MLA or with num_nextn_predict_layers 0. `embedding`: the slice's
  // token embedding (first slice) or null; `lm_head`: the slice's (never null).
  static absl::StatusOr<std::unique_ptr<CudaMtpLayer>> Create(const ModelConfig& config,
                                                              const SafetensorsModel& weights,
                                                              const bf16* embedding,
                                                              const bf16* lm_head);

  // Loads the tensors through `upload` (the slice's loader). Errors name the tensor.
  absl::Status Load(SafetensorsModel& weights, const CudaMoeLayer::UploadFn& upload,
                    cudaStream_t stream);

  int layer() const { return layer_; }
  const ModelConfig& config() const { return config_; }
  const Weights& weights() const { return w_; }
  const CudaMlaLayerWeights& attention() const { return *attention_; }
  const CudaMoeLayer* moe() const { return moe_.get(); }  // null for a dense block
  // Every byte this layer allocated (its buffer, attention and MoE block).
  int64_t weight_bytes() const;

 private:
  CudaMtpLayer() = default;

  ModelConfig config_;
  int layer_ = 0;
  std::string embedding_name_, head_name_;  // empty: not loaded here
  DeviceBuffer buffer_;
  Weights w_;
  std::unique_ptr<CudaMlaLayerWeights> attention_;
  std::unique_ptr<CudaMoeLayer> moe_;
};

}  // namespace ringserve::cuda
