// DeepSeek-V3's multi-token-prediction (MTP) layer on the CPU: the extra block a DeepSeek
// checkpoint carries after its last decoder layer (model.layers.{num_hidden_layers}.*), which
// transformers drops. It drafts the token after next for speculative decoding. From the
// DeepSeek-V3 report (section 2.2), with the concatenation in the order the checkpoint was
// trained with (as vLLM and SGLang apply it):
//   h'_i   = eh_proj([enorm(Emb(t_{i+1})); hnorm(h_i)])     eh_proj: [hidden, 2 * hidden]
//   o_i    = the MTP decoder block (MLA attention over its own latent cache, causal, at
//            position i; then its MLP, a MoE block like the main model's from
//            first_k_dense_replace on, as in DeepSeek-V3) applied to h'
//   logits = shared_head.head(shared_head.norm(o_i))          predicts t_{i+2}
// h_i is the main model's final hidden state at position i after model.norm (what lm_head
// reads). Emb and the head are the layer's own copies (embed_tokens, shared_head.head), else
// the main model's (model.embed_tokens, lm_head). Loaded by the last stage. Not thread-safe.
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "ring/model_config.h"
#include "stage/model/cpu_mla_attention.h"
#include "stage/model/cpu_moe.h"
#include "stage/model/latent_kv_cache.h"
#include "stage/model/model_slice.h"
#include "stage/model/quant/quant_config.h"
#include "stage/model/safetensors.h"

namespace ringserve {

class CpuMtpLayer {
 public:
  // Loads the first MTP layer of `weights` (dequantized per `quant`, as the slice's layers).
  // NotFound when the checkpoint has none;
  // InvalidArgument when config has no MLA or num_nextn_predict_layers is 0. Its block is MoE
  // (the model's router and experts layout) when its index is >= first_k_dense_replace and the
  // model has MoE layers, as in DeepSeek-V3 itself; dense otherwise.
  // The layer has its own latent KV cache of kv_num_blocks blocks of kv_block_size positions;
  // block ids are the sequences' ids of the main model.
  static absl::StatusOr<std::unique_ptr<CpuMtpLayer>> Load(const ModelConfig& config,
                                                           SafetensorsModel& weights,
                                                           const quant::QuantConfig& quant,
                                                           int kv_block_size, int kv_num_blocks);

  // One micro-batch of (h_i, t_{i+1}) pairs, laid out as ModelSlice's: chunk tokens take
  // positions [start_position, + num_tokens), batch.token_ids[r] is t_{p+1} for the row at
  // position p, and main_hidden [total_tokens, hidden] fp32 holds h_p. Writes the block's latent
  // cache at those positions and returns logits [rows, vocab] for the rows each chunk's
  // LogitsMode asks (draft distributions of t_{p+2}). InvalidArgument for a malformed batch.
  absl::StatusOr<std::vector<float>> Forward(const MicroBatch& batch,
                                             std::span<const float> main_hidden);

  int layer_index() const { return layer_; }
  const LatentKvCache& kv_cache() const { return *kv_; }

 private:
  CpuMtpLayer() = default;

  ModelConfig config_;
  int layer_ = 0;
  int kv_block_size_ = 0;
  int kv_num_blocks_ = 0;
  std::vector<float> inv_freq_;
  std::vector<float> embedding_, enorm_, hnorm_, eh_proj_, head_norm_, head_;
  std::vector<float> input_norm_, post_norm_, gate_w_, up_w_, down_w_;
  MlaWeights attention_;
  std::unique_ptr<CpuMoeLayer> moe_;  // a MoE block (then gate_w_/up_w_/down_w_ are empty)
  std::unique_ptr<LatentKvCache> kv_;
};

}  // namespace ringserve
