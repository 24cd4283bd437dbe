#include "stage/model/quant/compressed_tensors.h"

#include <algorithm>

#include "common/status_macros.h"
#include "fmt/format.h"

namespace ringserve::quant {

absl::StatusOr<std::vector<int8_t>> UnpackCompressedInt32(const QTensor& packed, int bits,
                                                          int64_t rows, int64_t cols,
                                                          int packed_dim) {
  if (bits < 1 || bits > 8) {
    return absl::InvalidArgumentError(fmt::format(
        "tensor \"{}\": {} bits cannot be packed into int32 (1 to 8)", packed.name, bits));
  }
  if (packed_dim != 0 && packed_dim != 1) {
    return absl::InvalidArgumentError(
        fmt::format("tensor \"{}\": packed dimension {} is not 0 or 1", packed.name, packed_dim));
  }
  RS_RETURN_IF_ERROR(CheckDType(packed, {DType::kI32}));
  const int per_word = 32 / bits;
  const int64_t shape[2] = {packed_dim == 0 ? CeilDiv(rows, per_word) : rows,
                            packed_dim == 1 ? CeilDiv(cols, per_word) : cols};
  RS_RETURN_IF_ERROR(CheckShape(packed, shape));
  const int offset = 1 << (bits - 1);
  std::vector<int8_t> out(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const uint32_t word = packed_dim == 1 ? LoadWord(packed.bytes, r * shape[1] + c / per_word)
                                            : LoadWord(packed.bytes, (r / per_word) * cols + c);
      const int position = static_cast<int>(packed_dim == 1 ? c % per_word : r % per_word);
      out[r * cols + c] =
          static_cast<int8_t>(static_cast<int>(Field(word, bits, position)) - offset);
    }
  }
  return out;
}

absl::StatusOr<std::vector<float>> DequantizeCompressedInt(std::span<const int8_t> q,
                                                           const QTensor& scale,
                                                           const IntDequantArgs& args) {
  const int64_t rows = args.rows, cols = args.cols;
  if (static_cast<int64_t>(q.size()) != rows * cols || args.grid.block_rows <= 0 ||
      args.grid.block_cols <= 0) {
    return absl::InvalidArgumentError(
        fmt::format("scale \"{}\": {} values for a [{}, {}] weight in blocks of [{}, {}]",
                    scale.name, q.size(), rows, cols, args.grid.block_rows, args.grid.block_cols));
  }
  const int64_t grid_rows = CeilDiv(rows, args.grid.block_rows);
  const int64_t grid_cols = CeilDiv(cols, args.grid.block_cols);
  RS_RETURN_IF_ERROR(CheckGridShape(scale, grid_rows, grid_cols,
                                    fmt::format("a [{}, {}] weight in blocks of [{}, {}]", rows,
                                                cols, args.grid.block_rows, args.grid.block_cols)));
  if (!args.zero_points.empty() &&
      static_cast<int64_t>(args.zero_points.size()) != grid_rows * grid_cols) {
    return absl::InvalidArgumentError(
        fmt::format("zero points of \"{}\": {} values, expected {} x {}", scale.name,
                    args.zero_points.size(), grid_rows, grid_cols));
  }
  // A g_idx holding -1 is the initial value of one activation ordering never changed: the
  // reference reads such a weight in column order, as without g_idx.
  const bool column_order =
      args.g_idx.empty() || std::find(args.g_idx.begin(), args.g_idx.end(), -1) != args.g_idx.end();
  if (!column_order) {
    if (static_cast<int64_t>(args.g_idx.size()) != cols) {
      return absl::InvalidArgumentError(fmt::format("g_idx of \"{}\": {} values, expected {}",
                                                    scale.name, args.g_idx.size(), cols));
    }
    for (int64_t c = 0; c < cols; ++c) {
      if (args.g_idx[c] < 0 || args.g_idx[c] >= grid_cols) {
        return absl::InvalidArgumentError(
            fmt::format("g_idx of \"{}\": column {} names group {}, outside [0, {})", scale.name, c,
                        args.g_idx[c], grid_cols));
      }
    }
  }
  RS_ASSIGN_OR_RETURN(std::vector<float> scales, ReadScales(scale));
  std::vector<float> out(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t grid_row = (r / args.grid.block_rows) * grid_cols;
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t g = grid_row + (column_order ? c / args.grid.block_cols : args.g_idx[c]);
      const int zero = args.zero_points.empty() ? 0 : args.zero_points[g];
      out[r * cols + c] = static_cast<float>(q[r * cols + c] - zero) * scales[g];
    }
  }
  return out;
}

}  // namespace ringserve::quant
