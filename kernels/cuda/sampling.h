// Token selection on the GPU: greedy argmax, and full sampling (temperature, top-k, top-p, the
// counter-based uniform) with the same contract as the CPU sampler (stage/sampling/sampler.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "absl/status/status.h"
#include "kernels/cuda/cuda_utils.h"

namespace ringserve::cuda {

// tokens[r] = argmax_i logits[r, i] for r < rows; ties -> lowest id; NaN counts as -inf; a row
// of all -inf/NaN yields 0 (the CPU sampler's GreedyToken contract).
// logits: [rows, vocab] fp32 device; tokens: [rows] int32 device.
absl::Status LaunchArgmax(const float* logits, int rows, int vocab, int32_t* tokens,
                          LaunchStream stream);

// One row's sampling parameters: SamplingConfig + token_index of the CPU sampler, as a plain
// host-fillable struct that the caller copies to the device ([rows] array).
struct GpuRowSampling {
  float temperature;     // 0 = greedy
  int top_k;             // 0 = off
  float top_p;           // 1 = off
  uint64_t seed;         // SamplingConfig::seed
  uint64_t token_index;  // RowSampling::token_index
};
static_assert(std::is_trivially_copyable_v<GpuRowSampling> &&
              std::is_standard_layout_v<GpuRowSampling>);

// Device workspace LaunchSampleRows needs for `rows` x `vocab` (currently 0: everything lives
// in shared memory; call it anyway so a future version can grow).
size_t SampleRowsWorkspaceBytes(int rows, int vocab);

// Samples one token per row, exactly as SampleRow (stage/sampling/sampler.h) does on the host:
// temperature 0 (or a row of <= 1 logits, all -inf/NaN, or with a +inf logit) is greedy
// (argmax, ties -> lowest id, NaN = -inf, all -inf -> 0); otherwise z = logits / temperature,
// top-k (k largest, ties -> lower id), softmax over what is kept, top-p over the candidates in
// the order (p desc, id asc), and the inverse CDF at u = SamplingUniform(seed, token_index)
// over the kept candidates, in that order (in id order when neither top-k nor top-p cuts
// anything). Probabilities are accumulated in 2^-(62 - bit_width(vocab)) fixed point from
// double exp, so a token can differ from the CPU's only when u lies within ~1e-9 (relative) of
// a CDF boundary. The result of a row depends only on that row (not on `rows` or the batch
// order) and is bit-for-bit reproducible.
// logprobs[r] (when logprobs != nullptr) = TokenLogprob(raw row r, tokens[r]): log_softmax of
// the raw logits (no temperature / top-k / top-p), NaN = -inf, computed in double.
// Parameters must satisfy ValidateSamplingConfig; invalid ones do not fault (temperature NaN
// or <= 0 -> greedy, top_k <= 0 -> off, top_p NaN or >= 1 -> off, top_p <= 0 -> one token).
// Shapes and memory spaces: logits [rows, vocab] fp32 device; params [rows] device;
// tokens [rows] int32 device; logprobs [rows] fp32 device or nullptr; workspace device,
// >= SampleRowsWorkspaceBytes(rows, vocab) bytes (may be nullptr when that is 0).
// Asynchronous on `stream`; InvalidArgument for a bad shape, null pointers or a small
// workspace, else the launch status.
absl::Status LaunchSampleRows(const float* logits, int rows, int vocab,
                              const GpuRowSampling* params, int32_t* tokens, float* logprobs,
                              void* workspace, size_t workspace_bytes, LaunchStream stream);

// Feeds sampled tokens into the next step's token ids on the device (a one-stage ring with plans
// sent ahead: the step after a sampling step reads its tokens without a trip through the host):
// for i < count, dst[pairs[2i]] = src[pairs[2i + 1]]. All device memory; the indices must be in
// range (unchecked on the device). Asynchronous on `stream`; InvalidArgument for count < 0 or
// null pointers with count > 0.
absl::Status LaunchFeedTokens(const int32_t* src, const int32_t* pairs, int count, int32_t* dst,
                              LaunchStream stream);

}  // namespace ringserve::cuda
