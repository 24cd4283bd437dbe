#include "stage/model/safetensors.h"

#include <sys/mman.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>

#include "absl/status/status.h"
#include "common/bounded_file.h"
#include "common/json_limits.h"
#include "common/status_macros.h"
#include "fmt/format.h"
#include "nlohmann/json.hpp"

namespace ringserve {
namespace {

using Json = nlohmann::json;

// The official reader's cap; a larger header is almost surely garbage.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

absl::Status Invalid(const std::string& path, const std::string& what) {
  return absl::InvalidArgumentError(fmt::format("{}: {}", path, what));
}

// Something is at `path` (following symlinks): a file to open, or to refuse by name.
bool PathExists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

// Parses one header entry into `info` (offsets relative to the data section for now).
absl::Status ParseEntry(const std::string& path, const std::string& name, const Json& entry,
                        TensorInfo& info) {
  if (!entry.is_object())
    return Invalid(path, fmt::format("tensor \"{}\": entry is not an object", name));
  auto dtype = entry.find("dtype");
  auto shape = entry.find("shape");
  auto offsets = entry.find("data_offsets");
  if (dtype == entry.end() || !dtype->is_string()) {
    return Invalid(path, fmt::format("tensor \"{}\": missing or non-string \"dtype\"", name));
  }
  std::optional<DType> parsed = ParseDType(dtype->get<std::string>());
  if (!parsed) {
    return Invalid(path, fmt::format("tensor \"{}\": unsupported dtype \"{}\" (supported: F32, "
                                     "F16, BF16, F8_E4M3, F8_E8M0, I8, U8, I16, I32, I64)",
                                     name, dtype->get<std::string>()));
  }
  info.name = name;
  info.dtype = *parsed;
  if (shape == entry.end() || !shape->is_array()) {
    return Invalid(path, fmt::format("tensor \"{}\": missing or non-list \"shape\"", name));
  }
  uint64_t elements = 1;
  for (const Json& dim : *shape) {
    if (!dim.is_number_unsigned() && !(dim.is_number_integer() && dim.get<int64_t>() >= 0)) {
      return Invalid(path, fmt::format("tensor \"{}\": shape {} has a non-integer or negative "
                                       "dimension",
                                       name, shape->dump()));
    }
    const uint64_t d = dim.get<uint64_t>();
    if (d > (1ull << 40) || (d != 0 && elements > (1ull << 50) / d)) {
      return Invalid(path,
                     fmt::format("tensor \"{}\": shape {} is too large", name, shape->dump()));
    }
    elements *= d;
    info.shape.push_back(static_cast<int64_t>(d));
  }
  if (offsets == entry.end() || !offsets->is_array() || offsets->size() != 2 ||
      !(*offsets)[0].is_number_unsigned() || !(*offsets)[1].is_number_unsigned()) {
    return Invalid(path, fmt::format("tensor \"{}\": \"data_offsets\" must be two non-negative "
                                     "integers",
                                     name));
  }
  const uint64_t begin = (*offsets)[0].get<uint64_t>();
  const uint64_t end = (*offsets)[1].get<uint64_t>();
  if (end < begin) {
    return Invalid(path, fmt::format("tensor \"{}\": data_offsets [{}, {}] end before begin", name,
                                     begin, end));
  }
  const uint64_t expected = elements * DTypeSize(info.dtype);
  if (end - begin != expected) {
    return Invalid(path, fmt::format("tensor \"{}\": shape {} x {} needs {} bytes but "
                                     "data_offsets [{}, {}] span {}",
                                     name, shape->dump(), DTypeName(info.dtype), expected, begin,
                                     end, end - begin));
  }
  info.offset = begin;
  info.num_bytes = end - begin;
  return absl::OkStatus();
}

}  // namespace

int64_t TensorInfo::NumElements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string ShapeString(std::span<const int64_t> shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) out += ", ";
    out += std::to_string(shape[i]);
  }
  return out + "]";
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  // Never blocks on a FIFO put where a shard should be; refuses anything but a regular file.
  RS_ASSIGN_OR_RETURN(RegularFile opened, RegularFile::Open(path));
  const uint64_t size = opened.size_bytes();
  if (size < 8) {
    return Invalid(path,
                   fmt::format("file is {} bytes, too short for the 8-byte header length", size));
  }
  void* mapping = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, opened.fd(), 0);
  if (mapping == MAP_FAILED) {
    return Invalid(path, fmt::format("mmap failed: {}", std::strerror(errno)));
  }
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;
  file->data_ = static_cast<const uint8_t*>(mapping);
  file->size_ = size;

  uint64_t header_bytes = 0;
  for (int i = 7; i >= 0; --i) header_bytes = (header_bytes << 8) | file->data_[i];
  if (header_bytes > size - 8) {
    return Invalid(path, fmt::format("header length {} runs past the end of the file ({} bytes)",
                                     header_bytes, size));
  }
  if (header_bytes > kMaxHeaderBytes) {
    return Invalid(path, fmt::format("header length {} exceeds the {} byte limit", header_bytes,
                                     kMaxHeaderBytes));
  }
  const uint64_t data_start = 8 + header_bytes;
  const uint64_t data_bytes = size - data_start;
  // Error messages dump parts of the header, and nlohmann's dump recurses.
  RS_RETURN_IF_ERROR(CheckJsonDepth(
      std::string_view(reinterpret_cast<const char*>(file->data_ + 8), header_bytes), path));
  Json header;
  try {
    header = Json::parse(reinterpret_cast<const char*>(file->data_ + 8),
                         reinterpret_cast<const char*>(file->data_ + data_start));
  } catch (const Json::exception& e) {
    return Invalid(path, fmt::format("header is not valid JSON: {}", e.what()));
  }
  if (!header.is_object()) return Invalid(path, "header is not a JSON object");

  std::vector<const TensorInfo*> by_offset;
  try {
    for (auto it = header.begin(); it != header.end(); ++it) {
      if (it.key() == "__metadata__") {
        if (!it->is_object()) return Invalid(path, "\"__metadata__\" is not an object");
        for (auto m = it->begin(); m != it->end(); ++m) {
          if (!m->is_string()) {
            return Invalid(
                path, fmt::format("\"__metadata__\" value of \"{}\" is not a string", m.key()));
          }
          file->metadata_[m.key()] = m->get<std::string>();
        }
        continue;
      }
      TensorInfo info;
      RS_RETURN_IF_ERROR(ParseEntry(path, it.key(), *it, info));
      if (info.offset + info.num_bytes > data_bytes) {
        return Invalid(
            path, fmt::format("tensor \"{}\": data_offsets [{}, {}] outside the data "
                              "section of {} bytes",
                              info.name, info.offset, info.offset + info.num_bytes, data_bytes));
      }
      info.offset += data_start;
      file->tensors_[info.name] = std::move(info);
    }
  } catch (const Json::exception& e) {
    return Invalid(path, fmt::format("malformed header: {}", e.what()));
  }
  for (const auto& [name, info] : file->tensors_) by_offset.push_back(&info);
  std::sort(by_offset.begin(), by_offset.end(), [](const TensorInfo* a, const TensorInfo* b) {
    return a->offset != b->offset ? a->offset < b->offset : a->num_bytes < b->num_bytes;
  });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const TensorInfo* prev = by_offset[i - 1];
    const TensorInfo* cur = by_offset[i];
    // Empty tensors occupy no bytes and overlap nothing.
    if (cur->num_bytes > 0 && prev->num_bytes > 0 && cur->offset < prev->offset + prev->num_bytes) {
      return Invalid(path, fmt::format("tensors \"{}\" and \"{}\" have overlapping byte ranges",
                                       prev->name, cur->name));
    }
  }
  return file;
}

SafetensorsFile::~SafetensorsFile() {
  if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
}

const TensorInfo* SafetensorsFile::Find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

std::span<const uint8_t> SafetensorsFile::Bytes(const TensorInfo& info) const {
  return {data_ + info.offset, info.num_bytes};
}

absl::StatusOr<std::unique_ptr<SafetensorsModel>> SafetensorsModel::Open(
    const std::string& model_dir) {
  std::unique_ptr<SafetensorsModel> model(new SafetensorsModel());
  model->dir_ = model_dir;
  const std::string single = model_dir + "/model.safetensors";
  const std::string index_path = model_dir + "/model.safetensors.index.json";
  // Whatever is at the path (a FIFO, a directory) is opened and refused with its name, rather
  // than passed over as absent.
  if (PathExists(single)) {
    RS_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file, SafetensorsFile::Open(single));
    for (const auto& [name, info] : file->tensors()) model->weight_map_[name] = "model.safetensors";
    model->files_["model.safetensors"] = std::move(file);
    return model;
  }
  if (!PathExists(index_path)) {
    return absl::NotFoundError(
        fmt::format("{}: neither model.safetensors nor "
                    "model.safetensors.index.json found",
                    model_dir));
  }
  RS_ASSIGN_OR_RETURN(const std::string text, ReadBoundedFile(index_path, kMaxWeightIndexBytes));
  RS_RETURN_IF_ERROR(CheckJsonDepth(text, index_path));
  Json index;
  try {
    index = Json::parse(text);
  } catch (const Json::exception& e) {
    return Invalid(index_path, fmt::format("not valid JSON: {}", e.what()));
  }
  auto map = index.is_object() ? index.find("weight_map") : index.end();
  if (map == index.end() || !map->is_object()) {
    return Invalid(index_path, "missing \"weight_map\" object");
  }
  for (auto it = map->begin(); it != map->end(); ++it) {
    if (!it->is_string()) {
      return Invalid(index_path,
                     fmt::format("weight_map entry of \"{}\" is not a string", it.key()));
    }
    const std::string file = it->get<std::string>();
    if (file.empty() || file.find('/') != std::string::npos || file == "." || file == "..") {
      return Invalid(index_path, fmt::format("weight_map entry of \"{}\" names \"{}\", not a file "
                                             "in the model directory",
                                             it.key(), file));
    }
    model->weight_map_[it.key()] = file;
  }
  return model;
}

bool SafetensorsModel::Contains(const std::string& name) const {
  return weight_map_.count(name) > 0;
}

std::vector<std::string> SafetensorsModel::TensorNames() const {
  std::vector<std::string> names;
  names.reserve(weight_map_.size());
  for (const auto& [name, file] : weight_map_) names.push_back(name);
  return names;
}

absl::StatusOr<const SafetensorsFile*> SafetensorsModel::FileFor(const std::string& name) {
  auto it = weight_map_.find(name);
  if (it == weight_map_.end()) {
    return absl::NotFoundError(
        fmt::format("{}: tensor \"{}\" not found in the checkpoint", dir_, name));
  }
  auto file = files_.find(it->second);
  if (file == files_.end()) {
    RS_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> opened,
                        SafetensorsFile::Open(dir_ + "/" + it->second));
    file = files_.emplace(it->second, std::move(opened)).first;
  }
  return file->second.get();
}

absl::StatusOr<TensorView> SafetensorsModel::GetAnyShape(const std::string& name) {
  RS_ASSIGN_OR_RETURN(const SafetensorsFile* file, FileFor(name));
  const TensorInfo* info = file->Find(name);
  if (info == nullptr) {
    return absl::NotFoundError(
        fmt::format("{}: tensor \"{}\" (listed in the index) not found in "
                    "the file",
                    file->path(), name));
  }
  return TensorView{.info = info, .bytes = file->Bytes(*info), .file = file->path()};
}

absl::StatusOr<TensorView> SafetensorsModel::Get(const std::string& name,
                                                 std::span<const int64_t> expected_shape) {
  RS_ASSIGN_OR_RETURN(TensorView view, GetAnyShape(name));
  const TensorInfo* info = view.info;
  if (!std::equal(info->shape.begin(), info->shape.end(), expected_shape.begin(),
                  expected_shape.end())) {
    return Invalid(view.file, fmt::format("tensor \"{}\" has shape {}, expected {}", name,
                                          ShapeString(info->shape), ShapeString(expected_shape)));
  }
  return view;
}

absl::StatusOr<std::vector<float>> SafetensorsModel::ReadFloat(
    const std::string& name, std::span<const int64_t> expected_shape) {
  RS_ASSIGN_OR_RETURN(TensorView view, Get(name, expected_shape));
  if (!IsFloatDType(view.info->dtype)) {
    return Invalid(view.file,
                   fmt::format("tensor \"{}\" has dtype {}, expected F32, F16 or BF16 (a "
                               "quantized checkpoint needs its quantization_config)",
                               name, DTypeName(view.info->dtype)));
  }
  std::vector<float> out(static_cast<size_t>(view.info->NumElements()));
  ConvertToFloat(view.info->dtype, view.bytes.data(), out.size(), out.data());
  return out;
}

std::vector<std::string> SafetensorsModel::OpenedFiles() const {
  std::vector<std::string> paths;
  for (const auto& [name, file] : files_) paths.push_back(file->path());
  return paths;
}

}  // namespace ringserve
