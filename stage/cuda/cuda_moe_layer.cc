#include "stage/cuda/cuda_moe_layer.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <vector>

#include "common/logging.h"
#include "common/status_macros.h"
#include "fmt/format.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/moe.h"
#include "stage/cuda/cuda_quant_linear.h"
#include "stage/model/packed_weights.h"
#include "stage/model/quantized_weights.h"

namespace ringserve::cuda {
namespace {

constexpr int64_t kAlign = 256;

int64_t AlignUp(int64_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

// Two passes over a layout: sizes with a null base, then pointers into one allocation.
class Carver {
 public:
  explicit Carver(char* base) : base_(base) {}
  template <typename T>
  T* Take(int64_t elems) {
    T* p = base_ ? reinterpret_cast<T*>(base_ + offset_) : nullptr;
    offset_ += AlignUp(elems * static_cast<int64_t>(sizeof(T)));
    return p;
  }
  int64_t bytes() const { return offset_; }

 private:
  char* base_;
  int64_t offset_ = 0;
};

MoeActivationParams ActivationOf(const MoeConfig& moe) {
  return {.kind = moe.activation == ExpertActivation::kClampedSwiglu ? MoeActivation::kClampedSwiglu
                                                                     : MoeActivation::kSiluMul,
          .alpha = moe.swiglu_alpha,
          .limit = moe.swiglu_limit};
}

absl::Status CopyFloats(SafetensorsModel& weights, const TensorSpec& spec, float* dst,
                        cudaStream_t stream) {
  RS_ASSIGN_OR_RETURN(std::vector<float> values, weights.ReadFloat(spec.name, spec.shape));
  RS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, values.data(), values.size() * sizeof(float),
                                          cudaMemcpyHostToDevice, stream));
  // `values` dies here: the copy must have read it.
  RS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<CudaMoeWorkspace>> CudaMoeWorkspace::Create(
    const MoeConfig& moe, int hidden, int max_tokens, int num_layers, int64_t dequant_scratch_bytes,
    MoeGemmKernel gemm_kernel) {
  if (!moe.enabled() || hidden <= 0 || max_tokens <= 0 || num_layers < 0 ||
      dequant_scratch_bytes < 0) {
    return absl::InvalidArgumentError("CudaMoeWorkspace: needs a MoE config and positive sizes");
  }
  std::unique_ptr<CudaMoeWorkspace> ws(new CudaMoeWorkspace());
  const int64_t t = max_tokens, k = moe.router.top_k, e = moe.router.num_experts;
  const int64_t rows = t * k;
  const int64_t width = std::max(moe.expert_intermediate_size, moe.shared_intermediate_size);
  ws->max_tokens_ = max_tokens;
  ws->num_layers_ = num_layers;
  ws->gemm_kernel_ = gemm_kernel;
  ws->max_tiles_ = static_cast<int>(MoeMaxTiles(rows, static_cast<int>(e)));
  auto carve = [&](char* base) {
    Carver c(base);
    ws->logits_ = c.Take<float>(t * e);
    ws->ids_ = c.Take<int32_t>(rows);
    ws->weights_ = c.Take<float>(rows);
    ws->counts_ = c.Take<int32_t>(e);
    ws->offsets_ = c.Take<int32_t>(e + 1);
    ws->row_token_ = c.Take<int32_t>(rows);
    ws->entry_row_ = c.Take<int32_t>(rows);
    ws->tiles_ = c.Take<int32_t>(2 * int64_t{ws->max_tiles_});
    ws->active_ = c.Take<int32_t>(e);
    ws->num_tiles_ = c.Take<int32_t>(1);
    ws->route_ticket_ = c.Take<int32_t>(1);
    ws->touched_ = c.Take<int32_t>(std::max(1, num_layers));
    ws->gate_up_ = c.Take<bf16>(rows * 2 * width);
    ws->act_ = c.Take<bf16>(rows * width);
    ws->expert_out_ = c.Take<bf16>(rows * hidden);
    ws->shared_out_ = moe.shared_intermediate_size > 0 ? c.Take<bf16>(t * hidden) : nullptr;
    ws->dequant_ = dequant_scratch_bytes > 0 ? c.Take<bf16>(dequant_scratch_bytes / 2) : nullptr;
    ws->dequant_bytes_ = dequant_scratch_bytes;
    return c.bytes();
  };
  RS_RETURN_IF_ERROR(ws->buffer_.Allocate(carve(nullptr)));
  carve(ws->buffer_.as<char>());
  RS_CUDA_RETURN_IF_ERROR(cudaMemset(ws->buffer_.get(), 0, ws->buffer_.bytes()));
  return ws;
}

absl::StatusOr<std::unique_ptr<CudaMoeLayer>> CudaMoeLayer::Create(const ModelConfig& config) {
  const MoeConfig& m = config.moe;
  const int h = config.hidden_size;
  if (!m.enabled()) return absl::InvalidArgumentError("CudaMoeLayer: the model has no experts");
  if (h % 8 != 0 || m.router.num_experts > kMoeMaxExperts || m.router.top_k > 32 ||
      m.router.n_group > 32) {
    return absl::InvalidArgumentError(fmt::format(
        "CUDA MoE layers need hidden_size % 8 == 0, num_experts <= {}, top_k <= 32 and n_group "
        "<= 32 (got {}, {}, {}, {})",
        kMoeMaxExperts, h, m.router.num_experts, m.router.top_k, m.router.n_group));
  }
  RS_RETURN_IF_ERROR(ValidateRouterOptions(m.router));
  RS_RETURN_IF_ERROR(PrepareMoeKernels());
  std::unique_ptr<CudaMoeLayer> layer(new CudaMoeLayer());
  // Debug switch (README): the largest step that runs the grouped GEMV.
  if (const char* env = std::getenv("RINGSERVE_MOE_GEMV_MAX_TOKENS"); env != nullptr) {
    layer->gemv_max_tokens_ = std::atoi(env);
  }
  layer->mma_min_tokens_ = DefaultMmaMinTokens(m.router);
  if (const char* env = std::getenv("RINGSERVE_MOE_MMA_MIN_TOKENS"); env != nullptr) {
    layer->mma_min_tokens_ = std::atoi(env);
  }
  layer->moe_ = m;
  layer->hidden_ = h;
  const int64_t e = m.router.num_experts, inter = m.expert_intermediate_size,
                shared = m.shared_intermediate_size;
  const bool biases = m.layout == ExpertLayout::kGptOssStacked;
  CudaMoeLayer* l = layer.get();
  auto carve = [&](char* base) {
    Carver c(base);
    l->router_ = c.Take<float>(e * h);
    l->router_bias_ = m.router_bias ? c.Take<float>(e) : nullptr;
    l->router_bf16_ = c.Take<bf16>(e * h);
    l->router_bias_bf16_ = m.router_bias ? c.Take<bf16>(e) : nullptr;
    l->correction_bias_ = m.correction_bias ? c.Take<float>(e) : nullptr;
    l->gate_up_bias_ = biases ? c.Take<bf16>(e * 2 * inter) : nullptr;
    l->down_bias_ = biases ? c.Take<bf16>(e * h) : nullptr;
    l->shared_gate_up_ = shared > 0 ? c.Take<bf16>(2 * shared * h) : nullptr;
    l->shared_down_ = shared > 0 ? c.Take<bf16>(h * shared) : nullptr;
    l->shared_expert_gate_ = m.shared_expert_gate ? c.Take<float>(h) : nullptr;
    return c.bytes();
  };
  RS_RETURN_IF_ERROR(layer->buffer_.Allocate(carve(nullptr)));
  carve(layer->buffer_.as<char>());
  return layer;
}

absl::Status CudaMoeLayer::AllocateBf16Experts() {
  const int64_t e = moe_.router.num_experts, inter = moe_.expert_intermediate_size, h = hidden_;
  quant_gate_up_ = quant_down_ = QuantMatrixView{};
  const int64_t gate_up_bytes = AlignUp(e * 2 * inter * h * int64_t{sizeof(bf16)});
  RS_RETURN_IF_ERROR(experts_.Allocate(gate_up_bytes + e * h * inter * int64_t{sizeof(bf16)}));
  gate_up_ = experts_.as<bf16>();
  down_ = reinterpret_cast<bf16*>(experts_.as<char>() + gate_up_bytes);
  return absl::OkStatus();
}

absl::Status CudaMoeLayer::Load(const ModelConfig& config, int layer, SafetensorsModel& weights,
                                const UploadFn& upload, cudaStream_t stream,
                                const quant::QuantConfig* quant) {
  const MoeTensorSpecs specs = MoeLayerTensorSpecs(config, layer);
  const int64_t e = moe_.router.num_experts, inter = moe_.expert_intermediate_size, h = hidden_,
                shared = moe_.shared_intermediate_size;
  RS_RETURN_IF_ERROR(CopyFloats(weights, specs.router, router_, stream));
  if (specs.router_bias) {
    RS_RETURN_IF_ERROR(CopyFloats(weights, *specs.router_bias, router_bias_, stream));
  }
  if (specs.correction_bias) {
    RS_RETURN_IF_ERROR(CopyFloats(weights, *specs.correction_bias, correction_bias_, stream));
  }
  std::string why_bf16 = "not a quantized checkpoint";
  const char* force_bf16 = std::getenv("RINGSERVE_DEQUANTIZE_EXPERTS");
  if (quant == nullptr || quant->method == quant::QuantMethod::kNone) {
  } else if (force_bf16 != nullptr && std::string(force_bf16) == "1") {
    why_bf16 = "RINGSERVE_DEQUANTIZE_EXPERTS=1";
  } else if (moe_.layout == ExpertLayout::kGptOssStacked) {
    RS_ASSIGN_OR_RETURN(why_bf16, LoadQuantizedStackedExperts(config, layer, weights, *quant));
  } else {
    RS_ASSIGN_OR_RETURN(why_bf16, LoadQuantizedExperts(config, layer, weights, *quant));
  }
  if (!why_bf16.empty()) {
    if (quant != nullptr && quant->method != quant::QuantMethod::kNone) {
      RS_LOG_INFO("layer {}: routed experts dequantized to bf16 at load ({})", layer, why_bf16);
    }
    RS_RETURN_IF_ERROR(AllocateBf16Experts());
  }
  if (moe_.layout == ExpertLayout::kGptOssStacked) {
    RS_RETURN_IF_ERROR(UploadStackedExperts(specs, upload, !why_bf16.empty(), stream));
  } else if (!why_bf16.empty()) {
    for (int64_t x = 0; x < e; ++x) {
      bf16* gu = gate_up_ + x * 2 * inter * h;
      RS_RETURN_IF_ERROR(upload(specs.gate[x], gu));
      RS_RETURN_IF_ERROR(upload(specs.up[x], gu + inter * h));
      RS_RETURN_IF_ERROR(upload(specs.down[x], down_ + x * h * inter));
    }
  }
  if (specs.shared_gate) {
    RS_RETURN_IF_ERROR(upload(*specs.shared_gate, shared_gate_up_));
    RS_RETURN_IF_ERROR(upload(*specs.shared_up, shared_gate_up_ + shared * h));
    RS_RETURN_IF_ERROR(upload(*specs.shared_down, shared_down_));
  }
  if (specs.shared_expert_gate) {
    RS_RETURN_IF_ERROR(CopyFloats(weights, *specs.shared_expert_gate, shared_expert_gate_, stream));
  }
  return MirrorRouter(stream);
}

absl::Status CudaMoeLayer::UploadStackedExperts(const MoeTensorSpecs& specs, const UploadFn& upload,
                                                bool weights, cudaStream_t stream) {
  const int64_t e = moe_.router.num_experts, inter = moe_.expert_intermediate_size, h = hidden_;
  // Input-major, interleaved tensors: uploaded whole, then rearranged on the GPU.
  DeviceBuffer staging;
  RS_RETURN_IF_ERROR(staging.Allocate(e * 2 * inter * (weights ? h : 1) * sizeof(bf16)));
  bf16* tmp = staging.as<bf16>();
  if (weights) {
    RS_RETURN_IF_ERROR(upload(*specs.gate_up, tmp));
    RS_RETURN_IF_ERROR(LaunchMoeUnstackGateUp(tmp, gate_up_, e, h, inter, stream));
    RS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  }
  RS_RETURN_IF_ERROR(upload(*specs.gate_up_bias, tmp));
  RS_RETURN_IF_ERROR(LaunchMoeUnstackGateUpBias(tmp, gate_up_bias_, e, inter, stream));
  RS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  if (weights) {
    RS_RETURN_IF_ERROR(upload(*specs.stacked_down, tmp));
    RS_RETURN_IF_ERROR(LaunchMoeTransposeDown(tmp, down_, e, inter, h, stream));
  }
  RS_RETURN_IF_ERROR(upload(*specs.down_bias, down_bias_));
  RS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return absl::OkStatus();
}

absl::Status CudaMoeLayer::MirrorRouter(cudaStream_t stream) {
  const int64_t e = moe_.router.num_experts;
  RS_RETURN_IF_ERROR(LaunchF32ToBF16(router_, router_bf16_, e * hidden_, stream));
  if (router_bias_ != nullptr) {
    RS_RETURN_IF_ERROR(LaunchF32ToBF16(router_bias_, router_bias_bf16_, e, stream));
  }
  RS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return absl::OkStatus();
}

absl::Status CudaMoeLayer::Randomize(uint64_t seed, cudaStream_t stream) {
  const int64_t e = moe_.router.num_experts, inter = moe_.expert_intermediate_size, h = hidden_,
                shared = moe_.shared_intermediate_size;
  const float lin = 0.02f * std::sqrt(3.0f);
  uint64_t id = seed * 7919u + 17;
  if (!experts_quantized()) RS_RETURN_IF_ERROR(AllocateBf16Experts());
  auto fill = [&](bf16* p, int64_t n) {
    return p ? LaunchFillRandom(p, n, ++id, 0.0f, lin, stream) : absl::OkStatus();
  };
  RS_RETURN_IF_ERROR(fill(gate_up_, e * 2 * inter * h));
  RS_RETURN_IF_ERROR(fill(gate_up_bias_, e * 2 * inter));
  RS_RETURN_IF_ERROR(fill(down_, e * h * inter));
  RS_RETURN_IF_ERROR(fill(down_bias_, e * h));
  RS_RETURN_IF_ERROR(fill(shared_gate_up_, 2 * shared * h));
  RS_RETURN_IF_ERROR(fill(shared_down_, h * shared));
  // The fp32 tensors: bf16 random values widened.
  DeviceBuffer staging;
  RS_RETURN_IF_ERROR(staging.Allocate(e * h * sizeof(bf16)));
  auto fill_f32 = [&](float* p, int64_t n) -> absl::Status {
    if (p == nullptr) return absl::OkStatus();
    RS_RETURN_IF_ERROR(LaunchFillRandom(staging.as<bf16>(), n, ++id, 0.0f, lin, stream));
    return LaunchBF16ToF32(staging.as<bf16>(), p, n, stream);
  };
  RS_RETURN_IF_ERROR(fill_f32(router_, e * h));
  RS_RETURN_IF_ERROR(fill_f32(router_bias_, e));
  RS_RETURN_IF_ERROR(fill_f32(correction_bias_, e));
  RS_RETURN_IF_ERROR(fill_f32(shared_expert_gate_, h));
  return MirrorRouter(stream);
}

int CudaMoeLayer::DequantRangeExperts() const {
  const int64_t per_expert =
      int64_t{2} * moe_.expert_intermediate_size * hidden_ * int64_t{sizeof(bf16)};
  return static_cast<int>(std::clamp<int64_t>(
      kDequantScratchBytes / std::max<int64_t>(per_expert, 1), 1, moe_.router.num_experts));
}

int64_t CudaMoeLayer::dequant_scratch_bytes() const {
  if (!experts_quantized()) return 0;
  // The larger of a range's gate/up ([2 inter, hidden] each) and down ([hidden, inter]) matrices.
  return int64_t{DequantRangeExperts()} * 2 * moe_.expert_intermediate_size * hidden_ *
         int64_t{sizeof(bf16)};
}

absl::Status CudaMoeLayer::RunDequantizedGemm(MoeGroupedLinear a, const QuantMatrixView& q,
                                              CudaMoeWorkspace& ws, LaunchStream stream) const {
  const int range = DequantRangeExperts();
  if (ws.dequant_ == nullptr ||
      ws.dequant_bytes_ < int64_t{range} * a.n * a.k * int64_t{sizeof(bf16)}) {
    return absl::FailedPreconditionError(
        "CudaMoeLayer: the workspace has no dequantization scratch for quantized experts");
  }
  for (int e0 = 0; e0 < a.groups; e0 += range) {
    const int e1 = std::min(a.groups, e0 + range);
    RS_RETURN_IF_ERROR(LaunchQuantDequantize(QuantRowSlice(q, int64_t{e0} * a.n, (e1 - e0) * a.n),
                                             ws.dequant_, stream));
    a.w = ws.dequant_;
    a.group_begin = e0;
    a.group_end = e1;
    RS_RETURN_IF_ERROR(LaunchMoeGroupedGemm(a, ws.tiles_, ws.num_tiles_, ws.max_tiles_, stream));
  }
  return absl::OkStatus();
}

int CudaMoeLayer::DefaultMmaMinTokens(const RouterOptions& router) {
  const int top_k = std::max(1, router.top_k);
  return std::max(5, (4 * router.num_experts + top_k - 1) / top_k);
}

absl::Status CudaMoeLayer::RunExperts(const bf16* x, const int32_t* row_token,
                                      const int32_t* offsets, int rows, int groups, int tokens,
                                      const ExpertWeights& w, bool grouped_gemv, bf16* out,
                                      CudaMoeWorkspace& ws, LaunchStream stream) const {
  const int inter = w.inter;
  const MoeActivationParams act = ActivationOf(moe_);
  const int32_t* tiles = offsets != nullptr ? ws.tiles_ : nullptr;
  const int32_t* num_tiles = offsets != nullptr ? ws.num_tiles_ : nullptr;
  // Grouped GEMV blocks go to the experts with rows only (at most `rows` of them).
  const int32_t* active = offsets != nullptr ? ws.active_ : nullptr;
  // The grouped GEMV of bf16 weights, on tensor cores for steps of several rows per group.
  const auto gemv = [&](const MoeGroupedLinear& a) {
    return tokens >= mma_min_tokens_ && MoeGroupedMmaSupported(a) ? LaunchMoeGroupedMma(a, stream)
                                                                  : LaunchMoeGroupedGemv(a, stream);
  };
  MoeGroupedLinear up{.x = x,
                      .row_token = row_token,
                      .offsets = offsets,
                      .rows = rows,
                      .groups = groups,
                      .active = active,
                      .max_active = rows,
                      .w = w.gate_up,
                      .bias = w.gate_up_bias,
                      .n = inter,
                      .k = hidden_,
                      .out = ws.act_,
                      .out_f32 = false,
                      .act = act,
                      .max_group_rows = tokens,
                      .gemm_kernel = ws.gemm_kernel_};
  if (grouped_gemv) {
    RS_RETURN_IF_ERROR(w.quant_gate_up != nullptr
                           ? LaunchMoeQuantGroupedGemv(up, *w.quant_gate_up, stream)
                           : gemv(up));
  } else {
    up.n = 2 * inter;
    up.out = ws.gate_up_;
    up.act = {};
    RS_RETURN_IF_ERROR(w.quant_gate_up != nullptr
                           ? RunDequantizedGemm(up, *w.quant_gate_up, ws, stream)
                           : LaunchMoeGroupedGemm(up, tiles, num_tiles, ws.max_tiles_, stream));
    RS_RETURN_IF_ERROR(LaunchMoeActivation(ws.gate_up_, ws.act_, rows, inter, act, stream));
  }
  if (out == nullptr) return absl::OkStatus();
  // The activations are in permuted-row order: the down projection reads them in place.
  const MoeGroupedLinear down{.x = ws.act_,
                              .row_token = nullptr,
                              .offsets = offsets,
                              .rows = rows,
                              .groups = groups,
                              .active = active,
                              .max_active = rows,
                              .w = w.down,
                              .bias = w.down_bias,
                              .n = hidden_,
                              .k = inter,
                              .out = out,
                              .out_f32 = false,
                              .act = {},
                              .max_group_rows = tokens,
                              .gemm_kernel = ws.gemm_kernel_};
  if (w.quant_down != nullptr) {
    return grouped_gemv ? LaunchMoeQuantGroupedGemv(down, *w.quant_down, stream)
                        : RunDequantizedGemm(down, *w.quant_down, ws, stream);
  }
  if (grouped_gemv || inter % 8 != 0) return gemv(down);
  return LaunchMoeGroupedGemm(down, tiles, num_tiles, ws.max_tiles_, stream);
}

absl::Status CudaMoeLayer::Forward(const bf16* x, int tokens, float* residual, bf16* out,
                                   CudaMoeWorkspace& ws, int stats_slot,
                                   LaunchStream stream) const {
  if (tokens < 0 || tokens > ws.max_tokens_ || (residual == nullptr) == (out == nullptr) ||
      stats_slot >= ws.num_layers_) {
    return absl::InvalidArgumentError(
        fmt::format("CudaMoeLayer::Forward: {} tokens (max {}), one output, stats slot {} of {}",
                    tokens, ws.max_tokens_, stats_slot, ws.num_layers_));
  }
  if (tokens == 0) return absl::OkStatus();
  const int e = moe_.router.num_experts, k = moe_.router.top_k;
  const MoeRouting routing{.logits = ws.logits_,
                           .correction_bias = correction_bias_,
                           .expert_ids = ws.ids_,
                           .weights = ws.weights_,
                           .counts = ws.counts_,
                           .offsets = ws.offsets_,
                           .row_token = ws.row_token_,
                           .entry_row = ws.entry_row_,
                           .tiles = ws.tiles_,
                           .num_tiles = ws.num_tiles_,
                           .active = ws.active_,
                           .experts_touched = stats_slot >= 0 ? ws.touched_ + stats_slot : nullptr,
                           .tokens = tokens};
  if (tokens <= kMoeFusedRouteTokens) {
    RS_RETURN_IF_ERROR(LaunchMoeRouterLogitsAndRoute(x, router_, router_bias_, hidden_, moe_.router,
                                                     routing, ws.route_ticket_, stream));
  } else if (tokens <= kMoeSmallRouteTokens) {
    RS_RETURN_IF_ERROR(
        LaunchMoeRouterLogits(x, router_, router_bias_, ws.logits_, tokens, e, hidden_, stream));
    RS_RETURN_IF_ERROR(LaunchMoeRoute(moe_.router, routing, stream));
  } else {
    RS_RETURN_IF_ERROR(LaunchMoeGroupedGemm({.x = x,
                                             .row_token = nullptr,
                                             .offsets = nullptr,
                                             .rows = tokens,
                                             .groups = 1,
                                             .active = nullptr,
                                             .max_active = 0,
                                             .w = router_bf16_,
                                             .bias = router_bias_bf16_,
                                             .n = e,
                                             .k = hidden_,
                                             .out = ws.logits_,
                                             .out_f32 = true,
                                             .act = {},
                                             .gemm_kernel = ws.gemm_kernel_},
                                            nullptr, nullptr, 0, stream));
    RS_RETURN_IF_ERROR(LaunchMoeRoute(moe_.router, routing, stream));
  }
  const int rows = tokens * k;
  // Decode-sized steps (a few rows per expert) stream only the chosen experts' weights; larger
  // ones run the tensor-core GEMM (which re-reads no weight per row).
  const bool gemv = tokens <= gemv_max_tokens_ && rows <= 4 * e;
  const bool quantized = experts_quantized();
  const ExpertWeights routed{.gate_up = gate_up_,
                             .gate_up_bias = gate_up_bias_,
                             .down = down_,
                             .down_bias = down_bias_,
                             .quant_gate_up = quantized ? &quant_gate_up_ : nullptr,
                             .quant_down = quantized ? &quant_down_ : nullptr,
                             .inter = moe_.expert_intermediate_size};
  // Steps of a few tokens: the down projection and the combine in one kernel, after the shared
  // experts (whose output it adds).
  const bool down_combine = gemv && tokens <= kMoeDownCombineTokens &&
                            shared_expert_gate_ == nullptr && routed.inter % 8 == 0;
  if (shared_gate_up_ != nullptr) {
    const ExpertWeights shared{
        .gate_up = shared_gate_up_, .down = shared_down_, .inter = moe_.shared_intermediate_size};
    RS_RETURN_IF_ERROR(RunExperts(x, nullptr, nullptr, tokens, 1, tokens, shared, tokens <= 16,
                                  ws.shared_out_, ws, stream));
  }
  RS_RETURN_IF_ERROR(RunExperts(x, ws.row_token_, ws.offsets_, rows, e, tokens, routed, gemv,
                                down_combine ? nullptr : ws.expert_out_, ws, stream));
  if (down_combine) {
    return LaunchMoeDownCombine(
        {.act = ws.act_,
         .expert_ids = ws.ids_,
         .weights = ws.weights_,
         .entry_row = ws.entry_row_,
         .w = down_,
         .quant = routed.quant_down,
         .bias = down_bias_,
         .n = hidden_,
         .k = routed.inter,
         .shared_out = shared_gate_up_ != nullptr ? ws.shared_out_ : nullptr,
         .residual = residual,
         .out = out,
         .tokens = tokens,
         .top_k = k},
        stream);
  }
  return LaunchMoeCombine({.weights = ws.weights_,
                           .entry_row = ws.entry_row_,
                           .expert_out = ws.expert_out_,
                           .shared_out = shared_gate_up_ != nullptr ? ws.shared_out_ : nullptr,
                           .shared_gate = shared_expert_gate_,
                           .x = x,
                           .residual = residual,
                           .out = out,
                           .tokens = tokens,
                           .top_k = k,
                           .hidden = hidden_},
                          stream);
}

}  // namespace ringserve::cuda
