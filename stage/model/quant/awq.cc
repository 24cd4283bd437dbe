#include "stage/model/quant/awq.h"

#include <algorithm>

#include "common/status_macros.h"
#include "fmt/format.h"

namespace ringserve::quant {

absl::StatusOr<std::vector<float>> DequantizeAwq(const QTensor& qweight, const QTensor& qzeros,
                                                 const QTensor& scales, const AwqArgs& args) {
  const int64_t out = args.out_features, in = args.in_features;
  if (out % 8 != 0) {
    return absl::InvalidArgumentError(
        fmt::format("\"{}\": out_features {} is not a multiple of 8 (AWQ packs 8 columns a word)",
                    qweight.name, out));
  }
  const int64_t group_size = args.group_size <= 0 ? in : args.group_size;
  const int64_t groups = CeilDiv(in, group_size);
  RS_RETURN_IF_ERROR(CheckDType(qweight, {DType::kI32}));
  RS_RETURN_IF_ERROR(CheckDType(qzeros, {DType::kI32}));
  RS_RETURN_IF_ERROR(CheckShape(qweight, std::vector<int64_t>{in, out / 8}));
  RS_RETURN_IF_ERROR(CheckShape(qzeros, std::vector<int64_t>{groups, out / 8}));
  RS_RETURN_IF_ERROR(CheckShape(scales, std::vector<int64_t>{groups, out}));
  RS_ASSIGN_OR_RETURN(std::vector<float> scale, ReadScales(scales));
  std::vector<int> zero(static_cast<size_t>(groups * out));
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t j = 0; j < out / 8; ++j) {
      const uint32_t zword = LoadWord(qzeros.bytes, g * (out / 8) + j);
      for (int k = 0; k < 8; ++k) {
        zero[g * out + j * 8 + kAwqOrder[k]] = static_cast<int>(Field(zword, 4, k));
      }
    }
  }
  // W is [out, in] but qweight runs along out: a tile of kTile inputs keeps the 8 output rows a
  // word touches in cache while their runs fill.
  constexpr int64_t kTile = 16;
  std::vector<float> w(static_cast<size_t>(out * in));
  for (int64_t i0 = 0; i0 < in; i0 += kTile) {
    const int64_t i1 = std::min(in, i0 + kTile);
    for (int64_t j = 0; j < out / 8; ++j) {
      for (int64_t i = i0; i < i1; ++i) {
        const int64_t g = i / group_size;
        const uint32_t qword = LoadWord(qweight.bytes, i * (out / 8) + j);
        for (int k = 0; k < 8; ++k) {
          const int64_t o = j * 8 + kAwqOrder[k];
          const int q = static_cast<int>(Field(qword, 4, k));
          w[o * in + i] = static_cast<float>(q - zero[g * out + o]) * scale[g * out + o];
        }
      }
    }
  }
  return w;
}

}  // namespace ringserve::quant
