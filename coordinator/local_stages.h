// The embedded default: stage processes on this machine, one per stage of a RingConfig whose
// stages are all on 127.0.0.1 (DefaultRingConfig). Each is `stage --listen 127.0.0.1:PORT
// --ready-fd 3`, started with fork/exec and waited for until it listens.
//
// Not thread-safe. The destructor terminates every stage still running.
#pragma once

#include <string>
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
  // listens on its control port.
  static absl::StatusOr<LocalStages> Launch(const std::string& stage_binary, const RingConfig& ring,
                                            absl::Duration timeout);
  LocalStages(LocalStages&&) = default;
  LocalStages& operator=(LocalStages&&) = default;
  ~LocalStages() { TerminateAll(); }

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
  std::vector<Subprocess> processes_;
};

}  // namespace ringserve
