// AWQ checkpoints (`quant_method: awq`, `version: gemm`; AutoAWQ's WQLinear_GEMM layout) and their
// one rule.
//
// Storage, for a linear layer [out, in], 4 bits, G = in / group_size groups:
//   qweight I32 [in, out / 8]: word qweight[i][j] holds columns j*8 + kAwqOrder[k] in field k
//   qzeros  I32 [G, out / 8]:  the same packing, one row per group
//   scales  F16 [G, out]
// kAwqOrder = {0, 2, 4, 6, 1, 3, 5, 7} (AutoAWQ's pack order_map; unpacking applies its inverse
// AWQ_REVERSE_ORDER {0, 4, 1, 5, 2, 6, 3, 7}).
// Rule (AutoAWQ's dequantize_gemm; it computes in fp16 and rounds, fp32 here is exact),
// g = i / group_size:
//   W[o][i] = (q[i][o] - z[g][o]) * scales[g][o]
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "stage/model/quant/quant_tensor.h"

namespace ringserve::quant {

inline constexpr std::array<int, 8> kAwqOrder = {0, 2, 4, 6, 1, 3, 5, 7};

struct AwqArgs {
  int64_t out_features = 0;
  int64_t in_features = 0;
  int group_size = 128;  // -1: one group over all of in_features
};

// Returns W [out, in] fp32 row-major. InvalidArgument naming the tensor for wrong dtypes/shapes.
absl::StatusOr<std::vector<float>> DequantizeAwq(const QTensor& qweight, const QTensor& qzeros,
                                                 const QTensor& scales, const AwqArgs& args);

}  // namespace ringserve::quant
