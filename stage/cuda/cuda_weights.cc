// Loading a slice's checkpoint tensors straight into the CUDA slice's weight buffer: one tensor
// at a time through a small pinned staging buffer (never the whole model in host memory),
// converting fp32/fp16 to bf16 on the GPU, and fusing q/k/v and gate/up into one matrix each.
// Quantized linear weights that QuantLinears holds quantized (cuda_quant_linear.h) are skipped
// here; the others are dequantized on the host by the shared loader
// (stage/model/quantized_weights.h), one tensor at a time, and uploaded as fp32 -> bf16. Quantized
// MoE routed experts (gpt-oss's stacked MXFP4 too) are held quantized by the MoE layer where they
// pack (cuda_moe_layer.h; quantized_expert_bytes); the rest (shared experts, sizes off the
// kernels' chunk) take the dequantizing path and the memory report counts them
// (dequantized_expert_bytes).
#include <cstring>
#include <map>
#include <set>

#include "absl/status/status.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "fmt/format.h"
#include "kernels/cuda/elementwise.h"
#include "stage/cuda/cuda_model_slice.h"
#include "stage/model/kv_cache_scales.h"
#include "stage/model/quantized_weights.h"
#include "stage/model/safetensors.h"
#include "stage/model/slice_weights.h"

namespace ringserve::cuda {
namespace {

constexpr int64_t kStagingBytes = int64_t{16} << 20;

class Uploader {
 public:
  explicit Uploader(cudaStream_t stream) : stream_(stream) {}
  ~Uploader() {
    if (pinned_) cudaFreeHost(pinned_);
  }

  absl::Status Init() {
    RS_CUDA_RETURN_IF_ERROR(cudaMallocHost(&pinned_, kStagingBytes));
    return convert_.Allocate(kStagingBytes);
  }

  // Copies the tensor's elements to dst[0, n) as bf16.
  absl::Status Upload(const TensorView& view, bf16* dst) {
    const DType dtype = view.info->dtype;
    if (!IsFloatDType(dtype)) {
      return absl::InvalidArgumentError(
          fmt::format("{}: tensor \"{}\" has dtype {}, expected F32, F16 or BF16", view.file,
                      view.info->name, DTypeName(dtype)));
    }
    const int64_t elem = static_cast<int64_t>(DTypeSize(dtype));
    const int64_t n = view.info->NumElements();
    const int64_t chunk_elems = kStagingBytes / elem;
    for (int64_t e0 = 0; e0 < n; e0 += chunk_elems) {
      const int64_t count = std::min(chunk_elems, n - e0);
      std::memcpy(pinned_, view.bytes.data() + e0 * elem, count * elem);
      if (dtype == DType::kBF16) {
        RS_CUDA_RETURN_IF_ERROR(
            cudaMemcpyAsync(dst + e0, pinned_, count * elem, cudaMemcpyHostToDevice, stream_));
      } else {
        RS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(convert_.get(), pinned_, count * elem,
                                                cudaMemcpyHostToDevice, stream_));
        if (dtype == DType::kF32) {
          RS_RETURN_IF_ERROR(LaunchF32ToBF16(convert_.as<float>(), dst + e0, count, stream_));
        } else {
          RS_RETURN_IF_ERROR(LaunchF16ToBF16(convert_.as<uint16_t>(), dst + e0, count, stream_));
        }
      }
      // The pinned buffer is reused by the next chunk.
      RS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    }
    return absl::OkStatus();
  }

 private:
  cudaStream_t stream_;
  void* pinned_ = nullptr;
  DeviceBuffer convert_;
};

}  // namespace

absl::Status CudaModelSlice::LoadWeights() {
  // The q/k/v, o, gate/up and down weights QuantLinears holds (no bf16 destination).
  auto IsHeldQuantized = [&](int i, const std::string& suffix) {
    const bool qkv = suffix.starts_with("self_attn.") && suffix.find("_proj.weight") == 11;
    if (qkv && suffix != "self_attn.o_proj.weight")
      return quant_.Get(i, LayerLinear::kQkv) != nullptr;
    if (suffix == "self_attn.o_proj.weight") return quant_.Get(i, LayerLinear::kO) != nullptr;
    if (suffix == "mlp.gate_proj.weight" || suffix == "mlp.up_proj.weight") {
      return quant_.Get(i, LayerLinear::kGateUp) != nullptr;
    }
    return suffix == "mlp.down_proj.weight" && quant_.Get(i, LayerLinear::kDown) != nullptr;
  };
  const ModelConfig& c = config_;
  RS_ASSIGN_OR_RETURN(const quant::QuantConfig quant, quant::LoadQuantConfig(options_.model_dir));
  RS_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsModel> weights,
                      SafetensorsModel::Open(options_.model_dir));
  if (options_.kv_cache_dtype == KvCacheDtype::kFp8E4m3) {
    RS_ASSIGN_OR_RETURN(KvCacheScales scales, LoadKvCacheScales(*weights, options_.layers));
    kv_k_scales_ = std::move(scales.k);
    kv_v_scales_ = std::move(scales.v);
  }
  Uploader uploader(stream_);
  RS_RETURN_IF_ERROR(uploader.Init());
  auto load = [&](const TensorSpec& spec, bf16* dst) -> absl::Status {
    if (IsQuantizedWeight(quant, spec)) {
      RS_ASSIGN_OR_RETURN(std::vector<float> values, ReadWeightFloat(*weights, quant, spec));
      const TensorInfo info{.name = spec.name,
                            .dtype = DType::kF32,
                            .shape = spec.shape,
                            .offset = 0,
                            .num_bytes = values.size() * sizeof(float)};
      return uploader.Upload(
          {.info = &info,
           .bytes = {reinterpret_cast<const uint8_t*>(values.data()), info.num_bytes},
           .file = options_.model_dir},
          dst);
    }
    RS_ASSIGN_OR_RETURN(TensorView view, weights->Get(spec.name, spec.shape));
    return uploader.Upload(view, dst);
  };
  const int64_t h = c.hidden_size, d = c.head_dim, inter = c.intermediate_size;
  const int64_t q_rows = int64_t{c.num_heads} * d, kv_rows = int64_t{c.num_kv_heads} * d;
  for (int i = 0; i < options_.layers.size(); ++i) {
    const int layer = options_.layers.first + i;
    const LayerWeights& w = layers_[i];
    const std::string prefix = fmt::format("model.layers.{}.", layer);
    const std::map<std::string, bf16*> where = {
        {"input_layernorm.weight", w.input_norm},
        {"self_attn.q_proj.weight", w.qkv},
        {"self_attn.k_proj.weight", w.qkv ? w.qkv + q_rows * h : nullptr},
        {"self_attn.v_proj.weight", w.qkv ? w.qkv + (q_rows + kv_rows) * h : nullptr},
        {"self_attn.q_proj.bias", w.qkv_bias},
        {"self_attn.k_proj.bias", w.qkv_bias ? w.qkv_bias + q_rows : nullptr},
        {"self_attn.v_proj.bias", w.qkv_bias ? w.qkv_bias + q_rows + kv_rows : nullptr},
        {"self_attn.q_norm.weight", w.q_norm},
        {"self_attn.k_norm.weight", w.k_norm},
        {"self_attn.o_proj.weight", w.o},
        {"self_attn.o_proj.bias", w.o_bias},
        {"post_attention_layernorm.weight", w.post_norm},
        {"mlp.gate_proj.weight", w.gate_up},
        {"mlp.up_proj.weight", w.gate_up ? w.gate_up + inter * h : nullptr},
        {"mlp.down_proj.weight", w.down},
    };
    std::set<std::string> moe_tensors;  // loaded by the MoE layer
    if (moe_[i] != nullptr) {
      for (const TensorSpec& spec : MoeLayerTensorSpecs(c, layer).All()) {
        moe_tensors.insert(spec.name);
      }
      RS_RETURN_IF_ERROR(moe_[i]->Load(c, layer, *weights, load, stream_, &quant));
      const MoeTensorSpecs moe_specs = MoeLayerTensorSpecs(c, layer);
      std::set<std::string> routed;  // the per-expert tensors the layer may hold quantized
      for (const auto* specs : {&moe_specs.gate, &moe_specs.up, &moe_specs.down}) {
        for (const TensorSpec& spec : *specs) routed.insert(spec.name);
      }
      for (const auto* spec : {&moe_specs.gate_up, &moe_specs.stacked_down}) {
        if (spec->has_value()) routed.insert((*spec)->name);  // gpt-oss's stacked experts
      }
      int64_t dequantized = 0;
      for (const TensorSpec& spec : moe_specs.All()) {
        if (moe_[i]->experts_quantized() && routed.count(spec.name) > 0) continue;
        if (IsQuantizedWeight(quant, spec)) dequantized += TensorBytes({spec}, sizeof(bf16));
      }
      if (dequantized > 0) {
        RS_LOG_INFO("layer {}: {} MiB of {} experts dequantized to bf16 at load", layer,
                    dequantized >> 20, quant::QuantMethodName(quant.method));
      }
      dequantized_expert_bytes_ += dequantized;
      quantized_expert_bytes_ += moe_[i]->quantized_expert_bytes();
    }
    // DeepSeek: the attention tensors, loaded by mla_[i] (skipped below as the MoE ones are).
    if (!mla_.empty() && mla_[i] != nullptr) {
      for (const TensorSpec& spec : MlaAttentionTensorSpecs(c, layer))
        moe_tensors.insert(spec.name);
      RS_RETURN_IF_ERROR(mla_[i]->Load(c, layer, load));
    }
    for (const TensorSpec& spec : LayerTensorSpecs(c, layer)) {
      if (moe_tensors.count(spec.name) > 0) continue;
      if (w.sinks != nullptr && spec.name == prefix + "self_attn.sinks") {
        // fp32 on the device: a logit of the softmax, kept at the checkpoint's precision.
        RS_ASSIGN_OR_RETURN(const std::vector<float> sinks,
                            weights->ReadFloat(spec.name, spec.shape));
        RS_CUDA_RETURN_IF_ERROR(cudaMemcpy(w.sinks, sinks.data(), sinks.size() * sizeof(float),
                                           cudaMemcpyHostToDevice));
        continue;
      }
      const auto it = where.find(spec.name.substr(prefix.size()));
      if (it != where.end() && IsHeldQuantized(i, it->first)) continue;
      if (it == where.end() || it->second == nullptr) {
        return absl::InternalError(fmt::format("no CUDA destination for tensor {}", spec.name));
      }
      RS_RETURN_IF_ERROR(load(spec, it->second));
    }
  }
  if (is_first()) RS_RETURN_IF_ERROR(load(EmbeddingSpec(c), embedding_));
  if (is_last()) {
    RS_RETURN_IF_ERROR(load(FinalNormSpec(c), final_norm_));
    if (lm_head_ != embedding_) RS_RETURN_IF_ERROR(load(LmHeadSpec(c, *weights), lm_head_));
  }
  // DeepSeek's MTP layer, for drafting (cuda_mtp_layer.h): allocated before AllocateRuntime sizes
  // the KV pool, which gets one more latent layer for it.
  if (cuda_.load_mtp && is_last() && c.mla) {
    auto mtp = CudaMtpLayer::Create(c, *weights, embedding_, lm_head_);
    if (mtp.ok()) {
      mtp_ = *std::move(mtp);
      RS_RETURN_IF_ERROR(mtp_->Load(*weights, load, stream_));
      RS_LOG_INFO("CUDA slice: loaded the MTP layer (model.layers.{}.*, {} block)", mtp_->layer(),
                  mtp_->moe() ? "MoE" : "dense");
    } else if (absl::IsNotFound(mtp.status())) {
      RS_LOG_WARN("no MTP layer: {}", std::string(mtp.status().message()));
    } else {
      return mtp.status();
    }
  }
  return absl::OkStatus();
}

}  // namespace ringserve::cuda
