// Drafting with a DeepSeek checkpoint's MTP layer held by a device slice (MtpDevice; on a CUDA
// last stage stage/cuda/cuda_mtp_layer.h run by CudaModelSlice::RunMtp, wired by
// cuda_mtp_drafter.h). The contract and the rollback
// rules are MtpDrafter's (mtp_drafter.h): every position p of a sequence feeds its pair (h_p,
// t_{p+1}) into the layer's latent cache once both are verified, the pair of the last verified
// position gives one draft (k is at most 1), a sequence whose earlier positions this stage never
// saw gets no drafts (until its context starts at 0 again), and only pairs of verified tokens
// are fed.
//
// The hidden states stay on the device. ObserveTarget feeds at once the pairs whose next token the
// synced context already holds (a prompt chunk's rows but its last) from the target's final
// hidden rows, and copies the rows still waiting for their next token (at most the 1 + k rows
// of a verification chunk) into the sequence's region of the slice's hidden store
// (MtpHiddenRegions, kRowsPerSequence rows each); Propose feeds the remaining pairs from there
// and draws the draft: greedy rows take the device's argmax (one int back), sampled rows bring
// their logits row to the host for DrawDraft (its distribution is what verification needs). A
// sequence finding no free region, or a needed row overwritten, gets no drafts.
// Not thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "stage/speculative/drafter.h"
#include "stage/speculative/mtp_device.h"
#include "stage/speculative/mtp_hidden_regions.h"

namespace ringserve {

class DeviceMtpDrafter : public Drafter {
 public:
  // Rows of the hidden store per sequence: a verification chunk's 1 + 16 rows, and slack.
  static constexpr int kRowsPerSequence = 20;

  explicit DeviceMtpDrafter(std::unique_ptr<MtpDevice> device);

  int vocab_size() const override { return device_->target().config().vocab_size; }
  void Sync(uint64_t seq_id, const ChunkSpeculationWire& speculation) override;
  void Release(uint64_t seq_id) override;
  absl::Status ObserveTarget(ModelSlice& target, const DecodedPlan& plan) override;
  absl::StatusOr<std::vector<std::vector<int32_t>>> Propose(
      std::span<const Request> requests) override;
  std::span<const double> DraftProbabilities(uint64_t seq_id) const override;
  std::span<const int32_t> LastDrafts(uint64_t seq_id) const override;

 private:
  struct Sequence {
    bool lost = false;
    std::vector<int32_t> tokens;       // verified context
    int32_t fed = 0;                   // pairs (h_p, t_{p+1}) fed for p < fed
    std::vector<int32_t> block_table;  // the latest chunk's
    std::vector<int32_t> drafts;
    std::vector<double> probs;
  };
  // Pairs to feed in one RunMtp: chunks, their t_{p+1} and the rows of their h_p.
  struct Feed {
    MicroBatch batch;
    std::vector<int32_t> rows;
    int logit_rows = 0;
  };
  void Lose(uint64_t seq_id, Sequence& seq);
  // Adds the pairs of positions [first, first + count) of `seq` to `feed`.
  static void AddPairs(uint64_t seq_id, const Sequence& seq, int32_t first, int32_t count,
                       const std::vector<int32_t>& context, std::vector<int32_t> rows,
                       LogitsMode logits, Feed* feed);

  // Runs `feed` in batches within the device's limits; after each, after(first chunk, chunks,
  // logits rows) when given.
  absl::Status RunFeed(const Feed& feed, MtpDevice::Source source,
                       const std::function<absl::Status(size_t, size_t, int)>& after);

  std::unique_ptr<MtpDevice> device_;
  MtpHiddenRegions regions_;
  std::map<uint64_t, Sequence> sequences_;
};

}  // namespace ringserve
