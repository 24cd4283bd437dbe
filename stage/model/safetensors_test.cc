#include "stage/model/safetensors.h"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <set>

#include "common/testing/fifo_watchdog.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "ring/model_config.h"
#include "stage/model/slice_weights.h"
#include "stage/model/testing/safetensors_writer.h"

namespace ringserve {
namespace {

using ::testing::HasSubstr;
using testing::RawSafetensorsBytes;
using testing::SafetensorsBytes;
using testing::TempDir;
using testing::TensorToWrite;
using testing::WriteFile;

std::vector<TensorToWrite> SmallTensors() {
  return {
      {.name = "a", .dtype = DType::kF32, .shape = {2, 3}, .values = {1, 2, 3, 4, 5, -6}},
      {.name = "b", .dtype = DType::kBF16, .shape = {2}, .values = {1.5f, -0.25f}},
      {.name = "c", .dtype = DType::kF16, .shape = {1, 2}, .values = {0.5f, 3.0f}},
  };
}

// Opens `bytes` written as a file and returns the status.
absl::Status OpenBytes(const TempDir& dir, const std::string& bytes) {
  const std::string path = dir.path() + "/model.safetensors";
  EXPECT_TRUE(WriteFile(path, bytes).ok());
  return SafetensorsFile::Open(path).status();
}

void ExpectInvalid(const absl::Status& status, const std::string& message) {
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr(message));
  EXPECT_THAT(std::string(status.message()), HasSubstr("model.safetensors"));
}

TEST(SafetensorsTest, ReadsF32Bf16F16AndMetadata) {
  TempDir dir;
  ASSERT_TRUE(WriteFile(dir.path() + "/model.safetensors", SafetensorsBytes(SmallTensors())).ok());
  auto model = SafetensorsModel::Open(dir.path());
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->TensorNames(), (std::vector<std::string>{"a", "b", "c"}));
  const int64_t a_shape[] = {2, 3};
  auto a = (*model)->ReadFloat("a", a_shape);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(*a, (std::vector<float>{1, 2, 3, 4, 5, -6}));
  const int64_t b_shape[] = {2};
  auto b = (*model)->ReadFloat("b", b_shape);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(*b, (std::vector<float>{1.5f, -0.25f}));
  const int64_t c_shape[] = {1, 2};
  auto c = (*model)->Get("c", c_shape);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->info->dtype, DType::kF16);
  EXPECT_EQ(c->bytes.size(), 4u);
  auto c_float = (*model)->ReadFloat("c", c_shape);
  EXPECT_EQ(*c_float, (std::vector<float>{0.5f, 3.0f}));

  auto file = SafetensorsFile::Open(dir.path() + "/model.safetensors");
  ASSERT_TRUE(file.ok());
  EXPECT_EQ((*file)->metadata().at("format"), "pt");
}

TEST(SafetensorsTest, TruncatedFile) {
  TempDir dir;
  const std::string good = SafetensorsBytes(SmallTensors());
  ExpectInvalid(OpenBytes(dir, good.substr(0, good.size() - 3)),
                "tensor \"c\": data_offsets [28, 32] outside the data section of 29 bytes");
  ExpectInvalid(OpenBytes(dir, good.substr(0, 5)), "too short for the 8-byte header length");
  // Every truncation is an error, never a crash; only the whole file opens.
  for (size_t n = 0; n < good.size(); ++n) {
    EXPECT_FALSE(OpenBytes(dir, good.substr(0, n)).ok()) << "length " << n;
  }
  EXPECT_TRUE(OpenBytes(dir, good).ok());
}

TEST(SafetensorsTest, HeaderLengthPastTheEnd) {
  TempDir dir;
  ExpectInvalid(OpenBytes(dir, RawSafetensorsBytes("{}", "", 1000)),
                "header length 1000 runs past the end of the file (10 bytes)");
  ExpectInvalid(OpenBytes(dir, RawSafetensorsBytes("{}", "", UINT64_MAX - 1)), "runs past the end");
}

TEST(SafetensorsTest, MalformedHeaderJson) {
  TempDir dir;
  ExpectInvalid(OpenBytes(dir, RawSafetensorsBytes("{\"a\": [", "")), "header is not valid JSON");
  ExpectInvalid(OpenBytes(dir, RawSafetensorsBytes("[1, 2]", "")), "not a JSON object");
  ExpectInvalid(OpenBytes(dir, RawSafetensorsBytes(R"({"__metadata__": {"k": 1}})", "")),
                "\"__metadata__\" value of \"k\" is not a string");
  ExpectInvalid(
      OpenBytes(dir, RawSafetensorsBytes(R"({"t": {"dtype": "F32", "shape": [1]}})", "abcd")),
      "tensor \"t\": \"data_offsets\" must be two non-negative integers");
  ExpectInvalid(
      OpenBytes(dir,
                RawSafetensorsBytes(
                    R"({"t": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})", "abcd")),
      "tensor \"t\": shape [-1] has a non-integer or negative dimension");
  ExpectInvalid(
      OpenBytes(dir,
                RawSafetensorsBytes(
                    R"({"t": {"dtype": "F32", "shape": [1], "data_offsets": [4, 0]}})", "abcd")),
      "end before begin");
}

// Error messages dump the offending shape, and nlohmann's dump recurses: a header nested a
// million levels deep is refused before parsing instead of overflowing the stack.
TEST(SafetensorsTest, DeeplyNestedHeaderIsRefused) {
  TempDir dir;
  const std::string deep = std::string(1000000, '[') + std::string(1000000, ']');
  ExpectInvalid(OpenBytes(dir, RawSafetensorsBytes(R"({"t": {"dtype": "F32", "shape": )" + deep +
                                                       R"(, "data_offsets": [0, 4]}})",
                                                   "abcd")),
                "JSON nested deeper than 64 levels");

  const std::string index_path = dir.path() + "/model.safetensors.index.json";
  ASSERT_TRUE(::unlink((dir.path() + "/model.safetensors").c_str()) == 0);
  ASSERT_TRUE(WriteFile(index_path, R"({"weight_map": {"a": )" + deep + "}}").ok());
  auto index = SafetensorsModel::Open(dir.path());
  EXPECT_EQ(index.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(index.status().message()), HasSubstr("JSON nested deeper than 64"));
}

TEST(SafetensorsTest, UnknownDtype) {
  TempDir dir;
  ExpectInvalid(
      OpenBytes(
          dir, RawSafetensorsBytes(
                   R"({"t": {"dtype": "F8_E5M2", "shape": [4], "data_offsets": [0, 4]}})", "abcd")),
      "tensor \"t\": unsupported dtype \"F8_E5M2\"");
}

// Quantized checkpoints store packed integers and FP8: their dtypes open, sized by element, but
// ReadFloat refuses them (they are dequantized through stage/model/quant).
TEST(SafetensorsTest, StorageDtypesOpenButAreNotReadAsFloat) {
  TempDir dir;
  ASSERT_TRUE(WriteFile(dir.path() + "/model.safetensors",
                        RawSafetensorsBytes(R"({"q": {"dtype": "I32", "shape": [2], )"
                                            R"("data_offsets": [0, 8]}, "w": {"dtype": "F8_E4M3", )"
                                            R"("shape": [3], "data_offsets": [8, 11]}})",
                                            std::string(11, '\x38')))
                  .ok());
  auto model = SafetensorsModel::Open(dir.path());
  ASSERT_TRUE(model.ok()) << model.status();
  const std::vector<int64_t> shape = {3};
  auto w = (*model)->Get("w", shape);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->info->dtype, DType::kF8E4M3);
  EXPECT_EQ(w->bytes.size(), 3u);
  auto as_float = (*model)->ReadFloat("w", shape);
  ASSERT_FALSE(as_float.ok());
  EXPECT_THAT(as_float.status().message(), ::testing::HasSubstr("quantization_config"));
}

TEST(SafetensorsTest, ShapeSizeMismatch) {
  TempDir dir;
  ExpectInvalid(
      OpenBytes(dir, RawSafetensorsBytes(
                         R"({"t": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [0, 8]}})",
                         std::string(8, '\0'))),
      "tensor \"t\": shape [2,3] x BF16 needs 12 bytes but data_offsets [0, 8] span 8");
}

TEST(SafetensorsTest, OverlappingRanges) {
  TempDir dir;
  ExpectInvalid(OpenBytes(dir, RawSafetensorsBytes(
                                   R"({"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                                       "y": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
                                   std::string(12, '\0'))),
                "tensors \"x\" and \"y\" have overlapping byte ranges");
}

TEST(SafetensorsTest, MissingTensorAndWrongShape) {
  TempDir dir;
  ASSERT_TRUE(WriteFile(dir.path() + "/model.safetensors", SafetensorsBytes(SmallTensors())).ok());
  auto model = SafetensorsModel::Open(dir.path());
  ASSERT_TRUE(model.ok()) << model.status();
  const int64_t shape[] = {3, 2};
  auto missing = (*model)->Get("model.norm.weight", shape);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.status().message()),
              HasSubstr("tensor \"model.norm.weight\" not found"));
  auto wrong = (*model)->Get("a", shape);
  ExpectInvalid(wrong.status(), "tensor \"a\" has shape [2, 3], expected [3, 2]");
}

TEST(SafetensorsTest, RandomHeaderCorruptionNeverCrashes) {
  TempDir dir;
  const std::string good = SafetensorsBytes(SmallTensors());
  std::mt19937 rng(1234);
  for (int i = 0; i < 300; ++i) {
    std::string bytes = good;
    const size_t header_end = 8 + (bytes.size() - 32);  // 32 data bytes
    for (int flips = 0; flips < 3; ++flips) {
      bytes[rng() % header_end] = static_cast<char>(rng() & 0xff);
    }
    const absl::Status status = OpenBytes(dir, bytes);  // ok or an error: must not crash
    if (!status.ok()) {
      EXPECT_THAT(std::string(status.message()), HasSubstr("model.safetensors"));
    }
  }
}

TEST(SafetensorsTest, ShardedCheckpointMapsShardsLazily) {
  TempDir dir;
  const auto tensors = SmallTensors();
  ASSERT_TRUE(WriteFile(dir.path() + "/s1.safetensors", SafetensorsBytes({tensors[0]})).ok());
  ASSERT_TRUE(
      WriteFile(dir.path() + "/s2.safetensors", SafetensorsBytes({tensors[1], tensors[2]})).ok());
  nlohmann::json index = {{"metadata", {{"total_size", 36}}},
                          {"weight_map",
                           {{"a", "s1.safetensors"},
                            {"b", "s2.safetensors"},
                            {"c", "s2.safetensors"},
                            {"ghost", "s1.safetensors"}}}};
  ASSERT_TRUE(WriteFile(dir.path() + "/model.safetensors.index.json", index.dump()).ok());
  auto model = SafetensorsModel::Open(dir.path());
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_TRUE((*model)->OpenedFiles().empty());
  EXPECT_TRUE((*model)->Contains("b"));
  const int64_t b_shape[] = {2};
  auto b = (*model)->ReadFloat("b", b_shape);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(*b, (std::vector<float>{1.5f, -0.25f}));
  EXPECT_EQ((*model)->OpenedFiles(), std::vector<std::string>{dir.path() + "/s2.safetensors"});
  const int64_t ghost_shape[] = {1};
  auto ghost = (*model)->Get("ghost", ghost_shape);
  EXPECT_EQ(ghost.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(ghost.status().message()),
              HasSubstr("s1.safetensors: tensor \"ghost\" (listed in the index) not found"));
  EXPECT_EQ((*model)->OpenedFiles().size(), 2u);
}

TEST(SafetensorsTest, BadIndexOrMissingFiles) {
  TempDir dir;
  auto none = SafetensorsModel::Open(dir.path());
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(none.status().message()),
              HasSubstr("neither model.safetensors nor model.safetensors.index.json"));

  const std::string index_path = dir.path() + "/model.safetensors.index.json";
  ASSERT_TRUE(WriteFile(index_path, "{\"weight_map\": ").ok());
  auto broken = SafetensorsModel::Open(dir.path());
  EXPECT_EQ(broken.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(broken.status().message()), HasSubstr("index.json: not valid JSON"));

  ASSERT_TRUE(WriteFile(index_path, R"({"weight_map": {"a": "../../etc/passwd"}})").ok());
  auto escape = SafetensorsModel::Open(dir.path());
  EXPECT_THAT(std::string(escape.status().message()),
              HasSubstr("not a file in the model directory"));

  ASSERT_TRUE(WriteFile(index_path, R"({"weight_map": {"a": "gone.safetensors"}})").ok());
  auto model = SafetensorsModel::Open(dir.path());
  ASSERT_TRUE(model.ok()) << model.status();
  const int64_t shape[] = {1};
  auto gone = (*model)->Get("a", shape);
  EXPECT_EQ(gone.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(gone.status().message()), HasSubstr("gone.safetensors: cannot open"));
}

// A shard that is a FIFO is refused at once: opening it must not wait for a writer.
TEST(SafetensorsTest, FifoShardIsRefusedWithoutBlocking) {
  TempDir dir;
  ASSERT_EQ(::mkfifo((dir.path() + "/pipe.safetensors").c_str(), 0600), 0);
  ASSERT_TRUE(WriteFile(dir.path() + "/model.safetensors.index.json",
                        R"({"weight_map": {"a": "pipe.safetensors"}})")
                  .ok());
  auto model = SafetensorsModel::Open(dir.path());
  ASSERT_TRUE(model.ok()) << model.status();
  const int64_t shape[] = {1};
  auto pipe = (*model)->Get("a", shape);
  EXPECT_EQ(pipe.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(pipe.status().message()),
              HasSubstr("pipe.safetensors: not a regular file"));
}

// An index.json that is a FIFO or a device is refused at once, naming it: opening it used to
// wait for a writer, and reading /dev/zero ran out of memory.
TEST(SafetensorsTest, FifoOrDeviceIndexIsRefusedWithoutBlocking) {
  TempDir dir;
  const std::string index = dir.path() + "/model.safetensors.index.json";
  ASSERT_EQ(::mkfifo(index.c_str(), 0600), 0);
  absl::StatusOr<std::unique_ptr<SafetensorsModel>> model;
  EXPECT_TRUE(testing::ReturnsWithoutAWriter(index, [&] {
    model = SafetensorsModel::Open(dir.path());
  })) << "opening the model blocked on the FIFO";
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument) << model.status();
  EXPECT_THAT(std::string(model.status().message()), HasSubstr(index + ": not a regular file"));

  std::filesystem::remove(index);
  std::filesystem::create_symlink("/dev/zero", index);
  model = SafetensorsModel::Open(dir.path());
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument) << model.status();
  EXPECT_THAT(std::string(model.status().message()), HasSubstr("character device"));
}

// The sharded Mistral fixture (written by transformers' save_pretrained): a slice maps only the
// shards holding its tensors.
TEST(SafetensorsTest, RealShardedFixtureLoadsOnlyTheSliceShards) {
  const char* root = std::getenv("RINGSERVE_SOURCE_DIR");
  const std::string dir =
      std::string(root != nullptr ? root : ".") + "/tests/fixtures/models/mistral";
  auto config = LoadModelConfig(dir);
  ASSERT_TRUE(config.ok()) << config.status();
  std::ifstream index_file(dir + "/model.safetensors.index.json");
  ASSERT_TRUE(index_file);
  const nlohmann::json index = nlohmann::json::parse(index_file);
  for (LayerRange layers : {LayerRange{0, 1}, LayerRange{2, 3}, LayerRange{0, 3}}) {
    auto model = SafetensorsModel::Open(dir);
    ASSERT_TRUE(model.ok()) << model.status();
    std::set<std::string> want;
    for (const TensorSpec& spec : SliceTensorSpecs(*config, layers, **model)) {
      want.insert(dir + "/" + index["weight_map"][spec.name].get<std::string>());
      ASSERT_TRUE((*model)->ReadFloat(spec.name, spec.shape).ok()) << spec.name;
    }
    const std::vector<std::string> opened = (*model)->OpenedFiles();
    EXPECT_EQ(std::set<std::string>(opened.begin(), opened.end()), want);
  }
  // Layer 0 and the embeddings live in the first shard only.
  auto model = SafetensorsModel::Open(dir);
  for (const TensorSpec& spec : SliceTensorSpecs(*config, {0, 1}, **model)) {
    ASSERT_TRUE((*model)->ReadFloat(spec.name, spec.shape).ok());
  }
  EXPECT_EQ((*model)->OpenedFiles(),
            std::vector<std::string>{dir + "/model-00001-of-00002.safetensors"});
}

}  // namespace
}  // namespace ringserve
