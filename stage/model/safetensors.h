// Reading Hugging Face safetensors checkpoints: one file (`model.safetensors`) or shards named by
// `model.safetensors.index.json`. Files are memory-mapped read-only; a header is validated in
// full when its file is opened (8-byte length inside the file, JSON nested at most kMaxJsonDepth
// deep, known dtypes, shape x dtype size == byte range, ranges inside the data section and not
// overlapping). Every violation is an InvalidArgument (or NotFound for a missing file/tensor)
// naming the file and the tensor; malformed input never crashes the process.
//
// Thread-safety: a SafetensorsFile is immutable after Open and safe to read from any thread.
// SafetensorsModel opens shards lazily and is not thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/dtype.h"

namespace ringserve {

struct TensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  uint64_t offset = 0;  // byte offset of the data from the start of the file
  uint64_t num_bytes = 0;

  int64_t NumElements() const;
};

// "[2, 3]"; for error messages.
std::string ShapeString(std::span<const int64_t> shape);

// One validated, memory-mapped .safetensors file. The mapping lives as long as the object.
class SafetensorsFile {
 public:
  // Maps and validates `path` (common/bounded_file.h's RegularFile: never blocks on a FIFO).
  // NotFound if it does not exist, InvalidArgument if it is not a regular file or malformed.
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  // All tensors, keyed by name.
  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
  // "__metadata__" string pairs (empty when absent).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // nullptr when absent.
  const TensorInfo* Find(const std::string& name) const;
  // The tensor's raw little-endian bytes inside the mapping (no alignment guarantee).
  std::span<const uint8_t> Bytes(const TensorInfo& info) const;

 private:
  SafetensorsFile() = default;

  std::string path_;
  const uint8_t* data_ = nullptr;  // the whole mapped file
  uint64_t size_ = 0;
  std::map<std::string, TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

// A tensor found in a model directory: its header entry and raw bytes (valid while the
// SafetensorsModel lives).
struct TensorView {
  const TensorInfo* info = nullptr;
  std::span<const uint8_t> bytes;
  std::string file;  // path of the file holding it
};

// The weights of a Hugging Face model directory. Uses `model.safetensors` when present, else
// `model.safetensors.index.json` (its "weight_map" names the shard of every tensor). Shards are
// mapped lazily, on the first Get of a tensor they hold, so a slice maps only what it reads.
class SafetensorsModel {
 public:
  // NotFound when the directory has neither file; InvalidArgument for a malformed index or
  // (single-file case) a malformed file, and when either is there but is not a regular file
  // (a FIFO, a device, a directory) or the index exceeds kMaxWeightIndexBytes.
  static absl::StatusOr<std::unique_ptr<SafetensorsModel>> Open(const std::string& model_dir);

  // Whether the checkpoint names this tensor (from the index or the single file's header).
  bool Contains(const std::string& name) const;
  // All tensor names the checkpoint declares, sorted.
  std::vector<std::string> TensorNames() const;

  // The tensor `name`, checked to have `expected_shape`. NotFound (naming the tensor and file)
  // if absent; InvalidArgument if its shard is malformed or the shape differs.
  absl::StatusOr<TensorView> Get(const std::string& name, std::span<const int64_t> expected_shape);
  // The tensor `name` whatever its shape (the caller checks it). NotFound if absent.
  absl::StatusOr<TensorView> GetAnyShape(const std::string& name);
  // Get, then converted to fp32 (from F32, F16 or BF16), row-major. InvalidArgument for any other
  // dtype (quantized storage is read through stage/model/quant).
  absl::StatusOr<std::vector<float>> ReadFloat(const std::string& name,
                                               std::span<const int64_t> expected_shape);

  // Paths of the files mapped so far (for tests and load progress).
  std::vector<std::string> OpenedFiles() const;

 private:
  SafetensorsModel() = default;
  absl::StatusOr<const SafetensorsFile*> FileFor(const std::string& name);

  std::string dir_;
  std::map<std::string, std::string> weight_map_;  // tensor -> file name (sharded case)
  std::map<std::string, std::unique_ptr<SafetensorsFile>> files_;  // file name -> mapping
};

}  // namespace ringserve
