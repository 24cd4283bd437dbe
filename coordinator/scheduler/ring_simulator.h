// A discrete-event simulation of the ring around a Scheduler, without processes or a model:
// for scheduler tests and what-if runs. Single-threaded and deterministic.
//
// Cost model (state it when quoting numbers):
//   - a stage works on one micro-batch at a time, FIFO, for batch_cost + token_cost * tokens;
//   - a micro-batch then travels to the next stage (or, from the last, back to the
//     coordinator) in hop_latency, during which no stage is busy;
//   - the coordinator plans instantly: whenever fewer than M plans are in flight it calls
//     NextMicroBatch() and the plan enters stage 0's queue at once.
// The "model" is a function of (seq id, token index) that returns the sampled token, so every
// request's expected output is known whatever the batching, preemption or partition.
//
// The simulator also checks what a real ring relies on, and records a violation (never aborts):
//   - each stage keeps a simulated KV cache (block, offset) -> (seq, position, token); a chunk
//     must find its positions [0, start) in its block table written with the sequence's own
//     tokens at those positions (by itself, or by a sequence with the same prefix: a prefix-
//     cache hit) (catches clobbered or freed-and-reused blocks, bad block tables, wrong
//     re-prefill after preemption);
//   - a chunk's token ids are the sequence's prompt + sampled tokens at those positions;
//   - a sampling chunk's token_index equals the tokens generated so far;
//   - Scheduler::CheckInvariants() after every event (when check_invariants).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "coordinator/scheduler/scheduler.h"

namespace ringserve {

struct RingSimOptions {
  int num_stages = 1;
  double batch_cost = 1.0;   // per micro-batch per stage
  double token_cost = 0.0;   // per token per stage
  double hop_latency = 0.0;  // between stages and back to the coordinator
  bool check_invariants = true;
  // The sampled token of sequence `seq_id` at generated index `token_index`.
  std::function<int32_t(uint64_t seq_id, int32_t token_index)> sample = [](uint64_t seq_id,
                                                                           int32_t token_index) {
    return static_cast<int32_t>(100 + (seq_id * 7919 + token_index * 104729) % 1000);
  };
};

struct SimRequest {
  double arrival_time = 0;
  uint64_t seq_id = 0;
  std::vector<int32_t> prompt;
  SequenceParams params;
  double cancel_time = -1;  // < 0: never cancelled
};

struct SimStageSpan {
  uint64_t plan_id = 0;
  double start = 0;
  double end = 0;
  int num_tokens = 0;
};

struct SimPlanRecord {
  uint64_t plan_id = 0;
  double issue_time = 0;
  double done_time = -1;
  int num_decodes = 0;
  int num_prefill_tokens = 0;  // tokens of chunks that are not decodes
  int num_chunks = 0;
  int num_preempted = 0;
};

struct SimRequestResult {
  std::vector<int32_t> tokens;
  std::vector<double> token_times;
  FinishReason finish_reason = FinishReason::kNone;  // kCancelled for cancelled ones
  double finish_time = -1;
};

struct SimResult {
  double end_time = 0;
  std::map<uint64_t, SimRequestResult> requests;
  std::vector<std::vector<SimStageSpan>> stage_spans;  // [stage] -> spans in time order
  std::vector<SimPlanRecord> plans;                    // in plan id order
  std::vector<std::string> violations;                 // empty when all checks held
  int64_t preemptions = 0;
  int kv_blocks_used_at_end = 0;

  // Busy time of `stage` inside [from, to).
  double BusyTime(int stage, double from, double to) const;
  // Tokens returned to the coordinator inside [from, to).
  int64_t TokensBetween(double from, double to) const;
};

// Runs `requests` through `scheduler` until all are finished or cancelled, or until `max_time`
// (then `violations` says so). The scheduler must be fresh and its num_stages ==
// options.num_stages.
SimResult SimulateRing(Scheduler& scheduler, const RingSimOptions& options,
                       std::vector<SimRequest> requests, double max_time = 1e9);

}  // namespace ringserve
