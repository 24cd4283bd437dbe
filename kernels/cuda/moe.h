// Mixture-of-experts kernels (bf16 weights and activations, fp32 accumulation and routing): the
// router (logits, top-k under every RouterScoring of ring/moe_config.h), the grouping of a
// step's (token, expert) pairs by expert (a permutation built on the GPU), the grouped expert
// projections (a CUDA-core GEMV that streams only the experts in use, for decode-sized steps,
// and a tensor-core grouped GEMM for prefill), the expert activation and the weighted combine.
// No launch reads a count back to the host: every grid is sized from host-known bounds (tokens,
// top_k, experts) and blocks with no work exit, so decode steps can be captured in CUDA graphs.
// All pointers are device memory, row-major; launches are asynchronous on `stream`.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/cuda_utils.h"
#include "kernels/cuda/kernel_selector.h"
#include "kernels/cuda/quant_gemv.h"
#include "ring/moe_config.h"

namespace ringserve::cuda {

// Rows of one tensor-core GEMM tile (moe_gemm.cu): a group of n rows takes ceil(n / kMoeTileRows)
// tiles.
inline constexpr int kMoeTileRows = 128;
// Steps of at most this many tokens route in one single-block kernel.
inline constexpr int kMoeSmallRouteTokens = 64;
// Experts a router kernel handles (the largest families have 256).
inline constexpr int kMoeMaxExperts = 512;
// Steps of up to this many tokens can compute the router logits and route in one kernel
// (LaunchMoeRouterLogitsAndRoute).
inline constexpr int kMoeFusedRouteTokens = 8;

// Opts the kernels that need it into large shared memory on the current device (once per
// device; every launcher calls it, and CudaMoeLayer calls it at load so that no first launch
// happens inside a graph capture).
absl::Status PrepareMoeKernels();

// logits[t, e] = sum_h x[t, h] * router[e, h] (+ bias[e]), fp32 math.
// x: [tokens, hidden] bf16; router: [experts, hidden] fp32; bias: [experts] fp32 or null;
// logits: [tokens, experts] fp32. hidden % 4 == 0.
absl::Status LaunchMoeRouterLogits(const bf16* x, const float* router, const float* bias,
                                   float* logits, int tokens, int experts, int hidden,
                                   LaunchStream stream);

// The routing of one step and the grouping of its (token, choice) entries by expert.
struct MoeRouting {
  // In: [tokens, experts] fp32 router logits; [experts] fp32 correction bias or null.
  const float* logits = nullptr;
  const float* correction_bias = nullptr;
  // Out, [tokens, top_k]: chosen experts by selection score descending (ties to the lower index)
  // and their weights (stage/model/moe_router.h's RouteTokens, fp32).
  int32_t* expert_ids = nullptr;
  float* weights = nullptr;
  // Out: counts [experts] (rows per expert), offsets [experts + 1] (exclusive prefix sum:
  // expert e's rows are [offsets[e], offsets[e + 1]) of the permuted order), row_token
  // [tokens * top_k] (the token of each permuted row; within an expert the order is
  // unspecified), entry_row [tokens * top_k] (the permuted row of entry t * top_k + j).
  int32_t* counts = nullptr;
  int32_t* offsets = nullptr;
  int32_t* row_token = nullptr;
  int32_t* entry_row = nullptr;
  // Out: the tensor-core GEMM's tile list [MoeMaxTiles(...), 2] = (expert, first row) and its
  // length [1] (tiles of kMoeTileRows rows, expert by expert).
  int32_t* tiles = nullptr;
  int32_t* num_tiles = nullptr;
  // Out: the experts with rows, ascending, then -1: [experts] (the grouped GEMV's blocks).
  int32_t* active = nullptr;
  // Out, optional: the number of experts with at least one row, written to *experts_touched.
  int32_t* experts_touched = nullptr;
  int tokens = 0;
};
// Tiles a step of `rows` (token, expert) rows over `experts` experts can take.
inline int64_t MoeMaxTiles(int64_t rows, int experts) {
  return (rows + kMoeTileRows - 1) / kMoeTileRows + experts;
}
// Routes routing.tokens tokens under `options` (kSoftmaxTopK also with groups, topk_group <
// n_group: DeepSeek-V2's group_limited_greedy, a group scored by its best probability, and
// routed_scaling_factor) (ValidateRouterOptions must hold; num_experts
// <= kMoeMaxExperts, top_k <= 32, n_group <= 32) and groups the entries by expert. Steps of at
// most kMoeSmallRouteTokens tokens run one kernel; larger ones three (clear, top-k, scan).
absl::Status LaunchMoeRoute(const RouterOptions& options, const MoeRouting& routing,
                            LaunchStream stream);
// LaunchMoeRouterLogits (routing.logits its output) and LaunchMoeRoute in one kernel, for steps
// of at most kMoeFusedRouteTokens tokens: the block that finishes its logits last routes the
// step. `ticket`: one int32 of device memory, 0 before the launch and left at 0 after it (a
// workspace's; launches that share a ticket must not run concurrently). The same results, bit
// for bit, as the two launches.
absl::Status LaunchMoeRouterLogitsAndRoute(const bf16* x, const float* router, const float* bias,
                                           int hidden, const RouterOptions& options,
                                           const MoeRouting& routing, int32_t* ticket,
                                           LaunchStream stream);

// Expert activation of the grouped projections: none (plain projection), SiLU(gate) * up, or
// gpt-oss's clamped SwiGLU (ring/moe_config.h's ExpertActivation).
enum class MoeActivation { kNone, kSiluMul, kClampedSwiglu };
struct MoeActivationParams {
  MoeActivation kind = MoeActivation::kNone;
  float alpha = 1.702f;
  float limit = 7.0f;
};

// A projection of row groups, each with its own weight: for group g and each of its rows r
// (rows [offsets[g], offsets[g + 1]), or rows [0, rows) of the one group when offsets is null),
//   out[r, c] = sum_k x[src(r), k] * w[g, c, k] (+ bias[g, c])      for c < n
// with src(r) = row_token[r] (or r when null). With an activation, w[g] has 2n rows (gate rows,
// then up rows, and bias 2n values) and out[r, c] = act(bf16(gate), bf16(up)) for c < n.
// x: [*, k] bf16 with row stride k; w: [groups, (1 or 2) * n, k] bf16; bias: [groups, ...] bf16
// or null; out: [rows, n] bf16 or fp32 (out_f32).
struct MoeGroupedLinear {
  const bf16* x = nullptr;
  const int32_t* row_token = nullptr;
  const int32_t* offsets = nullptr;
  int rows = 0;    // rows of the one group when offsets is null; else ignored
  int groups = 1;  // groups (experts); 1 when offsets is null
  // Optional, with offsets: LaunchMoeRoute's active list. The GEMV then runs min(groups,
  // max_active) block rows, row y on group active[y] (none when -1), instead of one per group.
  const int32_t* active = nullptr;
  int max_active = 0;
  const bf16* w = nullptr;
  const bf16* bias = nullptr;
  int n = 0;
  int k = 0;
  void* out = nullptr;
  bool out_f32 = false;
  MoeActivationParams act{};
  // LaunchMoeGroupedGemm only: the tiles of groups [group_begin, group_end) run (group_end < 0:
  // every group), and w holds those groups only (group group_begin first). For weights
  // dequantized a range of experts at a time (LaunchMoeQuantGroupedGemv's larger steps).
  int group_begin = 0;
  int group_end = -1;
  // The GEMVs only, optional: no group has more rows than this (a step's token count bounds a
  // routed expert's rows); 0 when unknown. The GEMVs then pass over the weights once per
  // MoeGemvRowChunk(max_group_rows, ...) rows of a group, holding fewer accumulators (registers:
  // more blocks per multiprocessor for decode's one or few rows). The sums do not depend on it.
  int max_group_rows = 0;
  // LaunchMoeGroupedGemm only: the KernelPlan's kernel (wgmma: the device must be compute
  // capability 9.0 and the build carry sm_90a code).
  MoeGemmKernel gemm_kernel = MoeGemmKernel::kWmma;
};
// Rows per pass of the grouped GEMVs over a group's weights (rows beyond it re-read the weights,
// mostly from L2). Measured on an H100 (bench/cuda/NOTES.md, Qwen3-30B-A3B's shape): one row per
// pass wins for the quantized GEMV at every step size (int4, 32 streams: 1,302 tok/s against 880
// at 8 rows; 64 streams: 1,450 against 1,112), as its decode holds many registers per row; the
// bf16 GEMV takes max_group_rows when it is 1 or 2, 4 up to 32 rows (32 streams: 1,374 against
// 1,341 at 8), else 8 (64 streams: 1,977 against 1,850 at 4). RINGSERVE_MOE_GEMV_ROWS (1, 2, 4
// or 8; read once) overrides the choice for steps of more than one row per group (a debug
// switch for A/B runs).
int MoeGemvRowChunk(int max_group_rows, bool quantized);
// CUDA cores, one pass over each used group's weights per MoeGemvRowChunk rows (decode-sized
// steps: only the experts in use are read). Any k; grid sized by n and groups.
absl::Status LaunchMoeGroupedGemv(const MoeGroupedLinear& a, LaunchStream stream);
// LaunchMoeGroupedGemv on tensor cores (mma.sync, sm_80+; moe_grouped_mma.cu), bf16 weights:
// each warp multiplies 16 output columns' weight rows (with an activation, 16 gate and 16 up
// rows) by a group's rows 8 at a time, streaming the weights once per 32 rows of a group, with no
// per-row CUDA-core work. For decode batches, where groups hold several rows each. The same
// outputs as the GEMV up to the order of the fp32 sums. Needs MoeGroupedMmaSupported (k % 32 ==
// 0, x and w 16-byte aligned); InvalidArgument otherwise or for bad arguments.
bool MoeGroupedMmaSupported(const MoeGroupedLinear& a);
absl::Status LaunchMoeGroupedMma(const MoeGroupedLinear& a, LaunchStream stream);
// Tensor cores (mma through WMMA, or wgmma on Hopper: a.gemm_kernel; 128x128 tiles, cp.async
// pipeline) over the tile list of
// LaunchMoeRoute (tiles/num_tiles; max_tiles = its capacity), or over ceil(rows / kMoeTileRows)
// tiles of the one group when offsets is null. k % 8 == 0, x and w 16-byte aligned. No
// activation (run LaunchMoeActivation on its 2n-wide output).
absl::Status LaunchMoeGroupedGemm(const MoeGroupedLinear& a, const int32_t* tiles,
                                  const int32_t* num_tiles, int max_tiles, LaunchStream stream);
// LaunchMoeGroupedGemv with quantized weights: `w` is the groups' weights stacked by rows,
// [groups * (1 or 2) * n, k] in quant_gemv.h's layout (a.w is ignored); k a multiple of the
// format's chunk. Each used group's codes are streamed once per 8 of its rows and dequantized in
// registers (decode-sized steps of quantized MoE checkpoints).
absl::Status LaunchMoeQuantGroupedGemv(const MoeGroupedLinear& a, const QuantMatrixView& w,
                                       LaunchStream stream);

// act[r, c] = f(gate_up[r, c], gate_up[r, n + c]) for r < rows, c < n: gate_up [rows, 2n] bf16
// (biases already added), act [rows, n] bf16. kind != kNone.
absl::Status LaunchMoeActivation(const bf16* gate_up, bf16* act, int rows, int n,
                                 const MoeActivationParams& params, LaunchStream stream);

// The weighted sum of each token's experts, plus the shared expert:
//   y[t, :] = sum_j weights[t, j] * expert_out[entry_row[t, j], :]
//             + s(t) * shared_out[t, :]   (when shared_out; s(t) = sigmoid(x[t, :] . shared_gate)
//                                          when shared_gate, else 1)
// then residual[t, :] += y (fp32) when residual, else out[t, :] = bf16(y).
// expert_out: [tokens * top_k, hidden] bf16; shared_out: [tokens, hidden] bf16 or null;
// shared_gate: [hidden] fp32 or null (needs x: [tokens, hidden] bf16).
struct MoeCombine {
  const float* weights = nullptr;
  const int32_t* entry_row = nullptr;
  const bf16* expert_out = nullptr;
  const bf16* shared_out = nullptr;
  const float* shared_gate = nullptr;
  const bf16* x = nullptr;
  float* residual = nullptr;
  bf16* out = nullptr;
  int tokens = 0;
  int top_k = 0;
  int hidden = 0;
};
absl::Status LaunchMoeCombine(const MoeCombine& a, LaunchStream stream);

// The routed experts' down projection and the combine of a step of a few tokens in one kernel:
// for each token t and column c < n,
//   y = sum over j < top_k, in order, of weights[t, j] * bf16(act[entry_row[t, j]] . w[g, c]
//       (+ bias[g, c])) with g = expert_ids[t, j];  y += shared_out[t, c] when given;
//   residual[t, c] += y, or out[t, c] = bf16(y).
// Bit for bit LaunchMoeGroupedGemv (no activation; act in permuted-row order, w [E, n, k] bf16,
// bias [E, n] or null) — or LaunchMoeQuantGroupedGemv on `quant` ([E * n, k] in the quantized
// GEMV's layout) when it is given — followed by LaunchMoeCombine without a shared gate. Each
// token streams its own experts' rows, so steps of more than a few tokens (where tokens share
// experts) read more than the grouped GEMV does: kMoeDownCombineTokens.
inline constexpr int kMoeDownCombineTokens = 4;
struct MoeDownCombine {
  const bf16* act = nullptr;  // [tokens * top_k, k], permuted rows
  const int32_t* expert_ids = nullptr;
  const float* weights = nullptr;
  const int32_t* entry_row = nullptr;
  const bf16* w = nullptr;                 // or null with `quant`
  const QuantMatrixView* quant = nullptr;  // quantized weights instead of w
  const bf16* bias = nullptr;
  int n = 0;
  int k = 0;  // k % 8 == 0
  const bf16* shared_out = nullptr;
  float* residual = nullptr;
  bf16* out = nullptr;
  int tokens = 0;
  int top_k = 0;
};
absl::Status LaunchMoeDownCombine(const MoeDownCombine& a, LaunchStream stream);

// Load-time layout changes of gpt-oss's stacked experts (ExpertLayout::kGptOssStacked), bf16:
//   gate_up [E, hidden, 2 inter] (input-major, gate/up interleaved) -> [E, 2 inter, hidden]
//   (gate rows, then up rows); gate_up_bias [E, 2 inter] interleaved -> [E, 2 inter] gate then up;
//   down [E, inter, hidden] -> [E, hidden, inter].
absl::Status LaunchMoeUnstackGateUp(const bf16* src, bf16* dst, int experts, int hidden, int inter,
                                    LaunchStream stream);
absl::Status LaunchMoeUnstackGateUpBias(const bf16* src, bf16* dst, int experts, int inter,
                                        LaunchStream stream);
absl::Status LaunchMoeTransposeDown(const bf16* src, bf16* dst, int experts, int inter, int hidden,
                                    LaunchStream stream);

}  // namespace ringserve::cuda
