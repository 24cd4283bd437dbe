// Test support: a fresh, empty directory for one test's files, removed (recursively) when the
// object goes away. Under $TEST_TMPDIR when set, else the system temp dir ($TMPDIR or /tmp).
// Aborts the test binary if no directory can be made (nothing sensible can follow).
#pragma once

#include <string>

namespace ringserve::testing {

class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace ringserve::testing
