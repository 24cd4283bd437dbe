#include "stage/model/quant/packed_matrix.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

#include "absl/status/status.h"
#include "common/dtype.h"
#include "common/parallel_ranges.h"
#include "common/status_macros.h"
#include "fmt/format.h"
#include "stage/model/quant/mxfp4.h"

namespace ringserve::quant {
namespace {

// The code among `count` sign-less magnitudes (ascending with the code) nearest to |v|, ties to
// the even code; saturates at the largest.
template <typename Magnitude>
uint8_t NearestMagnitude(float a, int count, Magnitude magnitude) {
  int lo = 0, hi = count - 1;
  if (!(a > 0)) return 0;  // zero and NaN
  if (a >= magnitude(hi)) return static_cast<uint8_t>(hi);
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    (magnitude(mid) <= a ? lo : hi) = mid;
  }
  const float dl = a - magnitude(lo), dh = magnitude(hi) - a;
  if (dl < dh) return static_cast<uint8_t>(lo);
  if (dh < dl) return static_cast<uint8_t>(hi);
  return static_cast<uint8_t>(lo % 2 == 0 ? lo : hi);
}

float DecodeFloat(PackedFormat format, uint8_t code) {
  return format == PackedFormat::kFp8 ? Fp8E4M3ToFloat(code) : kFp4Values[code & 0xf];
}

int64_t RowBytes(PackedFormat format, int64_t cols) { return cols * PackedBits(format) / 8; }

void PutCode(PackedMatrix& m, int64_t r, int64_t c, uint8_t code) {
  if (PackedBits(m.format) == 8) {
    m.codes[r * m.cols + c] = code;
    return;
  }
  uint8_t& byte = m.codes[r * RowBytes(m.format, m.cols) + c / 2];
  byte = c % 2 == 0 ? static_cast<uint8_t>((byte & 0xf0) | code)
                    : static_cast<uint8_t>((byte & 0x0f) | (code << 4));
}

PackedMatrix Empty(PackedFormat format, int64_t rows, int64_t cols, int64_t group_cols) {
  PackedMatrix m{.format = format, .rows = rows, .cols = cols, .group_cols = group_cols};
  m.codes.assign(rows * RowBytes(format, cols), 0);
  m.scales.assign(rows * m.groups(), 0.0f);
  if (IsIntegerFormat(format)) m.zeros.assign(rows * m.groups(), 0.0f);
  return m;
}

absl::Status CheckSizes(int64_t values, int64_t rows, int64_t cols, PackedFormat format,
                        int64_t group_cols) {
  if (rows <= 0 || cols <= 0 || group_cols <= 0 || values != rows * cols ||
      (PackedBits(format) == 4 && cols % 2 != 0)) {
    return absl::InvalidArgumentError(
        fmt::format("cannot pack {} values as a [{}, {}] {} matrix with groups of {} columns",
                    values, rows, cols, PackedFormatName(format), group_cols));
  }
  return absl::OkStatus();
}

}  // namespace

std::string_view PackedFormatName(PackedFormat format) {
  switch (format) {
    case PackedFormat::kInt4:
      return "int4";
    case PackedFormat::kInt8:
      return "int8";
    case PackedFormat::kFp8:
      return "fp8";
    case PackedFormat::kFp4:
      return "fp4";
  }
  return "?";
}

absl::StatusOr<PackedFormat> ParsePackedFormat(std::string_view name) {
  for (PackedFormat f :
       {PackedFormat::kInt4, PackedFormat::kInt8, PackedFormat::kFp8, PackedFormat::kFp4}) {
    if (PackedFormatName(f) == name) return f;
  }
  return absl::InvalidArgumentError(
      fmt::format("unknown quantized format \"{}\" (int4, int8, fp8 or fp4)", name));
}

int PackedBits(PackedFormat format) {
  return format == PackedFormat::kInt4 || format == PackedFormat::kFp4 ? 4 : 8;
}

bool IsIntegerFormat(PackedFormat format) {
  return format == PackedFormat::kInt4 || format == PackedFormat::kInt8;
}

int PackedChunk(PackedFormat format) { return 128 / PackedBits(format); }

uint8_t PackedMatrix::Code(int64_t r, int64_t c) const {
  if (PackedBits(format) == 8) return codes[r * cols + c];
  const uint8_t byte = codes[r * RowBytes(format, cols) + c / 2];
  return c % 2 == 0 ? byte & 0xf : byte >> 4;
}

float PackedMatrix::Value(int64_t r, int64_t c) const {
  const int64_t g = r * groups() + c / group_cols;
  const uint8_t code = Code(r, c);
  if (IsIntegerFormat(format)) return (static_cast<float>(code) - zeros[g]) * scales[g];
  return DecodeFloat(format, code) * scales[g];
}

uint8_t NearestE4m3(float v) {
  // From the value's bits (loaders call this for every weight of an FP8 checkpoint): the
  // magnitude codes 0x00..0x7e (0x7f is NaN) ascend with their values, subnormals m 2^-9
  // (m < 8) below 2^-6, then 8 values per power of two; nearest, ties to the even code,
  // saturating at 448 (0x7e). Tested against the search over every code's value.
  const float a = std::fabs(v);
  uint8_t m = 0;
  if (!(a > 0)) {
    m = 0;  // zero and NaN
  } else if (a >= 448.0f) {
    m = 0x7e;
  } else if (a < 0.015625f) {  // 2^-6: m 2^-9, the scaling exact; ties to even (m is the code)
    m = static_cast<uint8_t>(std::nearbyint(a * 512.0f));
  } else {
    uint32_t bits = 0;
    std::memcpy(&bits, &a, 4);
    int exponent = static_cast<int>(bits >> 23) - 127;  // -6 .. 8
    uint32_t top = (bits >> 20) & 7;                    // the 3 mantissa bits kept
    const uint32_t rest = bits & 0xfffff;
    if (rest > 0x80000 || (rest == 0x80000 && (top & 1) != 0)) {
      if (++top == 8) {
        top = 0;
        ++exponent;
      }
    }
    m = static_cast<uint8_t>(std::min<uint32_t>(((exponent + 7) << 3) | top, 0x7e));
  }
  return static_cast<uint8_t>(std::signbit(v) && m != 0 ? m | 0x80 : m);
}

uint8_t NearestE2m1(float v) {
  const uint8_t m = NearestMagnitude(std::fabs(v), 8, [](int c) { return kFp4Values[c]; });
  return static_cast<uint8_t>(std::signbit(v) && m != 0 ? m | 0x8 : m);
}

absl::StatusOr<PackedMatrix> PackExact(std::span<const float> w, int64_t rows, int64_t cols,
                                       PackedFormat format, int64_t group_cols,
                                       std::span<const float> scales) {
  if (absl::Status s = CheckSizes(static_cast<int64_t>(w.size()), rows, cols, format, group_cols);
      !s.ok()) {
    return s;
  }
  PackedMatrix m = Empty(format, rows, cols, group_cols);
  const int64_t groups = m.groups();
  if (static_cast<int64_t>(scales.size()) != rows * groups) {
    return absl::InvalidArgumentError(
        fmt::format("{} scales for a [{}, {}] grid", scales.size(), rows, groups));
  }
  const int bits = PackedBits(format);
  const float max_code = static_cast<float>((1 << bits) - 1);
  const float half = static_cast<float>(1 << (bits - 1));
  std::array<float, 256> values{};  // a float format's codes (DecodeFloat), looked up per value
  if (!IsIntegerFormat(format)) {
    for (int b = 0; b < 256; ++b) values[b] = DecodeFloat(format, static_cast<uint8_t>(b));
  }
  // Rows in parallel (each row's codes start at a byte of their own): a checkpoint load packs
  // every weight this way.
  const auto pack_rows = [&](int64_t row_begin, int64_t row_end) -> absl::Status {
    std::vector<float> n(group_cols);
    for (int64_t r = row_begin; r < row_end; ++r) {
      for (int64_t g = 0; g < groups; ++g) {
        const int64_t c0 = g * group_cols, c1 = std::min(cols, c0 + group_cols);
        const float s = scales[r * groups + g];
        m.scales[r * groups + g] = s;
        const float* row = w.data() + r * cols;
        auto not_exact = [&](int64_t c) {
          return absl::FailedPreconditionError(
              fmt::format("value {} at [{}, {}] is not an exact {} value times the scale {}",
                          row[c], r, c, PackedFormatName(format), s));
        };
        if (s == 0 || !std::isfinite(s)) {
          for (int64_t c = c0; c < c1; ++c) {
            if (row[c] != 0) return not_exact(c);
          }
          continue;
        }
        if (!IsIntegerFormat(format)) {
          for (int64_t c = c0; c < c1; ++c) {
            const uint8_t code =
                format == PackedFormat::kFp8 ? NearestE4m3(row[c] / s) : NearestE2m1(row[c] / s);
            if (values[code] * s != row[c]) return not_exact(c);
            PutCode(m, r, c, code);
          }
          continue;
        }
        float lo = 0, hi = 0;
        for (int64_t c = c0; c < c1; ++c) {
          n[c - c0] = std::nearbyint(row[c] / s);
          lo = std::min(lo, n[c - c0]);
          hi = std::max(hi, n[c - c0]);
        }
        if (hi - lo > max_code) return not_exact(c0);
        // Signed codes around the middle when they fit there (symmetric checkpoints), else from
        // the group's minimum.
        const float zero = (lo >= -half && hi <= half - 1) ? half : -lo;
        m.zeros[r * groups + g] = zero;
        for (int64_t c = c0; c < c1; ++c) {
          const float code = n[c - c0] + zero;
          if (code < 0 || code > max_code || (code - zero) * s != row[c]) return not_exact(c);
          PutCode(m, r, c, static_cast<uint8_t>(code));
        }
      }
    }
    return absl::OkStatus();
  };
  RS_RETURN_IF_ERROR(ParallelRanges(rows, std::max<int64_t>(1, (1 << 16) / cols), pack_rows));
  return m;
}

PackedMatrix QuantizeMatrix(std::span<const float> w, int64_t rows, int64_t cols,
                            PackedFormat format, int64_t group_cols) {
  PackedMatrix m = Empty(format, rows, cols, group_cols);
  const int64_t groups = m.groups();
  const float max_code = static_cast<float>((1 << PackedBits(format)) - 1);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t c0 = g * group_cols, c1 = std::min(cols, c0 + group_cols);
      const float* row = w.data() + r * cols;
      float lo = 0, hi = 0, amax = 0;
      for (int64_t c = c0; c < c1; ++c) {
        lo = std::min(lo, row[c]);
        hi = std::max(hi, row[c]);
        amax = std::max(amax, std::fabs(row[c]));
      }
      const int64_t at = r * groups + g;
      if (amax == 0) continue;
      if (IsIntegerFormat(format)) {
        const float s = (hi - lo) / max_code;
        const float zero = std::clamp(std::nearbyint(-lo / s), 0.0f, max_code);
        m.scales[at] = s;
        m.zeros[at] = zero;
        for (int64_t c = c0; c < c1; ++c) {
          const float code = std::clamp(std::nearbyint(row[c] / s) + zero, 0.0f, max_code);
          PutCode(m, r, c, static_cast<uint8_t>(code));
        }
        continue;
      }
      const float s = format == PackedFormat::kFp8
                          ? amax / 448.0f
                          : std::exp2(std::ceil(std::log2(amax / 6.0f)));  // e8m0
      m.scales[at] = s;
      for (int64_t c = c0; c < c1; ++c) {
        PutCode(m, r, c,
                format == PackedFormat::kFp8 ? NearestE4m3(row[c] / s) : NearestE2m1(row[c] / s));
      }
    }
  }
  return m;
}

std::vector<float> UnpackMatrix(const PackedMatrix& m) {
  std::vector<float> out(m.rows * m.cols);
  for (int64_t r = 0; r < m.rows; ++r) {
    for (int64_t c = 0; c < m.cols; ++c) out[r * m.cols + c] = m.Value(r, c);
  }
  return out;
}

absl::StatusOr<PackedMatrix> StackRows(std::span<const PackedMatrix> parts) {
  if (parts.empty()) return absl::InvalidArgumentError("no matrices to stack");
  PackedMatrix out{.format = parts[0].format,
                   .rows = 0,
                   .cols = parts[0].cols,
                   .group_cols = parts[0].group_cols};
  for (const PackedMatrix& p : parts) {
    if (p.format != out.format || p.cols != out.cols || p.group_cols != out.group_cols) {
      return absl::InvalidArgumentError(fmt::format(
          "cannot stack a {} [{}, {}] matrix with groups of {} onto {} [., {}] with groups of {}",
          PackedFormatName(p.format), p.rows, p.cols, p.group_cols, PackedFormatName(out.format),
          out.cols, out.group_cols));
    }
    out.rows += p.rows;
    out.codes.insert(out.codes.end(), p.codes.begin(), p.codes.end());
    out.scales.insert(out.scales.end(), p.scales.begin(), p.scales.end());
    out.zeros.insert(out.zeros.end(), p.zeros.begin(), p.zeros.end());
  }
  return out;
}

absl::StatusOr<PackedMatrix> SelectRows(const PackedMatrix& m, std::span<const int64_t> rows) {
  PackedMatrix out{.format = m.format,
                   .rows = static_cast<int64_t>(rows.size()),
                   .cols = m.cols,
                   .group_cols = m.group_cols};
  const int64_t row_bytes = m.cols * PackedBits(m.format) / 8, groups = m.groups();
  for (const int64_t r : rows) {
    if (r < 0 || r >= m.rows) {
      return absl::InvalidArgumentError(fmt::format("row {} of a {}-row matrix", r, m.rows));
    }
    const auto take = [&](const auto& from, auto& to, int64_t width) {
      to.insert(to.end(), from.begin() + r * width, from.begin() + (r + 1) * width);
    };
    take(m.codes, out.codes, row_bytes);
    take(m.scales, out.scales, groups);
    if (!m.zeros.empty()) take(m.zeros, out.zeros, groups);
  }
  return out;
}

}  // namespace ringserve::quant
