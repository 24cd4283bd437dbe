#include "stage/model/cpu_mtp_layer.h"

#include <map>

#include "common/status_macros.h"
#include "fmt/format.h"
#include "kernels/cpu/ops.h"
#include "stage/model/micro_batch_check.h"
#include "stage/model/quantized_weights.h"
#include "stage/model/slice_weights.h"

namespace ringserve {

absl::StatusOr<std::unique_ptr<CpuMtpLayer>> CpuMtpLayer::Load(const ModelConfig& config,
                                                               SafetensorsModel& weights,
                                                               const quant::QuantConfig& quant,
                                                               int kv_block_size,
                                                               int kv_num_blocks) {
  if (!config.mla || config.mla->num_nextn_predict_layers < 1) {
    return absl::InvalidArgumentError(
        "no MTP layer: the config has no multi-head latent attention or "
        "num_nextn_predict_layers is 0");
  }
  if (kv_block_size <= 0 || kv_num_blocks <= 0) {
    return absl::InvalidArgumentError(
        fmt::format("MTP: kv_block_size ({}) and kv_num_blocks ({}) must be positive",
                    kv_block_size, kv_num_blocks));
  }
  const int layer = config.num_layers;
  const std::string p = fmt::format("model.layers.{}.", layer);
  if (!weights.Contains(p + "eh_proj.weight")) {
    return absl::NotFoundError(
        fmt::format("the checkpoint has no MTP layer ({}eh_proj.weight)", p));
  }
  std::unique_ptr<CpuMtpLayer> mtp(new CpuMtpLayer());
  mtp->config_ = config;
  // The MTP block follows the decoder layers' rule: MoE from first_k_dense_replace on.
  if (config.moe.enabled() && layer >= config.mla->first_k_dense_replace) {
    mtp->config_.moe.layers.resize(layer + 1, false);
    mtp->config_.moe.layers[layer] = true;
  }
  mtp->layer_ = layer;
  mtp->kv_block_size_ = kv_block_size;
  mtp->kv_num_blocks_ = kv_num_blocks;
  mtp->inv_freq_ = RopeInverseFrequencies(config.rope, config.head_dim);
  const int64_t hidden = config.hidden_size, vocab = config.vocab_size;
  auto read = [&](std::vector<float>& field, const std::string& name,
                  std::vector<int64_t> shape) -> absl::Status {
    RS_ASSIGN_OR_RETURN(field, ReadWeightFloat(weights, quant, {name, std::move(shape)}));
    return absl::OkStatus();
  };
  const std::string embed = weights.Contains(p + "embed_tokens.weight")
                                ? p + "embed_tokens.weight"
                                : "model.embed_tokens.weight";
  const std::string head = weights.Contains(p + "shared_head.head.weight")
                               ? p + "shared_head.head.weight"
                               : "lm_head.weight";
  RS_RETURN_IF_ERROR(read(mtp->embedding_, embed, {vocab, hidden}));
  RS_RETURN_IF_ERROR(read(mtp->head_, head, {vocab, hidden}));
  RS_RETURN_IF_ERROR(read(mtp->enorm_, p + "enorm.weight", {hidden}));
  RS_RETURN_IF_ERROR(read(mtp->hnorm_, p + "hnorm.weight", {hidden}));
  RS_RETURN_IF_ERROR(read(mtp->eh_proj_, p + "eh_proj.weight", {hidden, 2 * hidden}));
  RS_RETURN_IF_ERROR(read(mtp->head_norm_, p + "shared_head.norm.weight", {hidden}));
  MlaWeights& a = mtp->attention_;
  const std::map<std::string, std::vector<float>*> fields = {
      {"input_layernorm.weight", &mtp->input_norm_},
      {"self_attn.q_a_proj.weight", &a.q_a_w},
      {"self_attn.q_a_proj.bias", &a.q_a_b},
      {"self_attn.q_a_layernorm.weight", &a.q_a_norm},
      {"self_attn.q_b_proj.weight", &a.q_b_w},
      {"self_attn.q_proj.weight", &a.q_w},
      {"self_attn.kv_a_proj_with_mqa.weight", &a.kv_a_w},
      {"self_attn.kv_a_proj_with_mqa.bias", &a.kv_a_b},
      {"self_attn.kv_a_layernorm.weight", &a.kv_a_norm},
      {"self_attn.kv_b_proj.weight", &a.kv_b_w},
      {"self_attn.o_proj.weight", &a.o_w},
      {"self_attn.o_proj.bias", &a.o_b},
      {"post_attention_layernorm.weight", &mtp->post_norm_},
      {"mlp.gate_proj.weight", &mtp->gate_w_},
      {"mlp.up_proj.weight", &mtp->up_w_},
      {"mlp.down_proj.weight", &mtp->down_w_},
  };
  for (const TensorSpec& spec : LayerTensorSpecs(mtp->config_, layer)) {
    auto field = fields.find(spec.name.substr(p.size()));
    if (field == fields.end()) continue;  // a MoE block's tensor, read below
    // The spec itself: its linear weights are dequantized as the decoder layers' are.
    RS_ASSIGN_OR_RETURN(*field->second, ReadWeightFloat(weights, quant, spec));
  }
  if (mtp->config_.moe.IsMoeLayer(layer)) {
    RS_ASSIGN_OR_RETURN(CpuMoeLayer moe, LoadCpuMoeLayer(mtp->config_, layer, weights, quant));
    mtp->moe_ = std::make_unique<CpuMoeLayer>(std::move(moe));
  }
  mtp->kv_ = std::make_unique<LatentKvCache>(LatentKvCache::Options{
      .num_layers = 1,
      .num_blocks = kv_num_blocks,
      .block_size = kv_block_size,
      .latent_dim = config.mla->kv_lora_rank,
      .rope_dim = config.mla->qk_rope_head_dim,
  });
  return mtp;
}

absl::StatusOr<std::vector<float>> CpuMtpLayer::Forward(const MicroBatch& batch,
                                                        std::span<const float> main_hidden) {
  const ModelConfig& c = config_;
  RS_RETURN_IF_ERROR(ValidateMicroBatch(batch, {},
                                        {.max_positions = c.max_position_embeddings,
                                         .max_positions_name = "max_position_embeddings",
                                         .kv_block_size = kv_block_size_,
                                         .kv_num_blocks = kv_num_blocks_,
                                         .vocab_size = c.vocab_size,
                                         .hidden_size = c.hidden_size,
                                         .is_first = true}));
  const int64_t tokens = batch.TotalTokens();
  const int64_t hidden = c.hidden_size;
  if (static_cast<int64_t>(main_hidden.size()) != tokens * hidden) {
    return absl::InvalidArgumentError(
        fmt::format("MTP: main_hidden has {} floats, expected {} tokens x hidden {}",
                    main_hidden.size(), tokens, hidden));
  }
  std::vector<int32_t> positions;
  for (const SequenceChunk& chunk : batch.chunks) {
    for (int32_t i = 0; i < chunk.num_tokens; ++i) positions.push_back(chunk.start_position + i);
  }
  // h' = eh_proj([enorm(Emb(t)); hnorm(h)]).
  std::vector<float> both(tokens * 2 * hidden), emb(tokens * hidden);
  cpu::Embed(embedding_.data(), hidden, batch.token_ids.data(), tokens, emb.data());
  for (int64_t t = 0; t < tokens; ++t) {
    cpu::RmsNorm(emb.data() + t * hidden, enorm_.data(), 1, hidden, c.rms_norm_eps,
                 both.data() + t * 2 * hidden);
    cpu::RmsNorm(main_hidden.data() + t * hidden, hnorm_.data(), 1, hidden, c.rms_norm_eps,
                 both.data() + t * 2 * hidden + hidden);
  }
  std::vector<float> x(tokens * hidden), h(tokens * hidden), attn(tokens * hidden);
  cpu::MatMul(both.data(), eh_proj_.data(), nullptr, tokens, 2 * hidden, hidden, x.data());

  // The decoder block.
  cpu::RmsNorm(x.data(), input_norm_.data(), tokens, hidden, c.rms_norm_eps, h.data());
  MlaAttention({.config = &c,
                .weights = &attention_,
                .chunks = batch.chunks,
                .positions = positions.data(),
                .inv_freq = inv_freq_.data(),
                .kv = kv_->Layer(0),
                .path = std::nullopt},
               h.data(), attn.data());
  cpu::Add(x.data(), attn.data(), tokens * hidden);
  cpu::RmsNorm(x.data(), post_norm_.data(), tokens, hidden, c.rms_norm_eps, h.data());
  if (moe_ != nullptr) {
    CpuMoeForward(c.moe, c.hidden_size, *moe_, h.data(), tokens, attn.data());
    cpu::Add(x.data(), attn.data(), tokens * hidden);
    return cpu::NormAndProjectRows(x.data(), batch.LogitRows(), head_norm_.data(), head_.data(),
                                   hidden, c.vocab_size, c.rms_norm_eps);
  }
  const int64_t inter = c.intermediate_size;
  std::vector<float> gate(tokens * inter), up(tokens * inter);
  cpu::MatMul(h.data(), gate_w_.data(), nullptr, tokens, hidden, inter, gate.data());
  cpu::MatMul(h.data(), up_w_.data(), nullptr, tokens, hidden, inter, up.data());
  cpu::SiluMul(gate.data(), up.data(), tokens * inter, gate.data());
  cpu::MatMul(gate.data(), down_w_.data(), nullptr, tokens, inter, hidden, h.data());
  cpu::Add(x.data(), h.data(), tokens * hidden);

  return cpu::NormAndProjectRows(x.data(), batch.LogitRows(), head_norm_.data(), head_.data(),
                                 hidden, c.vocab_size, c.rms_norm_eps);
}

}  // namespace ringserve
