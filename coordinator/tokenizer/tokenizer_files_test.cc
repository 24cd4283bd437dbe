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

// `dir` laid out like a hub snapshot: each tokenizer file a symlink to the tiny model's.
void LinkTokenizerFiles(const std::string& dir) {
  for (const char* name : {"tokenizer.json", "tokenizer_config.json"}) {
    std::filesystem::create_symlink(std::filesystem::absolute(TinyModelDir() + "/" + name),
                                    dir + "/" + name);
  }
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
  const std::string path = dir.path() + "/tokenizer.json";
  ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0);
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer;
  EXPECT_TRUE(testing::ReturnsWithoutAWriter(path, [&] {
    tokenizer = Tokenizer::FromDirectory(dir.path());
  })) << "loading blocked on the FIFO";
  EXPECT_EQ(tokenizer.status().code(), absl::StatusCode::kInvalidArgument) << tokenizer.status();
  EXPECT_THAT(std::string(tokenizer.status().message()), HasSubstr(path));
  EXPECT_THAT(std::string(tokenizer.status().message()), HasSubstr("not a regular file"));
}

TEST(TokenizerFilesTest, RefusesAFifoTokenizerConfigRatherThanSkippingOrBlocking) {
  // tokenizer_config.json is optional, but one that is there and unreadable is an error.
  testing::TempDir dir;
  std::filesystem::create_symlink(std::filesystem::absolute(TinyModelDir() + "/tokenizer.json"),
                                  dir.path() + "/tokenizer.json");
  const std::string path = dir.path() + "/tokenizer_config.json";
  ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0);
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer;
  EXPECT_TRUE(testing::ReturnsWithoutAWriter(path, [&] {
    tokenizer = Tokenizer::FromDirectory(dir.path());
  })) << "loading blocked on the FIFO";
  EXPECT_EQ(tokenizer.status().code(), absl::StatusCode::kInvalidArgument) << tokenizer.status();
  EXPECT_THAT(std::string(tokenizer.status().message()), HasSubstr(path));
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
  std::filesystem::create_symlink(std::filesystem::absolute(TinyModelDir() + "/tokenizer.json"),
                                  dir.path() + "/tokenizer.json");
  auto tokenizer = Tokenizer::FromDirectory(dir.path());
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status();
}

}  // namespace
}  // namespace ringserve
