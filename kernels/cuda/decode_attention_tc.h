// Internal to kernels/cuda: the tensor-core decode attention kernel (decode_attention_tc.cu)
// behind LaunchDecodeAttention for head_dim 128. The caller has validated the shape and batch
// (group <= kDecodeMaxGroup) and launches the split-merging kernel when num_splits > 1.
#pragma once

#include "absl/status/status.h"
#include "kernels/cuda/attention.h"

namespace ringserve::cuda {

// Whether the current device gives a CTA the kernel's 100 KB of shared memory (sm_80 and sm_90
// do; sm_86 / sm_89 parts stop at 99 KB and run the CUDA-core kernel). Looked up once per
// process (one stage process drives one device).
bool DecodeAttentionTcFits();
// Tests: makes LaunchDecodeAttention run head dim 128 on the CUDA-core kernel, as on a device
// where the tensor-core kernel does not fit.
void ForceDecodeAttentionCudaCores(bool force);

// Reads q, or with qkv.qkv set does the attention input stage itself
// (LaunchDecodeAttentionFromQkv).
absl::Status LaunchDecodeAttentionTc(const AttentionShape& shape, const bf16* q,
                                     const DecodeQkv& qkv, bf16* out, const DecodeBatch& batch,
                                     cudaStream_t stream);

}  // namespace ringserve::cuda
