// The embedded default: stage processes on this machine, one per stage of a RingConfig whose
// stages are all on 127.0.0.1 (DefaultRingConfig). Each is `stage --listen 127.0.0.1:PORT
// --ring_secret FILE --model_root MODEL_DIR --ready_fd 3`, started with fork/exec and waited
// for until it listens. FILE is a fresh secret in a private directory made for this ring (so
// that another user's or another ring's coordinator on the same host is refused); the
// coordinator names it in RingConfig::ring_secret_file (secret_file()).
//
// Not thread-safe. The destructor terminates every stage still running.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/hosts/ring_config.h"
#include "coordinator/subprocess.h"

namespace ringserve {

// The `stage` executable: next to `self_path` (the running binary), or in ../stage/ (the
// build tree's layout). NotFound naming both places.
absl::StatusOr<std::string> FindStageBinary(const std::string& self_path);

class LocalStages {
 public:
  // Starts one stage per entry of `ring.stages` and waits (up to `timeout` each) until each
  // listens on its control port. `model_root` bounds what the stages load (default: the model
  // directory; a directory above it when a draft model lies beside it).
  static absl::StatusOr<LocalStages> Launch(const std::string& stage_binary, const RingConfig& ring,
                                            absl::Duration timeout,
                                            const std::string& model_root = "");
  LocalStages(LocalStages&& other) noexcept
      : stage_binary_(std::move(other.stage_binary_)),
        endpoints_(std::move(other.endpoints_)),
        model_dir_(std::move(other.model_dir_)),
        processes_(std::move(other.processes_)),
        secret_dir_(std::exchange(other.secret_dir_, {})),
        secret_file_(std::exchange(other.secret_file_, {})) {}
  LocalStages& operator=(LocalStages&&) = delete;
  ~LocalStages();

  // The ring secret these stages were started with.
  const std::string& secret_file() const { return secret_file_; }

  // Starts again, on the same control port, every stage process that has exited (killed,
  // crashed), waiting up to `timeout` for each to listen. The ring is then formed again.
  absl::Status RespawnExited(absl::Duration timeout);

  // Waits up to `grace` for each stage to exit (after the coordinator asked them to), then
  // terminates the rest.
  void TerminateAll(absl::Duration grace = absl::Seconds(3));

 private:
  LocalStages() = default;
  absl::StatusOr<Subprocess> Spawn(int index) const;
  absl::Status WaitListening(int index, absl::Duration timeout);

  std::string stage_binary_;
  std::vector<std::string> endpoints_;
  std::string model_dir_;  // each stage's --model-root
  std::vector<Subprocess> processes_;
  std::string secret_dir_;  // removed with the stages
  std::string secret_file_;
};

}  // namespace ringserve
