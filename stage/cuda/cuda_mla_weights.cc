#include "stage/cuda/cuda_mla_weights.h"

#include <cmath>
#include <map>
#include <string>

#include "common/status_macros.h"
#include "fmt/format.h"
#include "kernels/cuda/elementwise.h"
#include "stage/model/slice_weights.h"

namespace ringserve::cuda {
namespace {

constexpr int64_t kAlign = 256;

int64_t AlignUp(int64_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

}  // namespace

absl::StatusOr<std::unique_ptr<CudaMlaLayerWeights>> CudaMlaLayerWeights::Create(
    const ModelConfig& config) {
  if (!config.mla) return absl::InvalidArgumentError("CudaMlaLayerWeights: the model has no MLA");
  const MlaConfig& m = *config.mla;
  if (m.attention_bias) {
    return absl::InvalidArgumentError(
        "multi-head latent attention on CUDA: unsupported attention_bias true");
  }
  std::unique_ptr<CudaMlaLayerWeights> l(new CudaMlaLayerWeights());
  l->mla_ = m;
  l->hidden_ = config.hidden_size;
  l->heads_ = config.num_heads;
  const int64_t h = config.hidden_size, heads = config.num_heads;
  CudaMlaWeights& w = l->w_;
  auto carve = [&](char* base) {
    int64_t offset = 0;
    auto take = [&](int64_t elems) -> bf16* {
      bf16* p = base ? reinterpret_cast<bf16*>(base + offset) : nullptr;
      offset += AlignUp(elems * 2);
      return p;
    };
    if (m.q_lora_rank > 0) {
      w.q_a = take(int64_t{m.q_lora_rank} * h);
      w.q_a_norm = take(m.q_lora_rank);
      w.q_b = take(heads * m.qk_head_dim() * m.q_lora_rank);
    } else {
      w.q = take(heads * m.qk_head_dim() * h);
    }
    w.kv_a = take(int64_t{m.latent_cache_dim()} * h);
    w.kv_a_norm = take(m.kv_lora_rank);
    w.kv_b = take(heads * (m.qk_nope_head_dim + m.v_head_dim) * m.kv_lora_rank);
    w.o = take(h * heads * m.v_head_dim);
    return offset;
  };
  RS_RETURN_IF_ERROR(l->buffer_.Allocate(carve(nullptr)));
  carve(l->buffer_.as<char>());
  return l;
}

absl::Status CudaMlaLayerWeights::Load(const ModelConfig& config, int layer,
                                       const CudaMoeLayer::UploadFn& upload) {
  const std::string p = fmt::format("model.layers.{}.self_attn.", layer);
  const std::map<std::string, const bf16*> where = {
      {p + "q_a_proj.weight", w_.q_a},
      {p + "q_a_layernorm.weight", w_.q_a_norm},
      {p + "q_b_proj.weight", w_.q_b},
      {p + "q_proj.weight", w_.q},
      {p + "kv_a_proj_with_mqa.weight", w_.kv_a},
      {p + "kv_a_layernorm.weight", w_.kv_a_norm},
      {p + "kv_b_proj.weight", w_.kv_b},
      {p + "o_proj.weight", w_.o},
  };
  for (const TensorSpec& spec : MlaAttentionTensorSpecs(config, layer)) {
    const auto it = where.find(spec.name);
    if (it == where.end() || it->second == nullptr) {
      return absl::InternalError(fmt::format("no CUDA MLA destination for tensor {}", spec.name));
    }
    RS_RETURN_IF_ERROR(upload(spec, const_cast<bf16*>(it->second)));
  }
  return absl::OkStatus();
}

absl::Status CudaMlaLayerWeights::Randomize(uint64_t seed, cudaStream_t stream) {
  const float lin = 0.02f * std::sqrt(3.0f);  // uniform with std 0.02
  uint64_t id = seed * 6151u + 29;
  auto fill = [&](const bf16* p, int64_t n, float center, float scale) {
    return p ? LaunchFillRandom(const_cast<bf16*>(p), n, ++id, center, scale, stream)
             : absl::OkStatus();
  };
  const MlaConfig& m = mla_;
  RS_RETURN_IF_ERROR(fill(w_.q_a, int64_t{m.q_lora_rank} * hidden_, 0.0f, lin));
  RS_RETURN_IF_ERROR(fill(w_.q_a_norm, m.q_lora_rank, 1.0f, 0.1f));
  RS_RETURN_IF_ERROR(fill(w_.q_b, heads_ * m.qk_head_dim() * m.q_lora_rank, 0.0f, lin));
  RS_RETURN_IF_ERROR(fill(w_.q, heads_ * m.qk_head_dim() * hidden_, 0.0f, lin));
  RS_RETURN_IF_ERROR(fill(w_.kv_a, int64_t{m.latent_cache_dim()} * hidden_, 0.0f, lin));
  RS_RETURN_IF_ERROR(fill(w_.kv_a_norm, m.kv_lora_rank, 1.0f, 0.1f));
  RS_RETURN_IF_ERROR(
      fill(w_.kv_b, heads_ * (m.qk_nope_head_dim + m.v_head_dim) * m.kv_lora_rank, 0.0f, lin));
  RS_RETURN_IF_ERROR(fill(w_.o, hidden_ * heads_ * m.v_head_dim, 0.0f, lin));
  RS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return absl::OkStatus();
}

}  // namespace ringserve::cuda
