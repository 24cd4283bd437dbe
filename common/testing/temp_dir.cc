#include "common/testing/temp_dir.h"

#include <stdlib.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <system_error>

namespace ringserve::testing {

TempDir::TempDir() {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string pattern =
      (base != nullptr ? std::string(base) : std::filesystem::temp_directory_path().string()) +
      "/ringserve_test_XXXXXX";
  if (::mkdtemp(pattern.data()) == nullptr) {
    std::perror(("cannot make a temporary directory from " + pattern).c_str());
    std::abort();
  }
  path_ = pattern;
}

TempDir::~TempDir() {
  std::error_code ignored;
  std::filesystem::remove_all(path_, ignored);
}

}  // namespace ringserve::testing
