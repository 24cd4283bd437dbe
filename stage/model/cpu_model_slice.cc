#include "stage/model/cpu_model_slice.h"

#include <cmath>
#include <map>
#include <utility>

#include "absl/status/status.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "fmt/format.h"
#include "kernels/cpu/ops.h"
#include "stage/model/kv_cache_scales.h"
#include "stage/model/micro_batch_check.h"
#include "stage/model/quantized_weights.h"
#include "stage/model/safetensors.h"
#include "stage/model/slice_weights.h"
#include "stage/sampling/sampler.h"

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
  slice->activations_ = std::make_unique<HostActivationBuffer>(config.hidden_size);
  slice->inv_freq_ = RopeInverseFrequencies(config.rope, config.rotary_dim);
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
        {"self_attn.sinks", &w.sinks},
        {"post_attention_layernorm.weight", &w.post_norm},
        {"mlp.gate_proj.weight", &w.gate_w},
        {"mlp.up_proj.weight", &w.up_w},
        {"mlp.down_proj.weight", &w.down_w},
        {"self_attn.q_a_proj.weight", &w.mla.q_a_w},
        {"self_attn.q_a_proj.bias", &w.mla.q_a_b},
        {"self_attn.q_a_layernorm.weight", &w.mla.q_a_norm},
        {"self_attn.q_b_proj.weight", &w.mla.q_b_w},
        {"self_attn.kv_a_proj_with_mqa.weight", &w.mla.kv_a_w},
        {"self_attn.kv_a_proj_with_mqa.bias", &w.mla.kv_a_b},
        {"self_attn.kv_a_layernorm.weight", &w.mla.kv_a_norm},
        {"self_attn.kv_b_proj.weight", &w.mla.kv_b_w},
    };
    // MLA's q_proj and o_proj land in the MLA weights.
    std::map<std::string, std::vector<float>*> mla_fields = fields;
    mla_fields["self_attn.q_proj.weight"] = &w.mla.q_w;
    mla_fields["self_attn.o_proj.weight"] = &w.mla.o_w;
    mla_fields["self_attn.o_proj.bias"] = &w.mla.o_b;
    for (const TensorSpec& spec : LayerTensorSpecs(config, layer)) {
      const auto& names = config.mla ? mla_fields : fields;
      auto field = names.find(spec.name.substr(prefix.size()));
      if (field == names.end()) continue;  // a MoE block's tensor, read below
      RS_ASSIGN_OR_RETURN(*field->second, ReadWeightFloat(*weights, quant, spec));
    }
    if (config.moe.IsMoeLayer(layer)) {
      RS_ASSIGN_OR_RETURN(CpuMoeLayer moe, LoadCpuMoeLayer(config, layer, *weights, quant));
      w.moe = std::make_unique<CpuMoeLayer>(std::move(moe));
    }
  }
  if (slice->is_last()) {
    const TensorSpec norm = FinalNormSpec(config);
    RS_ASSIGN_OR_RETURN(slice->final_norm_, weights->ReadFloat(norm.name, norm.shape));
    const TensorSpec head = LmHeadSpec(config, *weights);
    RS_ASSIGN_OR_RETURN(slice->lm_head_, ReadWeightFloat(*weights, quant, head));
    if (config.mla && config.mla->num_nextn_predict_layers > 0) {
      auto mtp =
          CpuMtpLayer::Load(config, *weights, quant, options.kv_block_size, options.kv_num_blocks);
      if (mtp.ok()) {
        slice->mtp_ = *std::move(mtp);
        RS_LOG_INFO("loaded the MTP layer (model.layers.{}.*)", config.num_layers);
      } else if (absl::IsNotFound(mtp.status()) || absl::IsUnimplemented(mtp.status())) {
        RS_LOG_WARN("no MTP layer: {}", std::string(mtp.status().message()));
      } else {
        return mtp.status();
      }
    }
  }
  int64_t kv_bytes = 0;
  std::string kv_per_token;
  if (config.mla && options.kv_cache_dtype != KvCacheDtype::kAuto) {
    return absl::UnimplementedError(fmt::format(
        "kv_cache_dtype {}: the latent KV cache of {} (multi-head latent attention) is fp32 only",
        KvCacheDtypeName(options.kv_cache_dtype), ArchitectureName(config.architecture)));
  }
  if (config.mla) {
    slice->latent_kv_ = std::make_unique<LatentKvCache>(LatentKvCache::Options{
        .num_layers = layers.size(),
        .num_blocks = options.kv_num_blocks,
        .block_size = options.kv_block_size,
        .latent_dim = config.mla->kv_lora_rank,
        .rope_dim = config.mla->qk_rope_head_dim,
    });
    kv_bytes = slice->latent_kv_->bytes();
    kv_per_token =
        fmt::format("{} bytes per token and layer (fp32 latent {} + rope key {}; {} in bf16)",
                    slice->latent_kv_->bytes_per_token_layer(), config.mla->kv_lora_rank,
                    config.mla->qk_rope_head_dim, config.kv_values_per_token_layer() * 2);
  } else {
    PagedKvCache::Options kv{
        .num_layers = layers.size(),
        .num_blocks = options.kv_num_blocks,
        .block_size = options.kv_block_size,
        .num_kv_heads = config.num_kv_heads,
        .head_dim = config.head_dim,
        .dtype = options.kv_cache_dtype,
    };
    std::string scales_from;
    if (options.kv_cache_dtype == KvCacheDtype::kFp8E4m3) {
      RS_ASSIGN_OR_RETURN(KvCacheScales scales, LoadKvCacheScales(*weights, layers));
      kv.k_scales = std::move(scales.k);
      kv.v_scales = std::move(scales.v);
      scales_from = scales.from_checkpoint ? ", scales from the checkpoint" : ", scales 1.0";
    }
    slice->kv_ = std::make_unique<PagedKvCache>(std::move(kv));
    kv_bytes = slice->kv_->bytes();
    kv_per_token =
        fmt::format("{} bytes per token and layer ({} K and V, {} heads x {}{})",
                    config.kv_values_per_token_layer() * slice->kv_->element_bytes(),
                    options.kv_cache_dtype == KvCacheDtype::kFp8E4m3 ? "fp8_e4m3" : "fp32",
                    config.num_kv_heads, config.head_dim, scales_from);
  }
  RS_LOG_INFO(
      "loaded {} layers [{}, {}) of {} from {} ({} files mapped, quantization {}), KV {} blocks x "
      "{} ({} MB), {}",
      ArchitectureName(config.architecture), layers.first, layers.last, config.num_layers,
      options.model_dir, weights->OpenedFiles().size(), quant::QuantMethodName(quant.method),
      options.kv_num_blocks, options.kv_block_size, kv_bytes >> 20, kv_per_token);
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
  std::vector<float> h(tokens * hidden);
  cpu::RmsNorm(x.data(), w.input_norm.data(), tokens, hidden, c.rms_norm_eps, h.data());
  if (c.mla) {
    std::vector<float> attn_out(tokens * hidden);
    MlaAttention({.config = &c,
                  .weights = &w.mla,
                  .chunks = batch.chunks,
                  .positions = positions.data(),
                  .inv_freq = inv_freq_.data(),
                  .kv = latent_kv_->Layer(local_layer),
                  .path = std::nullopt},
                 h.data(), attn_out.data());
    h.swap(attn_out);
  } else {
    RunAttention(local_layer, batch, positions, h);
  }
  cpu::Add(x.data(), h.data(), tokens * hidden);
  RunMlp(w, tokens, x, h);
}

void CpuModelSlice::RunAttention(int local_layer, const MicroBatch& batch,
                                 const std::vector<int32_t>& positions, std::vector<float>& h) {
  const LayerWeights& w = layers_[local_layer];
  const ModelConfig& c = config_;
  const int64_t tokens = static_cast<int64_t>(positions.size());
  const int64_t hidden = c.hidden_size;
  const int64_t q_size = c.q_size();
  const int64_t kv_size = c.kv_size();
  auto bias = [](const std::vector<float>& b) { return b.empty() ? nullptr : b.data(); };
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
  cpu::ApplyPartialRope(q.data(), tokens, c.num_heads, c.head_dim, c.rotary_dim, positions.data(),
                        inv_freq_.data());
  cpu::ApplyPartialRope(k.data(), tokens, c.num_kv_heads, c.head_dim, c.rotary_dim,
                        positions.data(), inv_freq_.data());

  const cpu::KvLayerView kv = kv_->Layer(local_layer);
  const float scale = c.AttentionScale();
  const cpu::AttentionVariant variant{
      .sliding_window = c.SlidingWindowOf(options_.layers.first + local_layer),
      .sinks = w.sinks.empty() ? nullptr : w.sinks.data()};
  std::vector<float> attn(tokens * q_size);
  int64_t offset = 0;
  for (const SequenceChunk& chunk : batch.chunks) {
    cpu::WriteKv(kv, chunk.block_table, chunk.start_position, chunk.num_tokens,
                 k.data() + offset * kv_size, v.data() + offset * kv_size);
    cpu::PagedAttention(q.data() + offset * q_size, chunk.num_tokens, c.num_heads, kv,
                        chunk.block_table, chunk.start_position, scale, variant,
                        attn.data() + offset * q_size);
    offset += chunk.num_tokens;
  }
  cpu::MatMul(attn.data(), w.o_w.data(), bias(w.o_b), tokens, q_size, hidden, h.data());
}

void CpuModelSlice::RunMlp(const LayerWeights& w, int64_t tokens, std::vector<float>& x,
                           std::vector<float>& h) {
  const ModelConfig& c = config_;
  const int64_t hidden = c.hidden_size;
  cpu::RmsNorm(x.data(), w.post_norm.data(), tokens, hidden, c.rms_norm_eps, h.data());
  if (w.moe != nullptr) {
    std::vector<float> moe_out(tokens * hidden);
    CpuMoeForward(c.moe, c.hidden_size, *w.moe, h.data(), tokens, moe_out.data());
    cpu::Add(x.data(), moe_out.data(), tokens * hidden);
    return;
  }
  const int64_t inter = c.intermediate_size;
  std::vector<float> gate(tokens * inter), up(tokens * inter);
  cpu::MatMul(h.data(), w.gate_w.data(), nullptr, tokens, hidden, inter, gate.data());
  cpu::MatMul(h.data(), w.up_w.data(), nullptr, tokens, hidden, inter, up.data());
  cpu::SiluMul(gate.data(), up.data(), tokens * inter, gate.data());
  cpu::MatMul(gate.data(), w.down_w.data(), nullptr, tokens, inter, hidden, h.data());
  cpu::Add(x.data(), h.data(), tokens * hidden);
}

absl::Status CpuModelSlice::Prepare(const MicroBatch& batch) {
  logits_.clear();
  has_logits_ = false;
  RS_RETURN_IF_ERROR(ValidateMicroBatch(batch, {},
                                        {.max_positions = config_.max_position_embeddings,
                                         .max_positions_name = "max_position_embeddings",
                                         .kv_block_size = options_.kv_block_size,
                                         .kv_num_blocks = options_.kv_num_blocks,
                                         .vocab_size = config_.vocab_size,
                                         .hidden_size = config_.hidden_size,
                                         .is_first = is_first(),
                                         .hidden_in_resident = true}));
  return activations_->Resize(batch.TotalTokens());
}

absl::Status CpuModelSlice::Run(const MicroBatch& batch) {
  logits_.clear();
  has_logits_ = false;
  std::vector<float>& x = activations_->values();
  RS_RETURN_IF_ERROR(Validate(batch, x));
  const int64_t tokens = batch.TotalTokens();
  const int64_t hidden = config_.hidden_size;
  std::vector<int32_t> positions;
  positions.reserve(tokens);
  for (const SequenceChunk& chunk : batch.chunks) {
    for (int32_t i = 0; i < chunk.num_tokens; ++i) positions.push_back(chunk.start_position + i);
  }
  if (is_first()) {
    RS_RETURN_IF_ERROR(activations_->Resize(tokens));
    cpu::Embed(embedding_.data(), hidden, batch.token_ids.data(), tokens, x.data());
  }
  for (int layer = 0; layer < options_.layers.size(); ++layer) RunLayer(layer, batch, positions, x);
  if (!is_last()) return absl::OkStatus();

  // Norm and project only the rows each chunk asks logits for.
  logits_ =
      cpu::NormAndProjectRows(x.data(), batch.LogitRows(), final_norm_.data(), lm_head_.data(),
                              hidden, config_.vocab_size, config_.rms_norm_eps);
  has_logits_ = true;
  return absl::OkStatus();
}

absl::StatusOr<std::vector<float>> CpuModelSlice::LogitsToHost() {
  if (!is_last() || !has_logits_) {
    return absl::FailedPreconditionError("LogitsToHost: needs the last slice after a Run");
  }
  return logits_;
}

absl::StatusOr<SampledRows> CpuModelSlice::Sample(const MicroBatch& batch,
                                                  std::span<const RowSampling> rows) {
  if (!is_last() || !has_logits_) {
    return absl::FailedPreconditionError("Sample: needs the last slice after Run(batch)");
  }
  const int vocab = config_.vocab_size;
  size_t logits_rows = 0;  // LAST_TOKEN chunks 1, ALL_TOKENS chunks num_tokens
  for (const SequenceChunk& chunk : batch.chunks) {
    logits_rows += chunk.logits == LogitsMode::kLastToken   ? 1
                   : chunk.logits == LogitsMode::kAllTokens ? chunk.num_tokens
                                                            : 0;
  }
  if (rows.size() != logits_rows || logits_.size() != rows.size() * static_cast<size_t>(vocab)) {
    return absl::InvalidArgumentError(
        fmt::format("{} sampling rows for {} logits rows (the slice holds {})", rows.size(),
                    logits_rows, logits_.size() / vocab));
  }
  SampledRows sampled;
  RS_ASSIGN_OR_RETURN(sampled.tokens, SampleTokens(logits_, vocab, rows));
  for (size_t row = 0; row < sampled.tokens.size(); ++row) {
    sampled.logprobs.push_back(TokenLogprob(
        std::span<const float>(logits_).subspan(row * vocab, vocab), sampled.tokens[row]));
  }
  return sampled;
}

void CpuModelSlice::BeginStepTiming() { step_start_ = absl::Now(); }

void CpuModelSlice::EndStepTiming() {
  step_us_ += absl::ToInt64Microseconds(absl::Now() - step_start_);
}

int64_t CpuModelSlice::TakeStepMicros() { return std::exchange(step_us_, 0); }

}  // namespace ringserve
