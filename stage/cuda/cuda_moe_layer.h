// One mixture-of-experts MLP block on the GPU (the CUDA slice's MoE layers; DeepSeek's MoE
// layers reuse it): the router, the routed experts stacked on the device, and the shared
// experts. Input: the block's normalized hidden rows on the device; output: added into the fp32
// residual stream (or written as bf16 rows). Every rule of ring/moe_config.h's MoeConfig runs
// (scoring, norm_topk_prob, correction bias and groups, routed scaling, router bias, SiLU or
// clamped SwiGLU with biases, plain or sigmoid-gated shared experts), with the CPU reference's
// values (stage/model/cpu_moe.h) up to bf16 rounding: the router runs in fp32 on fp32 weights
// for steps of up to kMoeSmallRouteTokens tokens (decode), on bf16 copies (tensor cores, fp32
// accumulation) for larger ones (prefill), as a bf16 model's gate does.
//
// Device layout: routed experts [E, 2 inter, hidden] (gate rows, then up rows) and
// [E, hidden, inter]; shared experts [2 shared, hidden] and [hidden, shared]; router [E, hidden]
// fp32. Steps of up to kDefaultGemvMaxTokens tokens with at most 4 rows per expert on average run
// the grouped GEMV (only the chosen experts' weights are read); larger steps the grouped
// tensor-core GEMM (kernels/cuda/moe.h). Decode steps run fewer kernels: up to
// kMoeFusedRouteTokens tokens, router logits and routing in one (LaunchMoeRouterLogitsAndRoute);
// up to kMoeDownCombineTokens, the routed down projection and the combine in one
// (LaunchMoeDownCombine; not with Qwen2-MoE's sigmoid-gated shared expert), the same values bit
// for bit. Forward never synchronizes with the host, so it can be captured into a CUDA graph.
//
// Quantized checkpoints: routed experts whose every matrix packs exactly into the kernels' layout
// (stage/model/packed_weights.h: fp8 blocks, compressed-tensors int4/int8/fp8, GPTQ, AWQ; the
// hub's one-tensor-per-expert layouts) are held quantized, stacked by rows as
// [E * 2 inter, hidden] and [E * hidden, inter] (kernels/cuda/quant_gemv.h's layout). Decode-sized
// steps run the quantized grouped GEMV (codes decoded in registers, only the chosen experts'
// codes read); larger steps dequantize the experts into the workspace's bf16 scratch a range of
// experts at a time (at most kDequantScratchBytes) and run the grouped GEMM on each range.
// gpt-oss's stacked MXFP4 experts are held as fp4 with their e8m0 block scales (as fp32 per row
// and 32 columns), gate and up rows deinterleaved. Anything else (sizes off the kernels' chunk,
// mixed formats, values a format cannot hold exactly) is dequantized to bf16 at load, logged
// with the reason; RINGSERVE_DEQUANTIZE_EXPERTS=1 forces
// that (a debug switch for A/B runs). Shared experts are always bf16.
//
// Not thread-safe; the layer owns its weights, the workspace (shared by a slice's MoE layers,
// which run one at a time) its buffers. Memory: weight_bytes() / CudaMoeWorkspace::bytes().
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <memory>

#include "absl/status/statusor.h"
#include "kernels/cuda/cuda_utils.h"
#include "kernels/cuda/moe.h"
#include "kernels/cuda/quant_gemv.h"
#include "ring/model_config.h"
#include "stage/model/quant/packed_matrix.h"
#include "stage/model/quant/quant_config.h"
#include "stage/model/safetensors.h"
#include "stage/model/slice_weights.h"

namespace ringserve::cuda {

// Step buffers of the MoE layers of one slice, sized for max_tokens tokens: rows of
// max_tokens * top_k for the routed experts. Not thread-safe.
class CudaMoeWorkspace {
 public:
  // InvalidArgument unless moe.enabled(); ResourceExhausted when the device is full.
  // `num_layers`: MoE layers that record their touched-expert counts (experts_touched()).
  // `dequant_scratch_bytes`: the largest CudaMoeLayer::dequant_scratch_bytes() of the layers.
  // `gemm_kernel`: the KernelPlan's grouped GEMM (prefill-sized steps of every layer).
  static absl::StatusOr<std::unique_ptr<CudaMoeWorkspace>> Create(
      const MoeConfig& moe, int hidden, int max_tokens, int num_layers,
      int64_t dequant_scratch_bytes = 0, MoeGemmKernel gemm_kernel = MoeGemmKernel::kWmma);
  int64_t bytes() const { return static_cast<int64_t>(buffer_.bytes()); }
  int max_tokens() const { return max_tokens_; }
  // [num_layers] int32, device: the number of distinct experts the last step's tokens chose in
  // each recording layer (Forward's `stats_slot`); for benchmarks (bytes read by decode).
  const int32_t* experts_touched() const { return touched_; }
  int num_layers() const { return num_layers_; }

 private:
  friend class CudaMoeLayer;
  CudaMoeWorkspace() = default;

  DeviceBuffer buffer_;
  int max_tokens_ = 0;
  int num_layers_ = 0;
  int max_tiles_ = 0;
  MoeGemmKernel gemm_kernel_ = MoeGemmKernel::kWmma;
  float* logits_ = nullptr;          // [T, E]
  int32_t* ids_ = nullptr;           // [T, k]
  float* weights_ = nullptr;         // [T, k]
  int32_t* counts_ = nullptr;        // [E]
  int32_t* offsets_ = nullptr;       // [E + 1]
  int32_t* row_token_ = nullptr;     // [T k]
  int32_t* entry_row_ = nullptr;     // [T k]
  int32_t* tiles_ = nullptr;         // [max_tiles, 2]
  int32_t* active_ = nullptr;        // [E]
  int32_t* num_tiles_ = nullptr;     // [1]
  int32_t* route_ticket_ = nullptr;  // [1], 0 between launches (LaunchMoeRouterLogitsAndRoute)
  int32_t* touched_ = nullptr;       // [num_layers]
  bf16* gate_up_ = nullptr;          // [T k, 2 max(inter, shared)]
  bf16* act_ = nullptr;              // [T k, max(inter, shared)]
  bf16* expert_out_ = nullptr;       // [T k, hidden]
  bf16* shared_out_ = nullptr;       // [T, hidden] (with shared experts)
  bf16* dequant_ = nullptr;          // quantized experts of one range, bf16 (larger steps)
  int64_t dequant_bytes_ = 0;
};

class CudaMoeLayer {
 public:
  // Steps of up to this many tokens (and at most 4 rows per expert on average) run the grouped
  // GEMV; RINGSERVE_MOE_GEMV_MAX_TOKENS overrides it (a debug switch for A/B runs).
  static constexpr int kDefaultGemvMaxTokens = 64;
  // Grouped-GEMV steps of at least this many tokens run it on tensor cores (LaunchMoeGroupedMma;
  // bf16 experts) when the shapes allow: steps of 4 or more rows per expert on average (tokens x
  // top_k >= 4 x experts), and never fewer than 5 tokens (the fused down+combine's steps, whose
  // down projection must stay the CUDA-core GEMV's bit for bit). Measured on an H100 at the
  // Qwen3-30B-A3B shape (bench/cuda/NOTES.md): 64 streams (4.1 rows an expert) 61.6% -> 64.2% of
  // the bound, 32 streams (2.3 rows) 76.4% -> 64.6%. RINGSERVE_MOE_MMA_MIN_TOKENS overrides it.
  static int DefaultMmaMinTokens(const RouterOptions& router);

  // Uploads checkpoint tensor `spec` ([out, in] as the checkpoint stores it) to dst as bf16
  // (the slice's loader: staging, dtype conversion, dequantization).
  using UploadFn = std::function<absl::Status(const TensorSpec& spec, bf16* dst)>;

  // Allocates the weights of one MoE block of `config` (config.moe.enabled()). InvalidArgument
  // when a size is not supported (hidden_size % 8, num_experts > kMoeMaxExperts, top_k > 32).
  static absl::StatusOr<std::unique_ptr<CudaMoeLayer>> Create(const ModelConfig& config);

  // Loads layer `layer`'s block (MoeLayerTensorSpecs: the CPU loader's names and shapes): the
  // experts held quantized when `quant` is a quantized checkpoint's config and they pack (above),
  // else through `upload` (bf16); the router, its biases and the shared expert gate as fp32 from
  // `weights`. Errors name the tensor. Synchronizes `stream`.
  absl::Status Load(const ModelConfig& config, int layer, SafetensorsModel& weights,
                    const UploadFn& upload, cudaStream_t stream,
                    const quant::QuantConfig* quant = nullptr);
  // Random weights (benchmarks): uniform with std 0.02, biases likewise; with `format`, the
  // routed experts held quantized in it (random codes, groups of `group_cols`, scales giving
  // about the same spread). Synchronizes `stream`.
  absl::Status Randomize(uint64_t seed, cudaStream_t stream);
  absl::Status RandomizeQuantized(uint64_t seed, QuantFormat format, int group_cols,
                                  cudaStream_t stream);

  // The block on `tokens` rows (tokens <= ws.max_tokens()):
  //   x: [tokens, hidden] bf16, device — the post-attention-norm rows.
  //   residual: [tokens, hidden] fp32, device: residual += block(x); or, when residual is null,
  //   out: [tokens, hidden] bf16, device: out = bf16(block(x)).
  // stats_slot in [0, ws.num_layers()) records the touched-expert count there; -1 skips it.
  // Enqueues only (no host synchronization).
  absl::Status Forward(const bf16* x, int tokens, float* residual, bf16* out, CudaMoeWorkspace& ws,
                       int stats_slot, LaunchStream stream) const;

  int64_t weight_bytes() const { return static_cast<int64_t>(buffer_.bytes() + experts_.bytes()); }
  // Whether the routed experts are held quantized, and their device bytes (codes and scales).
  bool experts_quantized() const { return quant_gate_up_.codes != nullptr; }
  int64_t quantized_expert_bytes() const {
    return experts_quantized() ? static_cast<int64_t>(experts_.bytes()) : 0;
  }
  // The workspace scratch the larger steps dequantize quantized experts into (0 for bf16).
  int64_t dequant_scratch_bytes() const;
  // The most a range of dequantized experts takes in the workspace.
  static constexpr int64_t kDequantScratchBytes = int64_t{256} << 20;

 private:
  CudaMoeLayer() = default;
  // The bf16 routed experts in experts_ (gate_up_, down_).
  absl::Status AllocateBf16Experts();
  // experts_ as the quantized stacks shaped `gate_up` and `down` (their pointers ignored).
  absl::Status AllocateQuantizedExperts(const QuantMatrixView& gate_up,
                                        const QuantMatrixView& down);
  // Holds the routed experts quantized (quant_gate_up_, quant_down_) when every expert matrix
  // packs in one format and group size the kernels run; "" then, else the reason not (the
  // caller loads them in bf16).
  absl::StatusOr<std::string> LoadQuantizedExperts(const ModelConfig& config, int layer,
                                                   SafetensorsModel& weights,
                                                   const quant::QuantConfig& quant);
  // The same for gpt-oss's stacked MXFP4 experts (fp4, groups of 32; gate/up deinterleaved).
  absl::StatusOr<std::string> LoadQuantizedStackedExperts(const ModelConfig& config, int layer,
                                                          SafetensorsModel& weights,
                                                          const quant::QuantConfig& quant);
  // Packs expert x's [2 inter, hidden] gate/up (gate rows first) and [hidden, inter] down
  // matrices; "" or the reason they cannot be held quantized.
  using ExpertPacker = std::function<absl::StatusOr<std::string>(
      int64_t x, quant::PackedMatrix* gate_up, quant::PackedMatrix* down)>;
  // Holds every expert `pack` gives in the quantized stacks when all share expert 0's format,
  // group size and the kernels' sizes; "" then, else the reason (nothing held).
  absl::StatusOr<std::string> StoreQuantizedExperts(int layer, const ExpertPacker& pack);
  // gpt-oss's stacked experts: the bf16 weights (when `weights`) and always the biases, through
  // `upload`, rearranged on the GPU into the kernels' layout. Synchronizes `stream`.
  absl::Status UploadStackedExperts(const MoeTensorSpecs& specs, const UploadFn& upload,
                                    bool weights, cudaStream_t stream);
  // Experts per dequantized range (larger steps on quantized experts).
  int DequantRangeExperts() const;
  // Writes router_bf16_ / router_bias_bf16_ from the fp32 router. Synchronizes `stream`.
  absl::Status MirrorRouter(cudaStream_t stream);
  // The weights of RunExperts: bf16, or quantized (quant_gate_up / quant_down non-null).
  struct ExpertWeights {
    const bf16* gate_up = nullptr;
    const bf16* gate_up_bias = nullptr;
    const bf16* down = nullptr;
    const bf16* down_bias = nullptr;
    const QuantMatrixView* quant_gate_up = nullptr;
    const QuantMatrixView* quant_down = nullptr;
    int inter = 0;
  };
  // One expert FFN (routed, grouped by `offsets`, or the shared one over every token); with `out`
  // null only its gate/up projection and activation (into the workspace's act_ rows).
  // `tokens`: the step's tokens (no group has more rows).
  absl::Status RunExperts(const bf16* x, const int32_t* row_token, const int32_t* offsets, int rows,
                          int groups, int tokens, const ExpertWeights& w, bool grouped_gemv,
                          bf16* out, CudaMoeWorkspace& ws, LaunchStream stream) const;
  // The larger steps' grouped GEMM on quantized weights `q` ([groups * n, k]): range by range of
  // DequantRangeExperts() groups, dequantized into the workspace scratch.
  absl::Status RunDequantizedGemm(MoeGroupedLinear a, const QuantMatrixView& q,
                                  CudaMoeWorkspace& ws, LaunchStream stream) const;

  MoeConfig moe_;
  int hidden_ = 0;
  int gemv_max_tokens_ = kDefaultGemvMaxTokens;
  int mma_min_tokens_ = std::numeric_limits<int>::max();
  DeviceBuffer buffer_;   // router, biases, shared experts
  DeviceBuffer experts_;  // routed experts: bf16 gate_up_ and down_, or the quantized stacks
  QuantMatrixView quant_gate_up_{};  // [E * 2 inter, hidden] when held quantized
  QuantMatrixView quant_down_{};     // [E * hidden, inter]
  float* router_ = nullptr;          // [E, hidden]
  float* router_bias_ = nullptr;     // [E] or null
  // bf16 copies of the router for steps above kMoeSmallRouteTokens tokens: their logits are a
  // tensor-core GEMM (the fp32 CUDA-core product would cost ~10% of a long prefill).
  bf16* router_bf16_ = nullptr;          // [E, hidden]
  bf16* router_bias_bf16_ = nullptr;     // [E] or null
  float* correction_bias_ = nullptr;     // [E] or null
  bf16* gate_up_ = nullptr;              // [E, 2 inter, hidden] (bf16 experts)
  bf16* gate_up_bias_ = nullptr;         // [E, 2 inter] or null (gpt-oss)
  bf16* down_ = nullptr;                 // [E, hidden, inter]
  bf16* down_bias_ = nullptr;            // [E, hidden] or null
  bf16* shared_gate_up_ = nullptr;       // [2 shared, hidden] or null
  bf16* shared_down_ = nullptr;          // [hidden, shared] or null
  float* shared_expert_gate_ = nullptr;  // [hidden] or null (Qwen2-MoE)
};

}  // namespace ringserve::cuda
