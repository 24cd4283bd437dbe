#include "stage/model/quant/quant_tensor.h"

#include <algorithm>

#include "fmt/format.h"
#include "fmt/ranges.h"

namespace ringserve::quant {
namespace {

std::string ShapeText(std::span<const int64_t> shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

}  // namespace

int64_t QTensor::NumElements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

absl::Status CheckShape(const QTensor& t, std::span<const int64_t> shape) {
  if (!std::equal(t.shape.begin(), t.shape.end(), shape.begin(), shape.end())) {
    return absl::InvalidArgumentError(fmt::format("tensor \"{}\" has shape {}, expected {}", t.name,
                                                  ShapeText(t.shape), ShapeText(shape)));
  }
  return absl::OkStatus();
}

absl::Status CheckDType(const QTensor& t, std::initializer_list<DType> allowed) {
  if (std::find(allowed.begin(), allowed.end(), t.dtype) != allowed.end()) {
    return absl::OkStatus();
  }
  std::vector<std::string_view> names;
  for (DType d : allowed) names.push_back(DTypeName(d));
  return absl::InvalidArgumentError(fmt::format("tensor \"{}\" has dtype {}, expected {}", t.name,
                                                DTypeName(t.dtype), fmt::join(names, " or ")));
}

absl::Status CheckGridShape(const QTensor& scale, int64_t grid_rows, int64_t grid_cols,
                            std::string_view what) {
  const std::vector<int64_t>& s = scale.shape;
  const bool ok = (s.size() == 2 && s[0] == grid_rows && s[1] == grid_cols) ||
                  (grid_cols == 1 && s.size() == 1 && s[0] == grid_rows) ||
                  (grid_rows == 1 && grid_cols == 1 && (s.empty() || (s.size() == 1 && s[0] == 1)));
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(
      fmt::format("tensor \"{}\" has shape {}, expected [{}, {}] for {}", scale.name, ShapeText(s),
                  grid_rows, grid_cols, what));
}

absl::StatusOr<std::vector<float>> ReadScales(const QTensor& t) {
  const int64_t n = t.NumElements();
  std::vector<float> out(static_cast<size_t>(n));
  if (t.dtype == DType::kF8E8M0) {
    for (int64_t i = 0; i < n; ++i) out[i] = E8M0ToFloat(t.bytes[i]);
    return out;
  }
  if (!IsFloatDType(t.dtype)) {
    return absl::InvalidArgumentError(
        fmt::format("scale tensor \"{}\" has dtype {}, expected F32, F16, BF16 or F8_E8M0", t.name,
                    DTypeName(t.dtype)));
  }
  ConvertToFloat(t.dtype, t.bytes.data(), out.size(), out.data());
  return out;
}

absl::StatusOr<std::vector<int64_t>> ReadIntegers(const QTensor& t) {
  const int64_t n = t.NumElements();
  std::vector<int64_t> out(static_cast<size_t>(n));
  const uint8_t* p = t.bytes.data();
  switch (t.dtype) {
    case DType::kI8:
      for (int64_t i = 0; i < n; ++i) out[i] = static_cast<int8_t>(p[i]);
      return out;
    case DType::kU8:
      for (int64_t i = 0; i < n; ++i) out[i] = p[i];
      return out;
    case DType::kI16:
      for (int64_t i = 0; i < n; ++i) {
        int16_t v;
        std::memcpy(&v, p + 2 * i, sizeof(v));
        out[i] = v;
      }
      return out;
    case DType::kI32:
      for (int64_t i = 0; i < n; ++i) {
        int32_t v;
        std::memcpy(&v, p + 4 * i, sizeof(v));
        out[i] = v;
      }
      return out;
    case DType::kI64:
      for (int64_t i = 0; i < n; ++i) std::memcpy(&out[i], p + 8 * i, sizeof(int64_t));
      return out;
    default:
      return absl::InvalidArgumentError(fmt::format(
          "tensor \"{}\" has dtype {}, expected an integer type (I8, U8, I16, I32, I64)", t.name,
          DTypeName(t.dtype)));
  }
}

}  // namespace ringserve::quant
