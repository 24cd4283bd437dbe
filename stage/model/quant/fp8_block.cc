#include "stage/model/quant/fp8_block.h"

#include <algorithm>
#include <array>

#include "common/parallel_ranges.h"
#include "common/status_macros.h"
#include "fmt/format.h"

namespace ringserve::quant {

absl::StatusOr<std::vector<float>> DequantizeFp8(const QTensor& weight, const QTensor& scale,
                                                 Fp8BlockGrid grid) {
  RS_RETURN_IF_ERROR(CheckDType(weight, {DType::kF8E4M3}));
  if (weight.shape.size() != 2) {
    return absl::InvalidArgumentError(
        fmt::format("FP8 weight \"{}\" has rank {}, expected 2", weight.name, weight.shape.size()));
  }
  if (grid.block_rows <= 0 || grid.block_cols <= 0) {
    return absl::InvalidArgumentError(
        fmt::format("FP8 weight \"{}\": block size [{}, {}] is not "
                    "positive",
                    weight.name, grid.block_rows, grid.block_cols));
  }
  const int64_t rows = weight.shape[0], cols = weight.shape[1];
  const int64_t grid_rows = CeilDiv(rows, grid.block_rows);
  const int64_t grid_cols = CeilDiv(cols, grid.block_cols);
  RS_RETURN_IF_ERROR(
      CheckGridShape(scale, grid_rows, grid_cols,
                     fmt::format("FP8 weight \"{}\" [{}, {}] in blocks of [{}, {}]", weight.name,
                                 rows, cols, grid.block_rows, grid.block_cols)));
  RS_ASSIGN_OR_RETURN(std::vector<float> scales, ReadScales(scale));
  std::vector<float> out(static_cast<size_t>(rows * cols));
  // Rows in parallel, block column by block column (loaders run this on every weight of a
  // checkpoint): the codes' values from one table, one scale per block.
  std::array<float, 256> values;
  for (int b = 0; b < 256; ++b) values[b] = Fp8E4M3ToFloat(static_cast<uint8_t>(b));
  RS_RETURN_IF_ERROR(ParallelRanges(
      rows, std::max<int64_t>(1, (1 << 18) / cols), [&](int64_t row_begin, int64_t row_end) {
        for (int64_t r = row_begin; r < row_end; ++r) {
          const float* scale_row = scales.data() + (r / grid.block_rows) * grid_cols;
          const uint8_t* in = weight.bytes.data() + r * cols;
          float* dst = out.data() + r * cols;
          for (int64_t g = 0; g < grid_cols; ++g) {
            const float s = scale_row[g];
            const int64_t c1 = std::min(cols, (g + 1) * grid.block_cols);
            for (int64_t c = g * grid.block_cols; c < c1; ++c) dst[c] = values[in[c]] * s;
          }
        }
        return absl::OkStatus();
      }));
  return out;
}

}  // namespace ringserve::quant
