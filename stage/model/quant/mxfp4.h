// MXFP4 (OCP microscaling FP4), as gpt-oss stores its expert weights (`quant_method: mxfp4`):
// `<name>_blocks` U8 [..., G, 16] and `<name>_scales` U8 [..., G]. Each block is 32 values in 16
// bytes, the low nibble first; a nibble is an e2m1 code (kFp4Values); each block has one e8m0
// scale. Rule (transformers' convert_moe_packed_tensors, fp32 here):
//   out[..., g * 32 + 2 * b]     = kFp4Values[blocks[..., g, b] & 0xf] * 2^(scales[..., g] - 127)
//   out[..., g * 32 + 2 * b + 1] = kFp4Values[blocks[..., g, b] >> 4]  * 2^(scales[..., g] - 127)
// giving [..., G * 32] (for gpt-oss experts [E, rows, cols]: rows are the stored rows;
// transformers then transposes to its [E, cols, rows] parameter layout, which this does not).
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "stage/model/quant/quant_tensor.h"

namespace ringserve::quant {

inline constexpr std::array<float, 16> kFp4Values = {+0.0f, +0.5f, +1.0f, +1.5f, +2.0f, +3.0f,
                                                     +4.0f, +6.0f, -0.0f, -0.5f, -1.0f, -1.5f,
                                                     -2.0f, -3.0f, -4.0f, -6.0f};

// Returns the values [..., G * 32] fp32 row-major. InvalidArgument naming the tensor unless
// blocks is U8 [..., G, 16] and scales U8 (or F8_E8M0) [..., G].
absl::StatusOr<std::vector<float>> DequantizeMxfp4(const QTensor& blocks, const QTensor& scales);

}  // namespace ringserve::quant
