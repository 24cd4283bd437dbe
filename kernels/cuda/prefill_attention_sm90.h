// Internal to kernels/cuda: the Hopper (sm_90a) prefill attention kernel behind
// LaunchPrefillAttention for batches of kPrefillTileSm90-query tiles. Compiled only for sm_90a
// (its own object library), so callers must check the device's compute capability first.
#pragma once

#include "absl/status/status.h"
#include "kernels/cuda/attention.h"

namespace ringserve::cuda {

absl::Status LaunchPrefillAttentionSm90(const AttentionShape& shape, const bf16* q, bf16* out,
                                        const PrefillBatch& batch, cudaStream_t stream);

}  // namespace ringserve::cuda
