// Drafting with a DeepSeek checkpoint's MTP layer (stage/model/cpu_mtp_layer.h) on a CPU last
// stage: the layer predicts the token after next from the target's final hidden state h_p
// (after model.norm) and the next token t_{p+1}. Every position of a sequence feeds its pair
// (h_p, t_{p+1}) into the layer's own latent cache once both are verified; the pair of the last
// verified position gives one draft (the checkpoint's depth: num_nextn_predict_layers 1), so
// k is at most 1 here whatever the coordinator asks.
//
// Rollback: hidden states are kept by position and overwritten by every chunk that covers the
// position again (a verification chunk's rows past a rejected draft are never fed: only pairs of
// verified tokens are). A sequence whose earlier positions this stage never saw (prefix-cached
// prompt blocks) gets no drafts.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "stage/model/cpu_model_slice.h"
#include "stage/speculative/drafter.h"

namespace ringserve {

class MtpDrafter : public Drafter {
 public:
  // `target`: the CPU last slice, with its MTP layer (target->mtp() non-null); not owned.
  explicit MtpDrafter(CpuModelSlice* target) : target_(target) {}

  int vocab_size() const override { return target_->config().vocab_size; }
  void Sync(uint64_t seq_id, const ChunkSpeculationWire& speculation) override;
  void Release(uint64_t seq_id) override { sequences_.erase(seq_id); }
  absl::Status ObserveTarget(ModelSlice& target, const DecodedPlan& plan) override;
  absl::StatusOr<std::vector<std::vector<int32_t>>> Propose(
      std::span<const Request> requests) override;
  std::span<const double> DraftProbabilities(uint64_t seq_id) const override;
  std::span<const int32_t> LastDrafts(uint64_t seq_id) const override;

 private:
  struct Sequence {
    bool lost = false;
    std::vector<int32_t> tokens;                   // verified context
    std::map<int32_t, std::vector<float>> hidden;  // h_p by position, not yet fed
    int32_t fed = 0;                               // pairs (h_p, t_{p+1}) fed for p < fed
    std::vector<int32_t> block_table;              // the latest chunk's
    std::vector<int32_t> drafts;
    std::vector<double> probs;
  };
  CpuModelSlice* target_;
  std::map<uint64_t, Sequence> sequences_;
};

}  // namespace ringserve
