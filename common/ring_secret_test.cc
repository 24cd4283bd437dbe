#include "common/ring_secret.h"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "common/testing/fifo_watchdog.h"
#include "gtest/gtest.h"

namespace ringserve {
namespace {

std::string TempPath(const std::string& name) {
  return ::testing::TempDir() + "/rs_secret_" + std::to_string(getpid()) + "_" + name;
}

std::string WriteFile(const std::string& name, const std::string& text, mode_t mode) {
  std::string path = TempPath(name);
  unlink(path.c_str());
  { std::ofstream(path) << text; }
  chmod(path.c_str(), mode);
  return path;
}

TEST(RingSecretTest, LoadsAnOwnerOnlyFile) {
  std::string path = WriteFile("ok", "  0123456789abcdef0123\n", 0600);
  absl::StatusOr<RingSecret> secret = RingSecret::Load(path);
  ASSERT_TRUE(secret.ok()) << secret.status();
  // Whitespace is not part of the key.
  EXPECT_EQ(secret->Mac("m"), RingSecret::FromBytes("0123456789abcdef0123").Mac("m"));
}

TEST(RingSecretTest, RefusesFilesOthersCanRead) {
  std::string path = WriteFile("open", "0123456789abcdef0123\n", 0644);
  absl::StatusOr<RingSecret> secret = RingSecret::Load(path);
  EXPECT_EQ(secret.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(secret.status().message().find("chmod 600"), std::string::npos) << secret.status();
  EXPECT_EQ(RingSecret::Load(WriteFile("group", "0123456789abcdef0123", 0640)).status().code(),
            absl::StatusCode::kPermissionDenied);
}

TEST(RingSecretTest, RefusesShortSecretsAndMissingFiles) {
  EXPECT_EQ(RingSecret::Load(WriteFile("short", "abc\n", 0600)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RingSecret::Load(TempPath("missing")).status().code(), absl::StatusCode::kNotFound);
}

TEST(RingSecretTest, RefusesAFifoWithoutWaitingForAWriterAndSymlinks) {
  const std::string fifo = TempPath("fifo");
  unlink(fifo.c_str());
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  absl::StatusOr<RingSecret> secret = absl::UnknownError("not run");
  EXPECT_TRUE(testing::ReturnsWithoutAWriter(fifo, [&] { secret = RingSecret::Load(fifo); }))
      << "loading blocked on the FIFO";
  EXPECT_EQ(secret.status().code(), absl::StatusCode::kInvalidArgument) << secret.status();
  EXPECT_NE(secret.status().message().find("ring secret " + fifo + ": not a regular file"),
            std::string::npos)
      << secret.status();
  unlink(fifo.c_str());

  // The secret must be the file itself, never a link to one (or to /dev/zero).
  const std::string link = TempPath("link");
  unlink(link.c_str());
  std::filesystem::create_symlink(WriteFile("target", "0123456789abcdef0123", 0600), link);
  EXPECT_EQ(RingSecret::Load(link).status().code(), absl::StatusCode::kInvalidArgument);
  unlink(link.c_str());
}

TEST(RingSecretTest, RefusesAHugeFile) {
  const std::string path = WriteFile("huge", std::string(1 << 20, 'a'), 0600);
  absl::StatusOr<RingSecret> secret = RingSecret::Load(path);
  EXPECT_EQ(secret.status().code(), absl::StatusCode::kInvalidArgument) << secret.status();
  unlink(path.c_str());
}

TEST(RingSecretTest, CreateWritesAFreshOwnerOnlySecret) {
  std::string path = TempPath("created");
  unlink(path.c_str());
  absl::StatusOr<RingSecret> created = RingSecret::Create(path);
  ASSERT_TRUE(created.ok()) << created.status();
  struct stat st {};
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  absl::StatusOr<RingSecret> loaded = RingSecret::Load(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->Mac("x"), created->Mac("x"));
  EXPECT_FALSE(RingSecret::Create(path).ok());  // never overwrites
  std::string other = TempPath("created2");
  unlink(other.c_str());
  EXPECT_NE(RingSecret::Create(other)->Mac("x"), created->Mac("x"));
}

TEST(RingSecretTest, MacsDependOnKeyAndMessage) {
  RingSecret a = RingSecret::FromBytes("key-a-0123456789");
  RingSecret b = RingSecret::FromBytes("key-b-0123456789");
  std::string message = ControlProofMessage("nonce", "coordinator");
  EXPECT_EQ(a.Mac(message).size(), 64u);
  EXPECT_TRUE(a.Verify(message, a.Mac(message)));
  EXPECT_FALSE(a.Verify(message, b.Mac(message)));
  EXPECT_FALSE(a.Verify(ControlProofMessage("nonce2", "coordinator"), a.Mac(message)));
  EXPECT_NE(ChannelProofMessage("listener", "n", 1), ChannelProofMessage("connector", "n", 1));
  // RFC 4231 test case 2.
  EXPECT_EQ(RingSecret::FromBytes("Jefe").Mac("what do ya want for nothing?"),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
}

}  // namespace
}  // namespace ringserve
