// Tokenizer::FromDirectory's reading of tokenizer.json and tokenizer_config.json: what sits at
// the path is not trusted (a FIFO, a device, a huge file), while hub-cache symlinks keep
// working and encode exactly as the files they point at.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/bounded_file.h"
#include "common/testing/fifo_watchdog.h"
#include "common/testing/temp_dir.h"
#include "coordinator/tokenizer/tokenizer.h"
#include "coordinator/tokenizer/tokenizer_test_util.h"

namespace ringserve {
namespace {

using ::testing::HasSubstr;

std::string TinyModelDir() { return tokenizer_testing::SourceDir() + "/models/ringserve-tiny"; }

// `dir`/`name` made a symlink to the tiny model's file of that name, as in a hub snapshot.
void LinkTinyModelFile(const std::string& dir, const std::string& name) {
  std::filesystem::create_symlink(std::filesystem::absolute(TinyModelDir() + "/" + name),
                                  dir + "/" + name);
}

// `dir` laid out like a hub snapshot: each tokenizer file a symlink to the tiny model's.
void LinkTokenizerFiles(const std::string& dir) {
  for (const char* name : {"tokenizer.json", "tokenizer_config.json"}) {
    LinkTinyModelFile(dir, name);
  }
}

// Makes `dir`/`name` a FIFO and loads `dir`: the load must return without a writer opening the
// FIFO, refused as InvalidArgument naming the FIFO's path. `*refusal` gets the load's status.
// A FIFO that cannot be made is a fatal failure: callers wrap the call in ASSERT_NO_FATAL_FAILURE.
void ExpectFifoRefusedWithoutBlocking(const std::string& dir, const std::string& name,
                                      absl::Status* refusal) {
  const std::string path = dir + "/" + name;
  ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0);
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer;
  EXPECT_TRUE(testing::ReturnsWithoutAWriter(path, [&] {
    tokenizer = Tokenizer::FromDirectory(dir);
  })) << "loading blocked on the FIFO";
  *refusal = tokenizer.status();
  EXPECT_EQ(refusal->code(), absl::StatusCode::kInvalidArgument) << *refusal;
  EXPECT_THAT(std::string(refusal->message()), HasSubstr(path));
}

TEST(TokenizerFilesTest, SymlinkedFilesLoadAndEncodeAsTheOriginals) {
  testing::TempDir dir;
  LinkTokenizerFiles(dir.path());
  auto linked = Tokenizer::FromDirectory(dir.path());
  ASSERT_TRUE(linked.ok()) << linked.status();
  auto original = Tokenizer::FromDirectory(TinyModelDir());
  ASSERT_TRUE(original.ok()) << original.status();
  const std::string text = "And God said unto Moses, I AM THAT I AM.";
  auto a = (*linked)->Encode(text, true);
  auto b = (*original)->Encode(text, true);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(*a, *b);
  EXPECT_EQ((*linked)->eos_token_id(), (*original)->eos_token_id());
}

TEST(TokenizerFilesTest, RefusesAFifoTokenizerJsonWithoutWaitingForAWriter) {
  testing::TempDir dir;
  absl::Status refusal;
  ASSERT_NO_FATAL_FAILURE(ExpectFifoRefusedWithoutBlocking(dir.path(), "tokenizer.json", &refusal));
  EXPECT_THAT(std::string(refusal.message()), HasSubstr("not a regular file"));
}

TEST(TokenizerFilesTest, RefusesAFifoTokenizerConfigRatherThanSkippingOrBlocking) {
  // tokenizer_config.json is optional, but one that is there and unreadable is an error.
  testing::TempDir dir;
  LinkTinyModelFile(dir.path(), "tokenizer.json");
  absl::Status refusal;
  ASSERT_NO_FATAL_FAILURE(
      ExpectFifoRefusedWithoutBlocking(dir.path(), "tokenizer_config.json", &refusal));
}

TEST(TokenizerFilesTest, RefusesATokenizerJsonThatIsASymlinkToDevZero) {
  testing::TempDir dir;
  const std::string path = dir.path() + "/tokenizer.json";
  std::filesystem::create_symlink("/dev/zero", path);
  auto tokenizer = Tokenizer::FromDirectory(dir.path());
  EXPECT_EQ(tokenizer.status().code(), absl::StatusCode::kInvalidArgument) << tokenizer.status();
  EXPECT_THAT(std::string(tokenizer.status().message()), HasSubstr(path));
  EXPECT_THAT(std::string(tokenizer.status().message()), HasSubstr("character device"));
}

TEST(TokenizerFilesTest, RefusesAnOversizedTokenizerJsonNamingTheLimit) {
  testing::TempDir dir;
  const std::string path = dir.path() + "/tokenizer.json";
  { std::ofstream create(path); }
  std::filesystem::resize_file(path, kMaxTokenizerJsonBytes + 1);  // sparse: no disk used
  auto tokenizer = Tokenizer::FromDirectory(dir.path());
  EXPECT_EQ(tokenizer.status().code(), absl::StatusCode::kInvalidArgument) << tokenizer.status();
  EXPECT_THAT(std::string(tokenizer.status().message()), HasSubstr(path));
  EXPECT_THAT(std::string(tokenizer.status().message()), HasSubstr("(256 MiB)"));
}

TEST(TokenizerFilesTest, MissingTokenizerJsonIsNotFoundAndAMissingConfigIsFine) {
  testing::TempDir dir;
  EXPECT_EQ(Tokenizer::FromDirectory(dir.path()).status().code(), absl::StatusCode::kNotFound);
  LinkTinyModelFile(dir.path(), "tokenizer.json");
  auto tokenizer = Tokenizer::FromDirectory(dir.path());
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status();
}

}  // namespace
}  // namespace ringserve
