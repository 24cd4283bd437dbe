// Helpers shared by the tokenizer tests: fixture paths and file reading.
#pragma once

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

namespace ringserve::tokenizer_testing {

inline std::string SourceDir() {
  const char* dir = std::getenv("RINGSERVE_SOURCE_DIR");
  return dir != nullptr ? dir : ".";
}

// .deps/tokenizers/<name> (fetched by scripts/fetch_npm_assets.sh).
inline std::string TokenizerDir(const std::string& name) {
  return SourceDir() + "/.deps/tokenizers/" + name;
}

inline std::string FixturePath(const std::string& file) {
  return SourceDir() + "/tests/fixtures/tokenizers/" + file;
}

// Whole file, or "" if it cannot be read.
inline std::string ReadFileOrEmpty(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

}  // namespace ringserve::tokenizer_testing
