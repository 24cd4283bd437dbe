#include "coordinator/local_stages.h"

#include <unistd.h>

#include <filesystem>

#include "common/logging.h"
#include "common/ring_secret.h"
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
                                                const RingConfig& ring, absl::Duration timeout,
                                                const std::string& model_root) {
  LocalStages stages;
  std::string dir_template =
      (std::filesystem::temp_directory_path() / "ringserve-ring-XXXXXX").string();
  if (mkdtemp(dir_template.data()) == nullptr) {
    return absl::UnavailableError(
        fmt::format("cannot make a private directory for the ring secret: {}", dir_template));
  }
  stages.secret_dir_ = dir_template;
  stages.secret_file_ = dir_template + "/ring.secret";
  RS_RETURN_IF_ERROR(RingSecret::Create(stages.secret_file_).status());
  stages.stage_binary_ = stage_binary;
  stages.model_dir_ = model_root.empty() ? ring.model_dir : model_root;
  for (const StageConfig& stage : ring.stages) stages.endpoints_.push_back(stage.endpoint());
  for (size_t i = 0; i < stages.endpoints_.size(); ++i) {
    RS_ASSIGN_OR_RETURN(Subprocess process, stages.Spawn(static_cast<int>(i)));
    stages.processes_.push_back(std::move(process));
  }
  for (size_t i = 0; i < stages.processes_.size(); ++i) {
    RS_RETURN_IF_ERROR(stages.WaitListening(static_cast<int>(i), timeout));
  }
  return stages;
}

LocalStages::~LocalStages() {
  TerminateAll();
  if (!secret_dir_.empty()) {
    std::error_code ignored;
    std::filesystem::remove_all(secret_dir_, ignored);
  }
}

absl::StatusOr<Subprocess> LocalStages::Spawn(int index) const {
  SubprocessOptions options;
  options.argv = {stage_binary_,   "--listen",   endpoints_[index],
                  "--ring_secret", secret_file_, "--model_root",
                  model_dir_,      "--ready_fd", "3"};
  options.ready_fd = true;
  return Subprocess::Spawn(options);
}

absl::Status LocalStages::WaitListening(int index, absl::Duration timeout) {
  auto line = processes_[index].ReadReadyLine(timeout);
  if (!line.ok()) {
    return absl::Status(line.status().code(),
                        fmt::format("local stage {} ({}): {}", index, endpoints_[index],
                                    std::string(line.status().message())));
  }
  RS_LOG_INFO("local stage {} is {} on {}", index, processes_[index].name(), *line);
  return absl::OkStatus();
}

absl::Status LocalStages::RespawnExited(absl::Duration timeout) {
  for (size_t i = 0; i < processes_.size(); ++i) {
    absl::StatusOr<int> exit_code = processes_[i].Wait(absl::ZeroDuration());
    if (!exit_code.ok()) continue;  // still running
    RS_LOG_WARN("local stage {} ({}) exited with {}; starting it again", i, endpoints_[i],
                *exit_code);
    RS_ASSIGN_OR_RETURN(processes_[i], Spawn(static_cast<int>(i)));
    RS_RETURN_IF_ERROR(WaitListening(static_cast<int>(i), timeout));
  }
  return absl::OkStatus();
}

void LocalStages::TerminateAll(absl::Duration grace) {
  for (Subprocess& process : processes_) {
    if (!process.Wait(grace).ok()) process.Terminate(absl::Seconds(2));
    grace = absl::Milliseconds(200);  // the first wait covered the others' exit too
  }
  processes_.clear();
}

}  // namespace ringserve
