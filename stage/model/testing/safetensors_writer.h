// Test helpers: write safetensors files (valid or deliberately broken) and temp directories.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/dtype.h"
#include "common/testing/temp_dir.h"

namespace ringserve::testing {

struct TensorToWrite {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::vector<float> values;  // converted to `dtype` when written; size = product of shape
  // For storage dtypes (integers, FP8): the little-endian bytes as written, used instead of
  // `values`; size = product of shape x DTypeSize(dtype).
  std::string raw = {};
};

// The bytes of a valid safetensors file holding `tensors` in order (header padded to 8 bytes).
std::string SafetensorsBytes(const std::vector<TensorToWrite>& tensors);
// A raw file: 8-byte little-endian header length, `header_json` as given, then `data`.
std::string RawSafetensorsBytes(const std::string& header_json, const std::string& data,
                                uint64_t header_length_override = UINT64_MAX);

absl::Status WriteFile(const std::string& path, const std::string& bytes);
absl::Status CopyFile(const std::string& from, const std::string& to);

}  // namespace ringserve::testing
