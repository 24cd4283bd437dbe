#include "coordinator/local_stages.h"

#include <unistd.h>

#include <filesystem>

#include "common/logging.h"
#include "common/status_macros.h"
#include "fmt/format.h"

namespace ringserve {

absl::StatusOr<std::string> FindStageBinary(const std::string& self_path) {
  std::error_code error;
  std::filesystem::path self = std::filesystem::canonical("/proc/self/exe", error);
  if (error) self = std::filesystem::absolute(self_path);
  std::filesystem::path dir = self.parent_path();
  std::vector<std::filesystem::path> candidates = {dir / "stage",
                                                   dir.parent_path() / "stage" / "stage"};
  for (const auto& candidate : candidates) {
    if (access(candidate.c_str(), X_OK) == 0) return candidate.string();
  }
  return absl::NotFoundError(
      fmt::format("no `stage` executable at {} or {}; build it or pass "
                  "--stage_binary",
                  candidates[0].string(), candidates[1].string()));
}

absl::StatusOr<LocalStages> LocalStages::Launch(const std::string& stage_binary,
                                                const RingConfig& ring, absl::Duration timeout) {
  LocalStages stages;
  for (const StageConfig& stage : ring.stages) {
    SubprocessOptions options;
    options.argv = {stage_binary, "--listen", stage.endpoint(), "--ready_fd", "3"};
    options.ready_fd = true;
    RS_ASSIGN_OR_RETURN(Subprocess process, Subprocess::Spawn(options));
    stages.processes_.push_back(std::move(process));
  }
  for (size_t i = 0; i < stages.processes_.size(); ++i) {
    auto line = stages.processes_[i].ReadReadyLine(timeout);
    if (!line.ok()) {
      return absl::Status(line.status().code(),
                          fmt::format("local stage {} ({}): {}", i, ring.stages[i].endpoint(),
                                      std::string(line.status().message())));
    }
    RS_LOG_INFO("local stage {} is {} on {}", i, stages.processes_[i].name(), *line);
  }
  return stages;
}

void LocalStages::TerminateAll(absl::Duration grace) {
  for (Subprocess& process : processes_) {
    if (!process.Wait(grace).ok()) process.Terminate(absl::Seconds(2));
    grace = absl::Milliseconds(200);  // the first wait covered the others' exit too
  }
  processes_.clear();
}

}  // namespace ringserve
