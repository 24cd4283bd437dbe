// The draft model of speculative decoding, on the last stage: a whole small model (every layer,
// its own paged KV cache and block allocator) that proposes the next k tokens of the sequences
// it is told about. It keeps, per sequence, the verified tokens the coordinator told it
// (ChunkSpeculationWire context), the tokens whose K/V its cache holds, and the distributions
// its last drafts were drawn from (rejection sampling needs them).
//
// Rollback: K/V at a position depends only on the tokens up to it, so the cache is valid up to
// the longest common prefix of what was fed and what is now known; rejected drafts beyond it
// are simply overwritten. A sequence whose context starts at 0 again (preemption, re-admission)
// is rebuilt from scratch.
//
// Not thread-safe: the step executor's thread drives it.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "ring/sampling_config.h"
#include "ring/speculation_wire.h"
#include "stage/model/model_slice.h"
#include "stage/speculative/drafter.h"

namespace ringserve {

class DraftModel : public Drafter {
 public:
  // `slice` holds every layer of the draft model (first and last). `max_batch_tokens` bounds
  // the tokens of one draft forward (a long context is fed in pieces). `fed_rounds`: greedy
  // drafts on a slice that samples on the device feed each round its token there (ProposeFed);
  // false makes every round's tokens come to the host first (A/B runs).
  DraftModel(std::unique_ptr<ModelSlice> slice, int max_batch_tokens, bool fed_rounds = true);

  const ModelConfig& config() const { return slice_->config(); }
  int vocab_size() const override { return slice_->config().vocab_size; }

  void Sync(uint64_t seq_id, const ChunkSpeculationWire& speculation) override;
  void Release(uint64_t seq_id) override;
  // Proposes drafts for every request, batched: the context not yet in the cache first, then
  // one token per round. Fewer than k drafts (possibly none) when the sequence's state was
  // lost or its KV blocks could not be had.
  absl::StatusOr<std::vector<std::vector<int32_t>>> Propose(
      std::span<const Request> requests) override;
  std::span<const double> DraftProbabilities(uint64_t seq_id) const override;
  std::span<const int32_t> LastDrafts(uint64_t seq_id) const override;

  int num_sequences() const { return static_cast<int>(sequences_.size()); }
  int free_blocks() const { return static_cast<int>(free_blocks_.size()); }

 private:
  struct Sequence {
    bool lost = false;            // the context could not be followed; no drafts
    std::vector<int32_t> tokens;  // verified context
    std::vector<int32_t> fed;     // tokens whose K/V the cache holds, by position
    std::vector<int32_t> blocks;
    std::vector<int32_t> drafts;
    std::vector<double> probs;  // [drafts, vocab] when sampled
  };
  // Grows seq's blocks to cover `positions`; false when the pool is exhausted.
  bool Reserve(Sequence& seq, int64_t positions);
  void FreeBlocks(Sequence& seq);
  // Runs chunks (one per entry, kLastToken when want_logits) and returns the logits rows of the
  // entries that asked, in entry order; `greedy`: their argmax instead (the slice's sampler: on
  // the GPU for a CUDA slice, so only ids come back).
  struct Piece {
    Sequence* seq = nullptr;
    uint64_t seq_id = 0;
    int32_t start = 0;
    std::vector<int32_t> tokens;
    bool want_logits = false;
  };
  struct PieceRows {
    std::vector<float> logits;    // [rows, vocab], unless greedy
    std::vector<int32_t> argmax;  // [rows], when greedy
  };
  absl::StatusOr<PieceRows> RunPieces(const std::vector<Piece>& pieces, bool greedy);
  // The micro-batch of `pieces`, as RunPieces runs it: per piece its last logits row (-1: none).
  struct PieceBatch {
    MicroBatch batch;
    std::vector<int64_t> last_rows;
    size_t logits_rows = 0;
  };
  static PieceBatch BatchPieces(const std::vector<Piece>& pieces, bool greedy);
  // Greedy drafting on a slice that samples on the device (can_sample_async): the catch-up
  // pieces in one batch, then each round fed the previous round's argmax on the device
  // (PrepareFed), every round launched before any is collected (up to the slice's
  // kMaxSamplesInFlight): no round waits for the host. Appends to drafts[request];
  // `owner`: each piece's request; `seqs` / `context_len`: as Propose keeps them. Collects every
  // sampling it started, also on error.
  absl::Status ProposeFed(std::span<const Request> requests, const std::vector<Piece>& catch_up,
                          const std::vector<size_t>& owner, std::span<Sequence* const> seqs,
                          std::span<const int64_t> context_len, int max_k,
                          std::vector<std::vector<int32_t>>& drafts);

  std::unique_ptr<ModelSlice> slice_;
  int max_batch_tokens_;
  bool fed_rounds_;
  std::vector<int32_t> free_blocks_;
  std::map<uint64_t, Sequence> sequences_;
};

}  // namespace ringserve
