// What proposes drafts on the last stage (speculator.h): a separate draft model
// (draft_model.h) or a DeepSeek checkpoint's MTP layer drafting from the target's last hidden
// states (mtp_drafter.h). Both keep per-sequence state that follows the coordinator's context
// (ChunkSpeculationWire) and roll back to the verified tokens. Not thread-safe.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ring/plan_codec.h"
#include "ring/sampling_config.h"
#include "ring/speculation_wire.h"
#include "stage/model/model_slice.h"

namespace ringserve {

class Drafter {
 public:
  virtual ~Drafter() = default;

  virtual int vocab_size() const = 0;

  // Applies a chunk's context (cut to context_start, then extended). A context that starts
  // past what the drafter knows (its state was lost) leaves the sequence without drafts until
  // it starts at 0 again.
  virtual void Sync(uint64_t seq_id, const ChunkSpeculationWire& speculation) = 0;
  virtual void Release(uint64_t seq_id) = 0;

  // After the target ran `plan` (before any Propose of this step): a drafter that drafts from
  // the target's hidden states takes them here.
  virtual absl::Status ObserveTarget(ModelSlice& /*target*/, const DecodedPlan& /*plan*/) {
    return absl::OkStatus();
  }

  struct Request {
    uint64_t seq_id = 0;
    std::vector<int32_t> emitted{};  // tokens emitted this step, after the synced context
    int k = 0;                       // drafts wanted
    RowSampling sampling{};          // token_index: the index of the first draft
  };
  // One entry per request: up to k drafts (fewer, possibly none, when the drafter cannot).
  virtual absl::StatusOr<std::vector<std::vector<int32_t>>> Propose(
      std::span<const Request> requests) = 0;

  // [drafts, vocab] distributions of the sequence's last drafts (sampled requests only); empty
  // when unknown.
  virtual std::span<const double> DraftProbabilities(uint64_t seq_id) const = 0;
  // The last drafts proposed for the sequence.
  virtual std::span<const int32_t> LastDrafts(uint64_t seq_id) const = 0;
};

// Draws one draft from a draft logits row as the drafters do: argmax when greedy, else from
// SamplingDistribution with the kDraft uniform of `token_index`, appending the distribution to
// `probs`.
int32_t DrawDraft(std::span<const float> logits, const RowSampling& sampling, uint64_t token_index,
                  std::vector<double>* probs);

}  // namespace ringserve
