// Internal to kernels/cuda: the tensor-core decode attention kernel (decode_attention_tc.cu)
// behind LaunchDecodeAttention for head_dim 128. The caller has validated the shape and batch
// (group <= kDecodeMaxGroup) and launches the split-merging kernel when num_splits > 1.
#pragma once

#include "absl/status/status.h"
#include "kernels/cuda/attention.h"

namespace ringserve::cuda {

absl::Status LaunchDecodeAttentionTc(const AttentionShape& shape, const bf16* q, bf16* out,
                                     const DecodeBatch& batch, cudaStream_t stream);

}  // namespace ringserve::cuda
