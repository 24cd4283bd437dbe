#include "stage/cuda/cuda_mtp_layer.h"

#include <map>
#include <set>
#include <string>

#include "common/status_macros.h"
#include "fmt/format.h"
#include "stage/model/slice_weights.h"

namespace ringserve::cuda {
namespace {

constexpr int64_t kAlign = 256;

int64_t AlignUp(int64_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

}  // namespace

ModelConfig CudaMtpLayer::LayerConfig(const ModelConfig& config) {
  ModelConfig c = config;
  const int layer = config.num_layers;
  if (config.moe.enabled() && config.mla && layer >= config.mla->first_k_dense_replace) {
    c.moe.layers.resize(layer + 1, false);
    c.moe.layers[layer] = true;
  }
  return c;
}

absl::StatusOr<std::unique_ptr<CudaMtpLayer>> CudaMtpLayer::Create(const ModelConfig& config,
                                                                   const SafetensorsModel& weights,
                                                                   const bf16* embedding,
                                                                   const bf16* lm_head) {
  if (!config.mla || config.mla->num_nextn_predict_layers < 1) {
    return absl::InvalidArgumentError(
        "no MTP layer: the config has no multi-head latent attention or "
        "num_nextn_predict_layers is 0");
  }
  const int layer = config.num_layers;
  const std::string p = fmt::format("model.layers.{}.", layer);
  if (!weights.Contains(p + "eh_proj.weight")) {
    return absl::NotFoundError(
        fmt::format("the checkpoint has no MTP layer ({}eh_proj.weight)", p));
  }
  if (lm_head == nullptr) {
    return absl::InvalidArgumentError("CudaMtpLayer: the slice's lm_head is needed");
  }
  std::unique_ptr<CudaMtpLayer> mtp(new CudaMtpLayer());
  mtp->config_ = LayerConfig(config);
  mtp->layer_ = layer;
  const ModelConfig& c = mtp->config_;
  const bool moe = c.moe.IsMoeLayer(layer);
  if (weights.Contains(p + "embed_tokens.weight")) {
    mtp->embedding_name_ = p + "embed_tokens.weight";
  } else if (embedding == nullptr) {
    mtp->embedding_name_ = "model.embed_tokens.weight";
  }
  if (weights.Contains(p + "shared_head.head.weight")) {
    mtp->head_name_ = p + "shared_head.head.weight";
  }
  const int64_t h = c.hidden_size, inter = c.intermediate_size, vocab = c.vocab_size;
  Weights& w = mtp->w_;
  auto carve = [&](char* base) {
    int64_t offset = 0;
    auto take = [&](int64_t elems) -> bf16* {
      bf16* at = base ? reinterpret_cast<bf16*>(base + offset) : nullptr;
      offset += AlignUp(elems * 2);
      return at;
    };
    w.enorm = take(h);
    w.hnorm = take(h);
    w.eh_proj = take(2 * h * h);
    w.input_norm = take(h);
    w.post_norm = take(h);
    if (!moe) {
      w.gate_up = take(2 * inter * h);
      w.down = take(h * inter);
    }
    w.head_norm = take(h);
    w.embedding = mtp->embedding_name_.empty() ? embedding : take(vocab * h);
    w.head = mtp->head_name_.empty() ? lm_head : take(vocab * h);
    return offset;
  };
  RS_RETURN_IF_ERROR(mtp->buffer_.Allocate(carve(nullptr)));
  carve(mtp->buffer_.as<char>());
  RS_CUDA_RETURN_IF_ERROR(cudaMemset(mtp->buffer_.get(), 0, mtp->buffer_.bytes()));
  RS_ASSIGN_OR_RETURN(mtp->attention_, CudaMlaLayerWeights::Create(c));
  if (moe) {
    RS_ASSIGN_OR_RETURN(mtp->moe_, CudaMoeLayer::Create(c));
  }
  return mtp;
}

absl::Status CudaMtpLayer::Load(SafetensorsModel& weights, const CudaMoeLayer::UploadFn& upload,
                                cudaStream_t stream) {
  const ModelConfig& c = config_;
  const int64_t h = c.hidden_size, inter = c.intermediate_size, vocab = c.vocab_size;
  const std::string p = fmt::format("model.layers.{}.", layer_);
  // eh_proj and an own head are linear layers (a quantized checkpoint's loader dequantizes them).
  auto load = [&](const std::string& name, std::vector<int64_t> shape, const bf16* dst,
                  bool linear = false) {
    return upload(TensorSpec{.name = name, .shape = std::move(shape), .linear = linear},
                  const_cast<bf16*>(dst));
  };
  RS_RETURN_IF_ERROR(load(p + "enorm.weight", {h}, w_.enorm));
  RS_RETURN_IF_ERROR(load(p + "hnorm.weight", {h}, w_.hnorm));
  RS_RETURN_IF_ERROR(load(p + "eh_proj.weight", {h, 2 * h}, w_.eh_proj, true));
  RS_RETURN_IF_ERROR(load(p + "shared_head.norm.weight", {h}, w_.head_norm));
  if (!embedding_name_.empty()) RS_RETURN_IF_ERROR(load(embedding_name_, {vocab, h}, w_.embedding));
  if (!head_name_.empty()) RS_RETURN_IF_ERROR(load(head_name_, {vocab, h}, w_.head, true));
  std::set<std::string> elsewhere;  // loaded by the attention or the MoE block
  for (const TensorSpec& spec : MlaAttentionTensorSpecs(c, layer_)) elsewhere.insert(spec.name);
  RS_RETURN_IF_ERROR(attention_->Load(c, layer_, upload));
  if (moe_ != nullptr) {
    for (const TensorSpec& spec : MoeLayerTensorSpecs(c, layer_).All()) {
      elsewhere.insert(spec.name);
    }
    RS_RETURN_IF_ERROR(moe_->Load(c, layer_, weights, upload, stream));
  }
  const std::map<std::string, bf16*> where = {
      {"input_layernorm.weight", w_.input_norm},
      {"post_attention_layernorm.weight", w_.post_norm},
      {"mlp.gate_proj.weight", w_.gate_up},
      {"mlp.up_proj.weight", w_.gate_up ? w_.gate_up + inter * h : nullptr},
      {"mlp.down_proj.weight", w_.down},
  };
  for (const TensorSpec& spec : LayerTensorSpecs(c, layer_)) {
    if (elsewhere.count(spec.name) > 0) continue;
    const auto it = where.find(spec.name.substr(p.size()));
    if (it == where.end() || it->second == nullptr) {
      return absl::InternalError(fmt::format("no CUDA MTP destination for tensor {}", spec.name));
    }
    RS_RETURN_IF_ERROR(upload(spec, it->second));
  }
  RS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return absl::OkStatus();
}

int64_t CudaMtpLayer::weight_bytes() const {
  return static_cast<int64_t>(buffer_.bytes()) + attention_->weight_bytes() +
         (moe_ ? moe_->weight_bytes() : 0);
}

}  // namespace ringserve::cuda
