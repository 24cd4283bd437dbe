// GPTQ checkpoints (`quant_method: gptq`; AutoGPTQ / GPTQModel layout) and their one rule.
//
// Storage, for a linear layer [out, in] with b in {2, 4, 8} bits, p = 32 / b per int32 and G
// groups:
//   qweight I32 [in / p, out]: q[i][o] is field (i % p) of qweight[i / p][o] (packed along in)
//   qzeros  I32 [G, out / p]:  z[g][o] is field (o % p) of qzeros[g][o / p]   (packed along out)
//   scales  F16 [G, out]
//   g_idx   I32 [in] (optional): the group of input column i; i / group_size when absent. With
//           desc_act the checkpoint's g_idx is a permutation's groups and is used as stored.
// Rule (AutoGPTQ's dequantization; it computes in fp16 and rounds, fp32 here is exact):
//   W[o][i] = scales[g][o] * (q[i][o] - (z[g][o] + offset)),  g = g_idx[i]
// offset = 1 for checkpoint_format "gptq" (v1 stores z - 1), 0 for "gptq_v2".
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "stage/model/quant/quant_tensor.h"

namespace ringserve::quant {

struct GptqArgs {
  int64_t out_features = 0;
  int64_t in_features = 0;
  int bits = 4;          // 2, 4 or 8
  int group_size = 128;  // -1: one group over all of in_features
  int zero_offset = 1;   // 1 for v1 ("gptq"), 0 for "gptq_v2"
};

// `g_idx` may be null. Returns W [out, in] fp32 row-major (the Hugging Face Linear layout).
// InvalidArgument naming the tensor for wrong dtypes, shapes, or g_idx entries out of range.
absl::StatusOr<std::vector<float>> DequantizeGptq(const QTensor& qweight, const QTensor& qzeros,
                                                  const QTensor& scales, const QTensor* g_idx,
                                                  const GptqArgs& args);

// The number of groups: ceil(in / group_size), or 1 for group_size -1.
int64_t GptqNumGroups(int64_t in_features, int group_size);

}  // namespace ringserve::quant
