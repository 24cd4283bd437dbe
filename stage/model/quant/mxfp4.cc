#include "stage/model/quant/mxfp4.h"

#include <cmath>

#include "common/status_macros.h"
#include "fmt/format.h"

namespace ringserve::quant {

absl::StatusOr<std::vector<float>> DequantizeMxfp4(const QTensor& blocks, const QTensor& scales) {
  RS_RETURN_IF_ERROR(CheckDType(blocks, {DType::kU8}));
  RS_RETURN_IF_ERROR(CheckDType(scales, {DType::kU8, DType::kF8E8M0}));
  if (blocks.shape.size() < 2 || blocks.shape.back() != 16) {
    return absl::InvalidArgumentError(fmt::format(
        "MXFP4 blocks \"{}\" must be [..., groups, 16] (32 four-bit values in 16 bytes)",
        blocks.name));
  }
  const std::vector<int64_t> scale_shape(blocks.shape.begin(), blocks.shape.end() - 1);
  RS_RETURN_IF_ERROR(CheckShape(scales, scale_shape));
  const int64_t num_blocks = scales.NumElements();
  std::vector<float> out(static_cast<size_t>(num_blocks * 32));
  for (int64_t b = 0; b < num_blocks; ++b) {
    const uint8_t code = scales.bytes[b];
    // As the reference: ldexp of the exponent, so the e8m0 NaN code 0xff gives inf, not NaN.
    const int exponent = static_cast<int>(code) - 127;
    for (int k = 0; k < 16; ++k) {
      const uint8_t byte = blocks.bytes[b * 16 + k];
      out[b * 32 + 2 * k] = std::ldexp(kFp4Values[byte & 0xf], exponent);
      out[b * 32 + 2 * k + 1] = std::ldexp(kFp4Values[byte >> 4], exponent);
    }
  }
  return out;
}

}  // namespace ringserve::quant
