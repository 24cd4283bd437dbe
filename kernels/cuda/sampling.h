// Token selection on the GPU.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/cuda_utils.h"

namespace ringserve::cuda {

// tokens[r] = argmax_i logits[r, i] for r < rows; ties -> lowest id; NaN counts as -inf; a row
// of all -inf/NaN yields 0 (the CPU sampler's GreedyToken contract).
// logits: [rows, vocab] fp32 device; tokens: [rows] int32 device.
absl::Status LaunchArgmax(const float* logits, int rows, int vocab, int32_t* tokens,
                          cudaStream_t stream);

}  // namespace ringserve::cuda
