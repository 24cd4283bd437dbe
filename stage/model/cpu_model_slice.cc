#include "stage/model/cpu_model_slice.h"

#include <cmath>
#include <map>

#include "absl/status/status.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "fmt/format.h"
#include "kernels/cpu/ops.h"
#include "stage/model/micro_batch_check.h"
#include "stage/model/quantized_weights.h"
#include "stage/model/safetensors.h"
#include "stage/model/slice_weights.h"

namespace ringserve {

absl::StatusOr<std::unique_ptr<ModelSlice>> ModelSlice::LoadCpu(const SliceOptions& options) {
  RS_ASSIGN_OR_RETURN(std::unique_ptr<CpuModelSlice> slice, CpuModelSlice::Load(options));
  return std::unique_ptr<ModelSlice>(std::move(slice));
}

absl::StatusOr<std::unique_ptr<CpuModelSlice>> CpuModelSlice::Load(const SliceOptions& options) {
  RS_ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(options.model_dir));
  const LayerRange layers = options.layers;
  if (layers.first < 0 || layers.first >= layers.last || layers.last > config.num_layers) {
    return absl::InvalidArgumentError(
        fmt::format("{}: layer range [{}, {}) is not a non-empty part of [0, {})",
                    options.model_dir, layers.first, layers.last, config.num_layers));
  }
  if (options.kv_block_size <= 0 || options.kv_num_blocks <= 0) {
    return absl::InvalidArgumentError(
        fmt::format("kv_block_size ({}) and kv_num_blocks ({}) must be positive",
                    options.kv_block_size, options.kv_num_blocks));
  }
  RS_ASSIGN_OR_RETURN(const quant::QuantConfig quant, quant::LoadQuantConfig(options.model_dir));
  RS_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsModel> weights,
                      SafetensorsModel::Open(options.model_dir));

  std::unique_ptr<CpuModelSlice> slice(new CpuModelSlice());
  slice->config_ = config;
  slice->options_ = options;
  slice->inv_freq_ = RopeInverseFrequencies(config.rope, config.head_dim);
  if (slice->is_first()) {
    const TensorSpec spec = EmbeddingSpec(config);
    RS_ASSIGN_OR_RETURN(slice->embedding_, weights->ReadFloat(spec.name, spec.shape));
  }
  for (int layer = layers.first; layer < layers.last; ++layer) {
    LayerWeights& w = slice->layers_.emplace_back();
    const std::string prefix = fmt::format("model.layers.{}.", layer);
    const std::map<std::string, std::vector<float>*> fields = {
        {"input_layernorm.weight", &w.input_norm},
        {"self_attn.q_proj.weight", &w.q_w},
        {"self_attn.q_proj.bias", &w.q_b},
        {"self_attn.k_proj.weight", &w.k_w},
        {"self_attn.k_proj.bias", &w.k_b},
        {"self_attn.v_proj.weight", &w.v_w},
        {"self_attn.v_proj.bias", &w.v_b},
        {"self_attn.q_norm.weight", &w.q_norm},
        {"self_attn.k_norm.weight", &w.k_norm},
        {"self_attn.o_proj.weight", &w.o_w},
        {"self_attn.o_proj.bias", &w.o_b},
        {"post_attention_layernorm.weight", &w.post_norm},
        {"mlp.gate_proj.weight", &w.gate_w},
        {"mlp.up_proj.weight", &w.up_w},
        {"mlp.down_proj.weight", &w.down_w},
    };
    for (const TensorSpec& spec : LayerTensorSpecs(config, layer)) {
      std::vector<float>* field = fields.at(spec.name.substr(prefix.size()));
      RS_ASSIGN_OR_RETURN(*field, ReadWeightFloat(*weights, quant, spec));
    }
  }
  if (slice->is_last()) {
    const TensorSpec norm = FinalNormSpec(config);
    RS_ASSIGN_OR_RETURN(slice->final_norm_, weights->ReadFloat(norm.name, norm.shape));
    const TensorSpec head = LmHeadSpec(config, *weights);
    RS_ASSIGN_OR_RETURN(slice->lm_head_, ReadWeightFloat(*weights, quant, head));
  }
  slice->kv_ = std::make_unique<PagedKvCache>(PagedKvCache::Options{
      .num_layers = layers.size(),
      .num_blocks = options.kv_num_blocks,
      .block_size = options.kv_block_size,
      .num_kv_heads = config.num_kv_heads,
      .head_dim = config.head_dim,
  });
  RS_LOG_INFO(
      "loaded {} layers [{}, {}) of {} from {} ({} files mapped, quantization {}), KV {} blocks x "
      "{} ({} MB)",
      ArchitectureName(config.architecture), layers.first, layers.last, config.num_layers,
      options.model_dir, weights->OpenedFiles().size(), quant::QuantMethodName(quant.method),
      options.kv_num_blocks, options.kv_block_size, slice->kv_->bytes() >> 20);
  return slice;
}

absl::Status CpuModelSlice::Validate(const MicroBatch& batch,
                                     std::span<const float> hidden_in) const {
  return ValidateMicroBatch(batch, hidden_in,
                            {.max_positions = config_.max_position_embeddings,
                             .max_positions_name = "max_position_embeddings",
                             .kv_block_size = options_.kv_block_size,
                             .kv_num_blocks = options_.kv_num_blocks,
                             .vocab_size = config_.vocab_size,
                             .hidden_size = config_.hidden_size,
                             .is_first = is_first()});
}

void CpuModelSlice::RunLayer(int local_layer, const MicroBatch& batch,
                             const std::vector<int32_t>& positions, std::vector<float>& x) {
  const LayerWeights& w = layers_[local_layer];
  const ModelConfig& c = config_;
  const int64_t tokens = static_cast<int64_t>(positions.size());
  const int64_t hidden = c.hidden_size;
  const int64_t q_size = c.q_size();
  const int64_t kv_size = c.kv_size();
  auto bias = [](const std::vector<float>& b) { return b.empty() ? nullptr : b.data(); };

  std::vector<float> h(tokens * hidden);
  cpu::RmsNorm(x.data(), w.input_norm.data(), tokens, hidden, c.rms_norm_eps, h.data());
  std::vector<float> q(tokens * q_size), k(tokens * kv_size), v(tokens * kv_size);
  cpu::MatMul(h.data(), w.q_w.data(), bias(w.q_b), tokens, hidden, q_size, q.data());
  cpu::MatMul(h.data(), w.k_w.data(), bias(w.k_b), tokens, hidden, kv_size, k.data());
  cpu::MatMul(h.data(), w.v_w.data(), bias(w.v_b), tokens, hidden, kv_size, v.data());
  if (c.qk_norm) {
    cpu::RmsNorm(q.data(), w.q_norm.data(), tokens * c.num_heads, c.head_dim, c.rms_norm_eps,
                 q.data());
    cpu::RmsNorm(k.data(), w.k_norm.data(), tokens * c.num_kv_heads, c.head_dim, c.rms_norm_eps,
                 k.data());
  }
  cpu::ApplyRope(q.data(), tokens, c.num_heads, c.head_dim, positions.data(), inv_freq_.data());
  cpu::ApplyRope(k.data(), tokens, c.num_kv_heads, c.head_dim, positions.data(), inv_freq_.data());

  const cpu::KvLayerView kv = kv_->Layer(local_layer);
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  std::vector<float> attn(tokens * q_size);
  int64_t offset = 0;
  for (const SequenceChunk& chunk : batch.chunks) {
    cpu::WriteKv(kv, chunk.block_table, chunk.start_position, chunk.num_tokens,
                 k.data() + offset * kv_size, v.data() + offset * kv_size);
    cpu::PagedAttention(q.data() + offset * q_size, chunk.num_tokens, c.num_heads, kv,
                        chunk.block_table, chunk.start_position, scale,
                        attn.data() + offset * q_size);
    offset += chunk.num_tokens;
  }
  cpu::MatMul(attn.data(), w.o_w.data(), bias(w.o_b), tokens, q_size, hidden, h.data());
  cpu::Add(x.data(), h.data(), tokens * hidden);

  cpu::RmsNorm(x.data(), w.post_norm.data(), tokens, hidden, c.rms_norm_eps, h.data());
  const int64_t inter = c.intermediate_size;
  std::vector<float> gate(tokens * inter), up(tokens * inter);
  cpu::MatMul(h.data(), w.gate_w.data(), nullptr, tokens, hidden, inter, gate.data());
  cpu::MatMul(h.data(), w.up_w.data(), nullptr, tokens, hidden, inter, up.data());
  cpu::SiluMul(gate.data(), up.data(), tokens * inter, gate.data());
  cpu::MatMul(gate.data(), w.down_w.data(), nullptr, tokens, inter, hidden, h.data());
  cpu::Add(x.data(), h.data(), tokens * hidden);
}

absl::StatusOr<std::vector<float>> CpuModelSlice::Forward(const MicroBatch& batch,
                                                          std::span<const float> hidden_in) {
  RS_RETURN_IF_ERROR(Validate(batch, hidden_in));
  const int64_t tokens = batch.TotalTokens();
  const int64_t hidden = config_.hidden_size;
  std::vector<int32_t> positions;
  positions.reserve(tokens);
  for (const SequenceChunk& chunk : batch.chunks) {
    for (int32_t i = 0; i < chunk.num_tokens; ++i) positions.push_back(chunk.start_position + i);
  }
  std::vector<float> x(tokens * hidden);
  if (is_first()) {
    cpu::Embed(embedding_.data(), hidden, batch.token_ids.data(), tokens, x.data());
  } else {
    std::copy(hidden_in.begin(), hidden_in.end(), x.begin());
  }
  for (int layer = 0; layer < options_.layers.size(); ++layer) RunLayer(layer, batch, positions, x);
  if (!is_last()) return x;

  // Gather the rows each chunk asks logits for, then norm and project only those.
  std::vector<int64_t> rows;
  int64_t offset = 0;
  for (const SequenceChunk& chunk : batch.chunks) {
    if (chunk.logits == LogitsMode::kAllTokens) {
      for (int32_t i = 0; i < chunk.num_tokens; ++i) rows.push_back(offset + i);
    } else if (chunk.logits == LogitsMode::kLastToken) {
      rows.push_back(offset + chunk.num_tokens - 1);
    }
    offset += chunk.num_tokens;
  }
  const int64_t num_rows = static_cast<int64_t>(rows.size());
  std::vector<float> selected(num_rows * hidden);
  for (int64_t r = 0; r < num_rows; ++r) {
    cpu::RmsNorm(x.data() + rows[r] * hidden, final_norm_.data(), 1, hidden, config_.rms_norm_eps,
                 selected.data() + r * hidden);
  }
  std::vector<float> logits(num_rows * config_.vocab_size);
  cpu::MatMul(selected.data(), lm_head_.data(), nullptr, num_rows, hidden, config_.vocab_size,
              logits.data());
  return logits;
}

}  // namespace ringserve
