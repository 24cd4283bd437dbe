// Internal to kernels/cuda: the tensor-core decode attention kernel (decode_attention_tc.cu)
// behind LaunchDecodeAttention for head_dim 128. The caller has validated the shape and batch
// (group <= kDecodeMaxGroup) and launches the split-merging kernel when num_splits > 1.
#pragma once

#include "absl/status/status.h"
#include "kernels/cuda/attention.h"

namespace ringserve::cuda {

// The kernel needs kDecodeAttentionTcSmemBytes (100 KB) of shared memory per CTA: sm_80 and
// sm_90 have it; sm_86 / sm_89 parts stop at 99 KB (the selector picks the CUDA-core kernel).
// Reads q, or with qkv.qkv set does the attention input stage itself
// (LaunchDecodeAttentionFromQkv).
absl::Status LaunchDecodeAttentionTc(const AttentionShape& shape, const bf16* q,
                                     const DecodeQkv& qkv, bf16* out, const DecodeBatch& batch,
                                     LaunchStream stream);

}  // namespace ringserve::cuda
