#include "common/bounded_file.h"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "common/testing/fifo_watchdog.h"
#include "common/testing/temp_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ringserve {
namespace {

using ::testing::HasSubstr;

void Write(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

class BoundedFileTest : public ::testing::Test {
 protected:
  std::string Path(const std::string& name) const { return dir_.path() + "/" + name; }
  testing::TempDir dir_;
};

TEST_F(BoundedFileTest, ReadsARegularFile) {
  Write(Path("config.json"), "{\"a\": 1}\n");
  absl::StatusOr<std::string> text = ReadBoundedFile(Path("config.json"), 1024);
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text, "{\"a\": 1}\n");
}

TEST_F(BoundedFileTest, ReadsAnEmptyFileAndOneExactlyAtTheLimit) {
  Write(Path("empty"), "");
  absl::StatusOr<std::string> empty = ReadBoundedFile(Path("empty"), 16);
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ(*empty, "");
  const std::string big(100000, 'x');
  Write(Path("big"), big);
  absl::StatusOr<std::string> text = ReadBoundedFile(Path("big"), big.size());
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text, big);
}

TEST_F(BoundedFileTest, FollowsASymlinkToARegularFile) {
  // Hugging Face hub caches are directories of symlinks into blobs/.
  Write(Path("blob"), "tokenizer");
  std::filesystem::create_symlink(Path("blob"), Path("tokenizer.json"));
  absl::StatusOr<std::string> text = ReadBoundedFile(Path("tokenizer.json"), 1024);
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text, "tokenizer");
}

TEST_F(BoundedFileTest, RefusesAFifoWithoutWaitingForAWriter) {
  const std::string fifo = Path("config.json");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  absl::StatusOr<std::string> text;
  EXPECT_TRUE(testing::ReturnsWithoutAWriter(fifo, [&] { text = ReadBoundedFile(fifo, 1024); }))
      << "the open blocked waiting for a writer";
  EXPECT_EQ(text.status().code(), absl::StatusCode::kInvalidArgument) << text.status();
  EXPECT_THAT(text.status().message(), HasSubstr(fifo));
  EXPECT_THAT(text.status().message(), HasSubstr("not a regular file (a FIFO)"));
}

TEST_F(BoundedFileTest, RefusesASymlinkToDevZero) {
  std::filesystem::create_symlink("/dev/zero", Path("config.json"));
  absl::StatusOr<std::string> text = ReadBoundedFile(Path("config.json"), 1024);
  EXPECT_EQ(text.status().code(), absl::StatusCode::kInvalidArgument) << text.status();
  EXPECT_THAT(text.status().message(), HasSubstr(Path("config.json")));
  EXPECT_THAT(text.status().message(), HasSubstr("a character device"));
}

TEST_F(BoundedFileTest, RefusesADirectory) {
  std::filesystem::create_directory(Path("config.json"));
  absl::StatusOr<std::string> text = ReadBoundedFile(Path("config.json"), 1024);
  EXPECT_EQ(text.status().code(), absl::StatusCode::kInvalidArgument) << text.status();
  EXPECT_THAT(text.status().message(), HasSubstr("a directory"));
}

TEST_F(BoundedFileTest, RefusesAFileAboveTheLimitNamingPathAndLimit) {
  Write(Path("tokenizer.json"), std::string(2049, 'x'));
  absl::StatusOr<std::string> text = ReadBoundedFile(Path("tokenizer.json"), 2048);
  EXPECT_EQ(text.status().code(), absl::StatusCode::kInvalidArgument) << text.status();
  EXPECT_THAT(text.status().message(), HasSubstr(Path("tokenizer.json")));
  EXPECT_THAT(text.status().message(), HasSubstr("2049 bytes"));
  EXPECT_THAT(text.status().message(), HasSubstr("limit of 2048 bytes (2 KiB)"));
}

TEST_F(BoundedFileTest, BoundsFilesWhoseSizeFstatDoesNotTell) {
  // /proc files are regular files of st_size 0; the limit holds while reading.
  absl::StatusOr<std::string> whole = ReadBoundedFile("/proc/self/status", 1 << 20);
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_THAT(*whole, HasSubstr("Name:"));
  absl::StatusOr<std::string> cut = ReadBoundedFile("/proc/self/status", 16);
  EXPECT_EQ(cut.status().code(), absl::StatusCode::kInvalidArgument) << cut.status();
  EXPECT_THAT(cut.status().message(), HasSubstr("grew past 16 bytes"));
}

TEST_F(BoundedFileTest, MissingFileIsNotFound) {
  EXPECT_EQ(ReadBoundedFile(Path("absent.json"), 1024).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(ReadBoundedFile(Path("absent/config.json"), 1024).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(BoundedFileTest, WithoutFollowingSymlinksASymlinkIsRefused) {
  Write(Path("secret"), "0123456789abcdef");
  std::filesystem::create_symlink(Path("secret"), Path("link"));
  absl::StatusOr<RegularFile> file =
      RegularFile::Open(Path("link"), RegularFile::Options{.follow_symlinks = false});
  EXPECT_EQ(file.status().code(), absl::StatusCode::kInvalidArgument) << file.status();
  EXPECT_THAT(file.status().message(), HasSubstr("symbolic link"));
  absl::StatusOr<RegularFile> direct =
      RegularFile::Open(Path("secret"), RegularFile::Options{.follow_symlinks = false});
  ASSERT_TRUE(direct.ok()) << direct.status();
  EXPECT_EQ(direct->size_bytes(), 16u);
  absl::StatusOr<std::string> text = direct->ReadAll(kMaxKeyFileBytes);
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text, "0123456789abcdef");
}

}  // namespace
}  // namespace ringserve
