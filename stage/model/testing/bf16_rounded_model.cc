#include "stage/model/testing/bf16_rounded_model.h"

#include <cstring>
#include <filesystem>
#include <random>
#include <vector>

#include "common/status_macros.h"
#include "fmt/format.h"
#include "stage/model/safetensors.h"
#include "stage/model/testing/safetensors_writer.h"

namespace ringserve::testing {
namespace {

// Nearest (ties to even) when `random` is null, else up with probability (v - down) / ulp.
float RoundToBf16(float v, std::mt19937_64* random) {
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  if ((bits & 0x7f800000u) != 0x7f800000u) {
    if (random == nullptr) {
      bits += 0x7fffu + ((bits >> 16) & 1u);
    } else {
      bits += static_cast<uint32_t>((*random)() & 0xffffu);
    }
  }
  bits &= 0xffff0000u;
  std::memcpy(&v, &bits, 4);
  return v;
}

absl::Status WriteRoundedFile(const std::string& path, const std::string& to,
                              uint64_t stochastic_seed, std::mt19937_64& random) {
  RS_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file, SafetensorsFile::Open(path));
  std::vector<TensorToWrite> tensors;
  for (const auto& [name, info] : file->tensors()) {
    if (info.dtype == DType::kBF16 && stochastic_seed > 0) {
      // Already bf16: noise of the same size instead (uniform within half a bf16 step, fp32).
      std::vector<float> values(info.NumElements());
      const uint8_t* bytes = file->Bytes(info).data();
      for (size_t i = 0; i < values.size(); ++i) {
        uint32_t bits = (uint32_t{bytes[2 * i + 1]} << 24) | (uint32_t{bytes[2 * i]} << 16);
        if ((bits & 0x7f800000u) != 0x7f800000u && (bits & 0x7fffffffu) != 0) {
          bits = bits - 0x8000u + static_cast<uint32_t>(random() & 0xffffu);
        }
        std::memcpy(&values[i], &bits, 4);
      }
      tensors.push_back(
          {.name = name, .dtype = DType::kF32, .shape = info.shape, .values = values});
      continue;
    }
    if (info.dtype != DType::kF32) {  // bf16 already, or a storage type: copied as it is
      const auto bytes = file->Bytes(info);
      tensors.push_back({.name = name,
                         .dtype = info.dtype,
                         .shape = info.shape,
                         .values = {},
                         .raw = std::string(bytes.begin(), bytes.end())});
      continue;
    }
    std::vector<float> values(info.NumElements());
    std::memcpy(values.data(), file->Bytes(info).data(), values.size() * sizeof(float));
    for (float& v : values) v = RoundToBf16(v, stochastic_seed > 0 ? &random : nullptr);
    tensors.push_back({.name = name, .dtype = DType::kF32, .shape = info.shape, .values = values});
  }
  return WriteFile(to, SafetensorsBytes(tensors));
}

}  // namespace

absl::Status WriteBf16RoundedModel(const std::string& model_dir, const std::string& out_dir,
                                   uint64_t stochastic_seed) {
  std::mt19937_64 random(stochastic_seed);
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec) return absl::InternalError(fmt::format("cannot create {}: {}", out_dir, ec.message()));
  for (const auto& entry : fs::directory_iterator(model_dir)) {
    const std::string name = entry.path().filename().string();
    const std::string to = (fs::path(out_dir) / name).string();
    if (name.ends_with(".json")) RS_RETURN_IF_ERROR(CopyFile(entry.path().string(), to));
    if (name.ends_with(".safetensors")) {
      RS_RETURN_IF_ERROR(WriteRoundedFile(entry.path().string(), to, stochastic_seed, random));
    }
  }
  return absl::OkStatus();
}

}  // namespace ringserve::testing
