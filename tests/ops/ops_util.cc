#include "tests/ops/ops_util.h"

#include <stdlib.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/status_macros.h"
#include "coordinator/subprocess.h"
#include "fmt/format.h"

namespace ringserve::ops {

namespace fs = std::filesystem;

std::string SourceDir() {
  const char* dir = std::getenv("RINGSERVE_SOURCE_DIR");
  return dir != nullptr ? dir : ".";
}

std::string BinaryDir() {
  const char* dir = std::getenv("RINGSERVE_BINARY_DIR");
  return dir != nullptr ? dir : "build";
}

absl::StatusOr<std::string> MakeTestModel(const std::string& dir) {
  const fs::path fixture = fs::path(SourceDir()) / "tests/fixtures/models/llama";
  const fs::path tokenizer = fs::path(SourceDir()) / "tests/ops/tiny_tokenizer";
  const fs::path model = fs::path(dir) / "tiny-llama-chat";
  std::error_code error;
  fs::create_directories(model, error);
  for (const char* name : {"config.json", "generation_config.json", "model.safetensors"}) {
    fs::create_symlink(fs::absolute(fixture / name), model / name, error);
    if (error) {
      return absl::InternalError(
          fmt::format("linking {}: {}", (fixture / name).string(), error.message()));
    }
  }
  for (const char* name : {"tokenizer.json", "tokenizer_config.json"}) {
    fs::copy_file(tokenizer / name, model / name, error);
    if (error) {
      return absl::InternalError(
          fmt::format("copying {}: {}", (tokenizer / name).string(), error.message()));
    }
  }
  return model.string();
}

absl::StatusOr<std::string> FindInPath(const std::string& name) {
  if (name.find('/') != std::string::npos) return name;
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path != nullptr ? path : "/usr/bin:/bin");
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    fs::path candidate = fs::path(dir.empty() ? "." : dir) / name;
    if (access(candidate.c_str(), X_OK) == 0) return candidate.string();
  }
  return absl::NotFoundError(fmt::format("'{}' is not in PATH (scripts/install_deps.sh)", name));
}

absl::StatusOr<ProgramResult> RunProgram(const std::vector<std::string>& argv,
                                         absl::Duration timeout) {
  TempDir out_dir;
  std::string out = out_dir.path() + "/output.txt";
  std::vector<std::string> resolved = argv;
  RS_ASSIGN_OR_RETURN(resolved[0], FindInPath(argv[0]));
  RS_ASSIGN_OR_RETURN(
      Subprocess process,
      Subprocess::Spawn(
          {.argv = resolved, .ready_fd = false, .stdout_path = out, .stderr_path = out}));
  absl::StatusOr<int> code = process.Wait(timeout);
  ProgramResult result;
  if (!code.ok()) process.Terminate(absl::Seconds(2));
  std::ifstream file(out);
  std::stringstream text;
  text << file.rdbuf();
  result.output = text.str();
  if (!code.ok()) {
    return absl::DeadlineExceededError(fmt::format("{} did not finish within {}; it printed:\n{}",
                                                   argv[0], absl::FormatDuration(timeout),
                                                   result.output));
  }
  result.exit_code = *code;
  return result;
}

std::string ArtifactDir() {
  std::string dir = BinaryDir() + "/test-artifacts";
  std::error_code ignored;
  fs::create_directories(dir, ignored);
  return dir;
}

}  // namespace ringserve::ops
