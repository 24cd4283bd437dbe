// Starts a RingEngine over stage processes: loads the served model, forms the ring with
// FormGrpcRing, and re-forms it after a failure (starting local stage processes that died
// again first). What `coordinator` runs, and what tests that want a whole ring use.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "coordinator/local_stages.h"
#include "coordinator/ring_bringup.h"
#include "coordinator/ring_engine.h"

namespace ringserve {

struct GrpcRingEngineOptions {
  BringUpOptions bring_up{};  // bring_up.ring: the validated RingConfig
  DecodePacking packing = DecodePacking::kSpread;
  // Plans sent ahead (coordinator/plan_ahead.h); the ring gets its token back edge.
  bool plan_ahead = true;
  // Prefix caching (coordinator/scheduler/kv_block_manager.h); off for A/B runs.
  bool prefix_caching = true;
  // Speculative decoding: back off while more sequences than this decode at once
  // (SpeculationOptions::max_decoding_sequences); k at most is bring_up.speculation.num_tokens.
  int speculation_max_sequences = SpeculationOptions{}.max_decoding_sequences;
  // Speculate only where it measures faster (SpeculationPayoffOptions::enabled).
  bool speculation_payoff = true;
  // Local stage processes of an embedded ring, started again when they exited; not owned,
  // must outlive the engine. Null for stages under a supervisor (hosts.yaml).
  LocalStages* local_stages = nullptr;
  bool recover = true;  // re-form the ring after a failure instead of failing every request
  absl::Duration ring_down_timeout = absl::Seconds(kDefaultRingDownTimeoutSeconds);
};

absl::StatusOr<std::unique_ptr<RingEngine>> StartGrpcRingEngine(GrpcRingEngineOptions options);

}  // namespace ringserve
