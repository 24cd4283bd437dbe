// Helpers for the operations tests: source/build paths, temporary directories, the test model
// (the 4-layer llama fixture with the tiny byte-level BPE tokenizer and ChatML template of
// tests/ops/tiny_tokenizer), and running helper programs (node, promtool, systemd-analyze)
// with their output captured.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/testing/temp_dir.h"

namespace ringserve::ops {

// $RINGSERVE_SOURCE_DIR (default "."), $RINGSERVE_BINARY_DIR (default "build").
std::string SourceDir();
std::string BinaryDir();

using ::ringserve::testing::TempDir;  // common/testing/temp_dir.h

// Builds the test model directory in `dir`: the llama fixture's config and weights (symlinked)
// plus the tiny tokenizer and chat template (copied). Returns the directory.
absl::StatusOr<std::string> MakeTestModel(const std::string& dir);

struct ProgramResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr, interleaved
};

// Runs `argv` (argv[0] is looked up in PATH when it has no '/') with stdout+stderr captured,
// waiting up to `timeout`; a program still running then is killed and DeadlineExceeded is
// returned with what it printed.
absl::StatusOr<ProgramResult> RunProgram(const std::vector<std::string>& argv,
                                         absl::Duration timeout);

// Path of an executable named `name` in PATH, or NotFound.
absl::StatusOr<std::string> FindInPath(const std::string& name);

// Where tests keep artifacts: $RINGSERVE_BINARY_DIR/test-artifacts (created).
std::string ArtifactDir();

}  // namespace ringserve::ops
