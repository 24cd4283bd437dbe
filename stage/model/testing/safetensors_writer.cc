#include "stage/model/testing/safetensors_writer.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "fmt/format.h"
#include "nlohmann/json.hpp"

namespace ringserve::testing {

std::string SafetensorsBytes(const std::vector<TensorToWrite>& tensors) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  header["__metadata__"] = {{"format", "pt"}};
  std::string data;
  for (const TensorToWrite& t : tensors) {
    const size_t begin = data.size();
    data += t.raw;
    for (float value : t.values) {
      switch (t.dtype) {
        case DType::kF32:
          data.append(reinterpret_cast<const char*>(&value), 4);
          break;
        case DType::kF16: {
          const uint16_t bits = FloatToHalf(value);
          data.append(reinterpret_cast<const char*>(&bits), 2);
          break;
        }
        case DType::kBF16: {
          const uint16_t bits = FloatToBF16(value);
          data.append(reinterpret_cast<const char*>(&bits), 2);
          break;
        }
        default:  // storage types are written from `raw`
          break;
      }
    }
    header[t.name] = {{"dtype", std::string(DTypeName(t.dtype))},
                      {"shape", t.shape},
                      {"data_offsets", {begin, data.size()}}};
  }
  std::string text = header.dump();
  while (text.size() % 8 != 0) text += ' ';
  return RawSafetensorsBytes(text, data);
}

std::string RawSafetensorsBytes(const std::string& header_json, const std::string& data,
                                uint64_t header_length_override) {
  const uint64_t length =
      header_length_override == UINT64_MAX ? header_json.size() : header_length_override;
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((length >> (8 * i)) & 0xff);
  return out + header_json + data;
}

absl::Status WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) return absl::InternalError(fmt::format("cannot write {}", path));
  return absl::OkStatus();
}

absl::Status CopyFile(const std::string& from, const std::string& to) {
  std::error_code error;
  std::filesystem::copy_file(from, to, std::filesystem::copy_options::overwrite_existing, error);
  if (error)
    return absl::InternalError(fmt::format("copy {} -> {}: {}", from, to, error.message()));
  return absl::OkStatus();
}

}  // namespace ringserve::testing
