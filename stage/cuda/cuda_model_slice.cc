#include "stage/cuda/cuda_model_slice.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/status/status.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "fmt/format.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/device_info.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/rope.h"
#include "kernels/cuda/sampling.h"

namespace ringserve::cuda {

namespace {

constexpr int64_t kAlign = 256;
constexpr int64_t kKvReserveBytes = int64_t{768} << 20;  // graphs, cuBLAS, fragmentation
constexpr int64_t kDecodeWorkspaceBytes = int64_t{256} << 20;

int64_t AlignUp(int64_t x, int64_t a) { return (x + a - 1) / a * a; }

AttentionDims AttentionDimsOf(const ModelConfig& c) {
  return {.head_dim = c.head_dim, .num_heads = c.num_heads, .num_kv_heads = c.num_kv_heads};
}

absl::Status Unsupported(const ModelConfig& c) {
  bool dense_layer = false;
  for (int l = 0; l < c.num_layers; ++l) dense_layer = dense_layer || !c.moe.IsMoeLayer(l);
  if (c.head_dim % 8 != 0 || c.hidden_size % 8 != 0 ||
      (dense_layer && c.intermediate_size % 8 != 0) || c.rotary_dim % 2 != 0) {
    return absl::InvalidArgumentError(fmt::format(
        "CUDA backend needs head_dim, hidden_size and intermediate_size multiples of 8 and an "
        "even rotary_dim (got {}, {}, {}, {})",
        c.head_dim, c.hidden_size, c.intermediate_size, c.rotary_dim));
  }
  return CheckAttentionSupported(AttentionDimsOf(c));
}

// Sliding windows run only in the CUDA-core decode kernel and sinks only in the decode kernels:
// such models attend with the CUDA-core decode kernel, prefill included (one entry per token).
void RestrictToAttentionVariants(const ModelConfig& c, KernelPlan* plan) {
  if (c.sliding_layers.empty() && !c.attention_sinks) return;
  plan->decode_attention = DecodeAttentionKernel::kCudaCore;
  plan->decode_ctas_per_sm = 3;
  plan->prefill_attention = PrefillAttentionKernel::kDecodeKernel;
  plan->prefill_tile_rows = 0;
}

}  // namespace

absl::Status CudaModelSlice::ReselectKernels(const KernelOptions& options) {
  RS_CUDA_RETURN_IF_ERROR(cudaSetDevice(cuda_.device));
  RS_ASSIGN_OR_RETURN(const KernelPlan selected,
                      SelectKernelsForDevice(cuda_.device, AttentionDimsOf(config_), options));
  KernelPlan plan = selected;
  RestrictToAttentionVariants(config_, &plan);
  // The GEMM plans (tuned ones too) stay when the GEMM options do not change.
  if (!(plan.gemm == kernels_.gemm)) {
    RS_RETURN_IF_ERROR(gemm_->Reconfigure(GemmOptionsFor(plan.gemm)));
  }
  ResetGraphs();
  kernels_ = plan;
  cuda_.kernels = options;
  stream_.dependent = plan.dependent_launch;
  return absl::OkStatus();
}

void CudaModelSlice::ResetGraphs() {
  for (auto& [key, graph] : graphs_) {
    if (graph.exec) cudaGraphExecDestroy(graph.exec);
  }
  graphs_.clear();
}

CudaModelSlice::~CudaModelSlice() {
  ResetGraphs();
  if (meta_uploaded_) cudaEventDestroy(meta_uploaded_);
  if (meta_host_) cudaFreeHost(meta_host_);
  for (SampleSlot& slot : sample_slots_) {
    if (slot.copied) cudaEventDestroy(slot.copied);
  }
  if (sample_host_) cudaFreeHost(sample_host_);
  if (stream_) cudaStreamDestroy(stream_);
}

absl::StatusOr<std::unique_ptr<CudaModelSlice>> CudaModelSlice::Load(const SliceOptions& options,
                                                                     const CudaSliceOptions& cuda) {
  RS_ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(options.model_dir));
  std::unique_ptr<CudaModelSlice> slice(new CudaModelSlice());
  RS_RETURN_IF_ERROR(slice->Init(config, options, cuda));
  RS_ASSIGN_OR_RETURN(slice->quant_, QuantLinears::Load(config, options, slice->stream_));
  slice->quant_.AllowWgmmaFp8Gemm(cuda.kernels.fp8_gemm_sm90);
  RS_RETURN_IF_ERROR(slice->AllocateWeights());
  RS_RETURN_IF_ERROR(slice->LoadWeights());
  RS_RETURN_IF_ERROR(slice->AllocateRuntime());
  return slice;
}

absl::StatusOr<std::unique_ptr<CudaModelSlice>> CudaModelSlice::CreateRandom(
    const ModelConfig& config, const SliceOptions& options, const CudaSliceOptions& cuda,
    uint64_t seed) {
  std::unique_ptr<CudaModelSlice> slice(new CudaModelSlice());
  RS_RETURN_IF_ERROR(slice->Init(config, options, cuda));
  if (!cuda.random_quant.empty()) {
    RS_ASSIGN_OR_RETURN(const quant::PackedFormat format,
                        quant::ParsePackedFormat(cuda.random_quant));
    RS_ASSIGN_OR_RETURN(slice->quant_,
                        QuantLinears::Random(config, options, format, cuda.random_quant_group, seed,
                                             slice->stream_));
    slice->quant_.AllowWgmmaFp8Gemm(cuda.kernels.fp8_gemm_sm90);
  }
  RS_RETURN_IF_ERROR(slice->AllocateWeights());
  RS_RETURN_IF_ERROR(slice->RandomizeWeights(seed));
  RS_RETURN_IF_ERROR(slice->AllocateRuntime());
  return slice;
}

absl::Status CudaModelSlice::Init(const ModelConfig& config, const SliceOptions& options,
                                  const CudaSliceOptions& cuda) {
  config_ = config;
  options_ = options;
  cuda_ = cuda;
  const LayerRange layers = options.layers;
  if (layers.first < 0 || layers.first >= layers.last || layers.last > config.num_layers) {
    return absl::InvalidArgumentError(
        fmt::format("{}: layer range [{}, {}) is not a non-empty part of [0, {})",
                    options.model_dir, layers.first, layers.last, config.num_layers));
  }
  if (options.kv_block_size <= 0 || (!cuda.kv_from_free_memory && options.kv_num_blocks <= 0) ||
      cuda.max_batch_tokens <= 0 || cuda.max_seqs <= 0 || cuda.max_logit_rows <= 0 ||
      !(cuda.memory_utilization > 0 && cuda.memory_utilization <= 1) ||
      !(cuda.device_share >= 0 && cuda.device_share <= 1)) {
    return absl::InvalidArgumentError(
        "CUDA slice options: kv_block_size, kv_num_blocks (unless sized from memory), "
        "max_batch_tokens, max_seqs and max_logit_rows must be positive, memory_utilization "
        "in (0, 1] and device_share in [0, 1]");
  }
  RS_RETURN_IF_ERROR(Unsupported(config));
  if (config.mla && options.kv_cache_dtype != KvCacheDtype::kAuto) {
    return absl::InvalidArgumentError(
        "kv_cache_dtype: an fp8 KV cache is not built for DeepSeek's latent (MLA) cache; use auto");
  }
  if (cuda_.max_model_len <= 0) cuda_.max_model_len = config.max_position_embeddings;
  cuda_.max_model_len = std::min(cuda_.max_model_len, config.max_position_embeddings);
  cuda_.max_graph_batch = std::min({cuda_.max_graph_batch, cuda_.max_logit_rows, cuda_.max_seqs});
  // Decode graphs round contexts up to multiples of the split-K partition.
  const int64_t padded_len = AlignUp(cuda_.max_model_len, kDecodePartition);
  max_blocks_per_seq_ =
      static_cast<int>((padded_len + options.kv_block_size - 1) / options.kv_block_size);
  if (CudaDeviceCount() <= cuda.device) {
    return absl::FailedPreconditionError(fmt::format("no CUDA device {}", cuda.device));
  }
  RS_CUDA_RETURN_IF_ERROR(cudaSetDevice(cuda.device));
  RS_ASSIGN_OR_RETURN(kernels_,
                      SelectKernelsForDevice(cuda.device, AttentionDimsOf(config), cuda.kernels));
  RestrictToAttentionVariants(config, &kernels_);
  RS_LOG_INFO("CUDA slice [{}, {}) kernels: {}", layers.first, layers.last, kernels_.Summary());
  RS_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream_.stream, cudaStreamNonBlocking));
  stream_.dependent = kernels_.dependent_launch;
  RS_ASSIGN_OR_RETURN(gemm_, GemmRunner::Create(GemmOptionsFor(kernels_.gemm)));
  const std::vector<float> inv_freq = RopeInverseFrequencies(
      config.rope, config.rotary_dim > 0 ? config.rotary_dim : config.head_dim);
  RS_RETURN_IF_ERROR(inv_freq_.Allocate(inv_freq.size() * sizeof(float)));
  RS_CUDA_RETURN_IF_ERROR(cudaMemcpy(inv_freq_.get(), inv_freq.data(),
                                     inv_freq.size() * sizeof(float), cudaMemcpyHostToDevice));
  return absl::OkStatus();
}

absl::Status CudaModelSlice::AllocateWeights() {
  const ModelConfig& c = config_;
  const int64_t h = c.hidden_size, d = c.head_dim, inter = c.intermediate_size;
  const int64_t qkv_rows = (c.num_heads + 2 * c.num_kv_heads) * d;
  // Two passes: sizes with a null base, then pointers into one allocation.
  auto carve = [&](char* base) {
    int64_t offset = 0;
    auto take = [&](int64_t elems) -> bf16* {
      bf16* p = base ? reinterpret_cast<bf16*>(base + offset) : nullptr;
      offset += AlignUp(elems * 2, kAlign);
      return p;
    };
    layers_.assign(options_.layers.size(), LayerWeights{});
    for (int i = 0; i < static_cast<int>(layers_.size()); ++i) {
      LayerWeights& w = layers_[i];
      const bool moe = c.moe.IsMoeLayer(options_.layers.first + i);
      // Linear layers held quantized take no bf16 space.
      auto take_linear = [&](LayerLinear which, int64_t elems) {
        return quant_.Get(i, which) ? nullptr : take(elems);
      };
      w.input_norm = take(h);
      if (c.mla) {  // the attention weights live in mla_
        w.post_norm = take(h);
        if (moe) continue;
        w.gate_up = take(2 * inter * h);
        w.down = take(h * inter);
        continue;
      }
      w.qkv = take_linear(LayerLinear::kQkv, qkv_rows * h);
      if (c.qkv_bias) w.qkv_bias = take(qkv_rows);
      if (c.qk_norm) {
        w.q_norm = take(d);
        w.k_norm = take(d);
      }
      w.o = take_linear(LayerLinear::kO, h * c.num_heads * d);
      if (c.o_bias) w.o_bias = take(h);
      w.post_norm = take(h);
      if (c.attention_sinks) w.sinks = reinterpret_cast<float*>(take(2 * int64_t{c.num_heads}));
      if (moe) continue;  // the experts live in moe_
      w.gate_up = take_linear(LayerLinear::kGateUp, 2 * inter * h);
      w.down = take_linear(LayerLinear::kDown, h * inter);
    }
    embedding_ = is_first() ? take(int64_t{c.vocab_size} * h) : nullptr;
    if (is_last()) {
      final_norm_ = take(h);
      lm_head_ =
          (is_first() && c.tie_word_embeddings) ? embedding_ : take(int64_t{c.vocab_size} * h);
    }
    return offset;
  };
  const int64_t bytes = carve(nullptr);
  RS_RETURN_IF_ERROR(weight_buffer_.Allocate(bytes));
  carve(weight_buffer_.as<char>());
  // Sinks default to 0 (RandomizeWeights leaves them so).
  RS_CUDA_RETURN_IF_ERROR(cudaMemset(weight_buffer_.get(), 0, weight_buffer_.bytes()));
  moe_.clear();
  moe_.resize(options_.layers.size());
  for (int i = 0; i < options_.layers.size(); ++i) {
    if (!c.moe.IsMoeLayer(options_.layers.first + i)) continue;
    RS_ASSIGN_OR_RETURN(moe_[i], CudaMoeLayer::Create(c));
  }
  return AllocateMlaWeights();
}

int64_t CudaModelSlice::WeightBytes() const {
  int64_t bytes = static_cast<int64_t>(weight_buffer_.bytes()) + quant_.bytes();
  for (const auto& moe : moe_) bytes += moe ? moe->weight_bytes() : 0;
  for (const auto& mla : mla_) bytes += mla ? mla->weight_bytes() : 0;
  if (mtp_) bytes += mtp_->weight_bytes();
  return bytes;
}

absl::Status CudaModelSlice::RandomizeWeights(uint64_t seed) {
  const ModelConfig& c = config_;
  const int64_t h = c.hidden_size, d = c.head_dim, inter = c.intermediate_size;
  const int64_t qkv_rows = (c.num_heads + 2 * c.num_kv_heads) * d;
  const float lin = 0.02f * std::sqrt(3.0f);  // uniform with std 0.02
  uint64_t stream_id = seed * 1000003u;
  auto fill = [&](bf16* p, int64_t n, float center, float scale) {
    return p ? LaunchFillRandom(p, n, ++stream_id, center, scale, stream_) : absl::OkStatus();
  };
  for (LayerWeights& w : layers_) {
    RS_RETURN_IF_ERROR(fill(w.input_norm, h, 1.0f, 0.1f));
    RS_RETURN_IF_ERROR(fill(w.qkv, qkv_rows * h, 0.0f, lin));
    RS_RETURN_IF_ERROR(fill(w.qkv_bias, qkv_rows, 0.0f, lin));
    RS_RETURN_IF_ERROR(fill(w.q_norm, d, 1.0f, 0.1f));
    RS_RETURN_IF_ERROR(fill(w.k_norm, d, 1.0f, 0.1f));
    RS_RETURN_IF_ERROR(fill(w.o, h * c.num_heads * d, 0.0f, lin));
    RS_RETURN_IF_ERROR(fill(w.o_bias, h, 0.0f, lin));
    RS_RETURN_IF_ERROR(fill(w.post_norm, h, 1.0f, 0.1f));
    RS_RETURN_IF_ERROR(fill(w.gate_up, 2 * inter * h, 0.0f, lin));
    RS_RETURN_IF_ERROR(fill(w.down, h * inter, 0.0f, lin));
  }
  for (const auto& moe : moe_) {
    if (!moe) continue;
    if (cuda_.random_quant.empty()) {
      RS_RETURN_IF_ERROR(moe->Randomize(++stream_id, stream_));
      continue;
    }
    // random_quant: the routed experts held quantized too.
    RS_ASSIGN_OR_RETURN(const quant::PackedFormat format,
                        quant::ParsePackedFormat(cuda_.random_quant));
    RS_RETURN_IF_ERROR(moe->RandomizeQuantized(++stream_id, static_cast<QuantFormat>(format),
                                               cuda_.random_quant_group, stream_));
    quantized_expert_bytes_ += moe->quantized_expert_bytes();
  }
  for (const auto& mla : mla_) {
    if (mla) RS_RETURN_IF_ERROR(mla->Randomize(++stream_id, stream_));
  }
  RS_RETURN_IF_ERROR(fill(embedding_, int64_t{c.vocab_size} * h, 0.0f, 1.0f));
  RS_RETURN_IF_ERROR(fill(final_norm_, h, 1.0f, 0.1f));
  if (lm_head_ != embedding_)
    RS_RETURN_IF_ERROR(fill(lm_head_, int64_t{c.vocab_size} * h, 0.0f, lin));
  RS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return absl::OkStatus();
}

absl::Status CudaModelSlice::AllocateRuntime() {
  const ModelConfig& c = config_;
  const int64_t t = cuda_.max_batch_tokens;
  const int64_t h = c.hidden_size, d = c.head_dim, inter = c.intermediate_size;
  // MLA layers project into CudaMlaAttention's scratch: no q/k/v buffers here.
  const int64_t qkv_w = c.mla ? 8 : (c.num_heads + 2 * c.num_kv_heads) * d;
  const int64_t q_w = c.mla ? 8 : int64_t{c.num_heads} * d;
  const int64_t rows = cuda_.max_logit_rows;
  struct Item {
    DeviceBuffer* buf;
    int64_t bytes;
  };
  const Item items[] = {
      {&residual_, t * h * 4},
      {&normed_, t * h * 2},
      {&qkv_, t * qkv_w * 2},
      {&q_, t * q_w * 2},
      {&attn_, t * q_w * 2},
      {&proj_, t * h * 2},
      {&gate_up_, t * 2 * inter * 2},
      {&act_, t * inter * 2},
      {&gathered_, rows * h * 2},
      {&logits_, rows * int64_t{c.vocab_size} * 4},
      {&tokens_, std::max<int64_t>(rows, cuda_.max_graph_batch) * 4},
      {&sample_params_, SampleRowsCapacity() * int64_t{sizeof(GpuRowSampling)}},
      {&logprobs_, SampleRowsCapacity() * 4},
      {&decode_ws_, kDecodeWorkspaceBytes},
      {&decode_tickets_,
       DecodeSplitTickets(std::max<int>(t, cuda_.max_graph_batch), c.num_heads) * 4},
  };
  activation_bytes_ = 0;
  for (const Item& item : items) {
    RS_RETURN_IF_ERROR(item.buf->Allocate(item.bytes));
    RS_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(item.buf->get(), 0, item.bytes, stream_));
    activation_bytes_ += item.bytes;
  }
  if (std::any_of(moe_.begin(), moe_.end(), [](const auto& m) { return m != nullptr; }) ||
      (mtp_ && mtp_->moe())) {
    int64_t dequant_scratch = 0;  // for layers holding quantized experts
    for (const auto& moe : moe_) {
      if (moe) dequant_scratch = std::max(dequant_scratch, moe->dequant_scratch_bytes());
    }
    RS_ASSIGN_OR_RETURN(moe_ws_, CudaMoeWorkspace::Create(
                                     c.moe, c.hidden_size, std::max<int>(t, cuda_.max_graph_batch),
                                     options_.layers.size(), dequant_scratch, kernels_.moe_gemm));
    activation_bytes_ += moe_ws_->bytes();
  }
  if (mla_attention_) activation_bytes_ += mla_attention_->scratch_bytes();
  if (mtp_) {
    if (cuda_.mtp_store_rows <= 0) {
      return absl::InvalidArgumentError("CUDA slice options: mtp_store_rows must be positive");
    }
    mtp_meta_capacity_ = 6 * t + rows + int64_t{cuda_.max_seqs} * max_blocks_per_seq_ + 64;
    const Item mtp_items[] = {
        {&mtp_store_, int64_t{cuda_.mtp_store_rows} * h * 2},
        {&mtp_x_, t * h * 4},
        {&mtp_in_, t * 2 * h * 2},
        {&mtp_normed_, t * h * 2},
        {&mtp_meta_, mtp_meta_capacity_ * 4},
    };
    for (const Item& item : mtp_items) {
      RS_RETURN_IF_ERROR(item.buf->Allocate(item.bytes));
      RS_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(item.buf->get(), 0, item.bytes, stream_));
      activation_bytes_ += item.bytes;
    }
  }
  activations_ = std::make_unique<DeviceActivationBuffer>(residual_.as<float>(), t, c.hidden_size,
                                                          cuda_.device, stream_);
  const int64_t s = cuda_.max_seqs;
  const int64_t tok_cap = std::max<int64_t>(t, cuda_.max_graph_batch);
  // The regions BuildPlan lays out, and a token feed pair per chunk (PrepareFed).
  meta_capacity_ = 7 * tok_cap + 3 * s + 2 * (tok_cap / kPrefillTile + s) +
                   std::max(rows, tok_cap) + s * max_blocks_per_seq_ + 2 * s + 64;
  RS_RETURN_IF_ERROR(meta_.Allocate(meta_capacity_ * 4));
  RS_CUDA_RETURN_IF_ERROR(cudaMallocHost(&sample_host_, kMaxSamplesInFlight * SampleHostBytes()));
  for (int i = 0; i < kMaxSamplesInFlight; ++i) {
    SampleSlot& slot = sample_slots_[i];
    slot.params =
        reinterpret_cast<GpuRowSampling*>(static_cast<char*>(sample_host_) + i * SampleHostBytes());
    slot.tokens = reinterpret_cast<int32_t*>(slot.params + SampleRowsCapacity());
    slot.logprobs = reinterpret_cast<float*>(slot.tokens + SampleRowsCapacity());
    RS_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&slot.copied, cudaEventDisableTiming));
  }
  RS_CUDA_RETURN_IF_ERROR(
      cudaMallocHost(reinterpret_cast<void**>(&meta_host_), meta_capacity_ * 4));
  RS_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&meta_uploaded_, cudaEventDisableTiming));
  activation_bytes_ += meta_capacity_ * 4;

  // KV pool.
  // Per layer and block: K and V, block_elems each; with MLA the latent rows
  // (kv_values_per_token_layer() per token, even) fill both halves as one region.
  const int64_t block_elems = c.mla ? options_.kv_block_size * c.kv_values_per_token_layer() / 2
                                    : int64_t{c.num_kv_heads} * options_.kv_block_size * d;
  const int64_t element_bytes = KvCacheElementBytes(options_.kv_cache_dtype, sizeof(bf16));
  const int64_t block_bytes = block_elems * 2 * element_bytes * KvLayers();
  if (cuda_.kv_from_free_memory) {
    size_t free = 0, total = 0;
    RS_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free, &total));
    const int64_t used = static_cast<int64_t>(total - free);
    const int64_t own = WeightBytes() + quant_.scratch_bytes() + activation_bytes_;
    const int64_t allowed = cuda_.device_share > 0
                                ? static_cast<int64_t>(cuda_.device_share * total) - own
                                : static_cast<int64_t>(cuda_.memory_utilization * total) - used;
    const int64_t budget = std::min(allowed, static_cast<int64_t>(free)) - kKvReserveBytes;
    const int64_t blocks = budget / block_bytes;
    if (blocks < 1) {
      return absl::ResourceExhaustedError(fmt::format(
          "no device memory left for the KV cache: {} MiB free of {} MiB, utilization {}, "
          "share {}",
          free >> 20, total >> 20, cuda_.memory_utilization, cuda_.device_share));
    }
    // Cache slots (block * block_size + offset) are int32.
    options_.kv_num_blocks = static_cast<int>(
        std::min<int64_t>(blocks, (int64_t{1} << 31) / options_.kv_block_size - 1));
  }
  kv_layer_elems_ = block_elems * options_.kv_num_blocks;
  RS_RETURN_IF_ERROR(kv_buffer_.Allocate(kv_layer_elems_ * 2 * element_bytes * KvLayers()));
  // Zeroed as the CPU slice's pool is (a block not written yet holds zeros, not NaN codes).
  RS_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(kv_buffer_.get(), 0, kv_buffer_.bytes(), stream_));
  kv_k_scales_.resize(options_.layers.size(), 1.0f);
  kv_v_scales_.resize(options_.layers.size(), 1.0f);
  RS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  const CudaMemoryReport m = memory();
  RS_LOG_INFO("CUDA slice [{}, {}): KV bytes per token and layer {}{}", options_.layers.first,
              options_.layers.last, c.kv_values_per_token_layer() * 2,
              c.mla ? " (MLA: compressed latent + rope key, bf16)" : "");
  RS_LOG_INFO(
      "CUDA slice [{}, {}): weights {} MiB, KV {} {} MiB ({} blocks of {}, {} bytes per token), "
      "activations {} MiB, device free {} / {} MiB{}{}{}",
      options_.layers.first, options_.layers.last, m.weight_bytes >> 20,
      KvCacheDtypeName(options_.kv_cache_dtype), m.kv_bytes >> 20, m.kv_num_blocks,
      options_.kv_block_size, block_bytes / options_.kv_block_size, m.activation_bytes >> 20,
      m.device_free_bytes >> 20, m.device_total_bytes >> 20,
      m.dequantized_expert_bytes > 0
          ? fmt::format(" (weights include {} MiB of bf16 experts dequantized from the "
                        "quantized checkpoint)",
                        m.dequantized_expert_bytes >> 20)
          : std::string(),
      m.quantized_expert_bytes > 0
          ? fmt::format(" (weights include {} MiB of routed experts held quantized)",
                        m.quantized_expert_bytes >> 20)
          : std::string(),
      mtp_ ? fmt::format("; MTP layer {}: weights {} MiB, one more latent KV layer, {} stored "
                         "hidden rows",
                         mtp_->layer(), mtp_->weight_bytes() >> 20, cuda_.mtp_store_rows)
           : std::string());
  return absl::OkStatus();
}

CudaMemoryReport CudaModelSlice::memory() const {
  CudaMemoryReport r;
  r.weight_bytes = WeightBytes();
  r.quant_weight_bytes = quant_.bytes();
  r.dequantized_expert_bytes = dequantized_expert_bytes_;
  r.quantized_expert_bytes = quantized_expert_bytes_;
  r.kv_bytes = static_cast<int64_t>(kv_buffer_.bytes());
  r.activation_bytes = activation_bytes_ + quant_.scratch_bytes();
  size_t free = 0, total = 0;
  if (cudaMemGetInfo(&free, &total) == cudaSuccess) {
    r.device_free_bytes = static_cast<int64_t>(free);
    r.device_total_bytes = static_cast<int64_t>(total);
  }
  r.kv_num_blocks = options_.kv_num_blocks;
  return r;
}

}  // namespace ringserve::cuda
