// Bring-up of a ring of stage processes: connect to every stage named in the RingConfig
// (bounded wait), size and configure its KV pool and model slice (load progress reported as
// typed StageProgress), and join the stages into a ring. The result is a FormedRing whose
// GrpcRingLink the engine drives; the engine calls FormGrpcRing again to re-form the ring
// after a failure.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "coordinator/hosts/ring_config.h"
#include "coordinator/ring_link.h"
#include "ring/defaults.h"
#include "ring/model_config.h"

namespace ringserve {

// One start-up event of one stage, or of the whole ring (stage == -1).
struct StageProgress {
  int stage = -1;
  std::string endpoint{};  // the stage's control endpoint; empty for the ring
  std::string message{};   // "loading layers [2, 4) ...", "ready", "connecting to 3 stage(s)"
  bool ready = false;      // the stage has loaded its slice
};
using ProgressCallback = std::function<void(const StageProgress&)>;

// Speculative decoding (coordinator --speculative_model / --speculative_mtp): what the last
// stage is configured with (ConfigureRequest speculative_*).
struct SpeculationBringUp {
  std::string draft_model_dir{};  // empty and !mtp: off
  bool mtp = false;
  int num_tokens = 0;  // k at most
  bool enabled() const { return !draft_model_dir.empty() || mtp; }
};

struct BringUpOptions {
  RingConfig ring{};  // validated (hosts.yaml or the embedded default)
  // Bounded wait for each stage's control endpoint to accept a connection.
  absl::Duration connect_timeout = absl::Seconds(kDefaultConnectTimeoutSeconds);
  // Bound on configuring (loading) one stage.
  absl::Duration configure_timeout = absl::Minutes(30);
  // Bound on a stage waiting for its neighbour's activations during a step.
  absl::Duration step_timeout = absl::Seconds(kDefaultStepTimeoutSeconds);
  // The ring fails when it has work and makes no progress this long (GrpcRingLinkOptions;
  // the stages then report their activity a few times as often). Zero: no watchdog.
  absl::Duration stall_timeout = absl::Seconds(kDefaultStallTimeoutSeconds);
  // Per-stage KV pool of CPU stages when the RingConfig sets neither kv_blocks nor kv_budget
  // (CUDA stages then size theirs from memory).
  int default_kv_blocks = kDefaultCpuKvBlocks;
  // Share of each GPU's memory the CUDA stages on it may take together (split evenly).
  double gpu_memory_utilization = kDefaultGpuMemoryFraction;
  ProgressCallback on_progress{};  // any thread, serialized; may be empty
  // Connect the token back edge, last stage -> stage 0 (plan-ahead, proto/stage.proto).
  bool token_back_edge = false;
  SpeculationBringUp speculation{};
};

// The KV blocks to ask each stage for: scheduler.kv_blocks when set; scheduler.kv_budget
// converted with each stage's KV bytes per block (fp32 on the CPU, bf16 on CUDA); otherwise
// `default_kv_blocks` for CPU stages and 0 (size from memory) for CUDA stages.
// InvalidArgument when the budget holds no block of some stage.
absl::StatusOr<std::vector<int>> RequestedKvBlocks(const RingConfig& ring, const ModelConfig& model,
                                                   int default_kv_blocks);

// Connects, configures and joins the ring. Errors name the stage and its endpoint.
absl::StatusOr<FormedRing> FormGrpcRing(const BringUpOptions& options, const ModelConfig& model);

}  // namespace ringserve
