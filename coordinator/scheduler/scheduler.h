// The ring's scheduler: continuous batching over a paged KV cache, chunked prefill mixed with
// decodes, and decode spreading over the micro-batches in flight. Pure and deterministic: no
// threads, no I/O, no clock; everything it decides is a function of the calls made on it.
//
// How the engine drives it:
//   - AddRequest() when a request arrives; Cancel()/Finish() when it goes away or a stop string
//     matched (stop strings need detokenized text, so the engine matches them).
//   - While fewer than max_micro_batches_in_flight plans are in flight, call NextMicroBatch();
//     send the plan to the stages; nullopt = nothing to run now.
//   - When the last stage returns the sampled tokens of a plan, call OnMicroBatchDone(); it
//     appends the tokens, applies the token-level stop conditions (EOS ids unless ignore_eos,
//     the request's stop token ids, max_tokens, context/KV capacity) and reports, per sequence,
//     the new token and whether the sequence finished. Finished sequences' blocks are free.
//   Plans complete in the order they were issued (the ring is in order); the scheduler depends
//   on it only with plan_ahead (a follow-up's tokens come after its base's: InvalidArgument
//   otherwise).
//
// Policy, per NextMicroBatch() call, under `max_tokens_per_micro_batch` tokens:
//   1. Decodes (running sequences with a sampled token not yet fed), oldest request first. In
//      kSpread mode at most ceil(D / M) of them, D = all decoding sequences (runnable or in
//      flight), and at most ceil(R / F) with R runnable and F free slots of the M: so D decodes
//      spread over M balanced micro-batches (9 over 4: 3, 2, 2, 2) and every stage of the ring
//      has work every step. In kPacked mode all D at once, only when all D are back (the
//      comparison baseline).
//   2. Prefill chunks of running sequences (oldest first), then admission of waiting requests
//      (oldest first, preempted ones keep their original place), each chunk cut to the tokens
//      left in the budget and to the KV blocks that can be had. So a decode waits for at most
//      one prefill chunk, however long the prompt.
//   A sequence's chunk that samples (a decode, or the last chunk of a prompt) is the only chunk
//   of that sequence in flight: its next token depends on it. Non-final prefill chunks of one
//   sequence may be in flight in consecutive micro-batches at once: every stage runs
//   micro-batches in order, so a chunk's K/V is written before the next chunk reads it.
//
// KV blocks (global: capacity = min over stages, ids valid on every stage) are allocated when a
// chunk is planned, to cover its positions. When a running sequence needs blocks and none are
// free, the youngest running sequence not in flight is preempted by recompute: its blocks are
// freed and it goes back to the waiting queue with its generated tokens kept; on re-admission
// prompt + generated is prefilled again and sampling continues at the same token index. The
// oldest request is never preempted while others hold blocks, so it always progresses (no
// deadlock, no livelock). Blocks of a cancelled sequence are freed at once even if a plan that
// names them is in flight: stages run plans in order, so a later owner's writes come after.
// AddRequest clamps max_tokens so that one request alone always fits in the cache and context;
// hitting that clamp finishes the request with kLength.
//
// Not thread-safe: the engine calls it from one thread (or under one lock).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "coordinator/engine.h"
#include "coordinator/scheduler/kv_block_manager.h"
#include "coordinator/scheduler/speculation.h"
#include "ring/defaults.h"
#include "ring/micro_batch.h"
#include "ring/speculation_wire.h"

namespace ringserve {

enum class DecodePacking {
  kSpread,  // runnable decodes split over the M micro-batches in flight (~ceil(D / M) each)
  // All decodes in one micro-batch: a decode step waits until every decoding sequence is back
  // (the baseline for comparison, as a scheduler without pipeline awareness does it).
  kPacked,
};

struct SchedulerOptions {
  int num_stages = 1;                   // S >= 1
  int max_micro_batches_in_flight = 0;  // M >= 1; 0 = num_stages
  int max_tokens_per_micro_batch = kDefaultMaxTokensPerMicroBatch;
  int max_sequences_per_micro_batch = 256;
  int max_running_sequences = 256;          // admitted (holding or about to hold KV blocks)
  int kv_block_size = kDefaultKvBlockSize;  // positions per block
  int kv_num_blocks = 256;                  // per stage pool = global capacity (min over stages)
  int max_context = 0;  // positions per sequence (prompt + generated); 0 = no limit
  std::vector<int32_t> eos_token_ids;
  DecodePacking decode_packing = DecodePacking::kSpread;
  // Reuse the KV blocks of identical prompt prefixes (kv_block_manager.h): a request whose
  // leading full blocks are cached skips computing them.
  bool prefix_caching = true;
  // Plans sent ahead (coordinator/plan_ahead.h): a micro-batch's follow-up is planned while it
  // is in flight, assuming each of its sampling sequences continues; its tokens reach stage 0
  // over the ring's token back edge. Up to 2 M plans in flight (M chains of two). Off in
  // kPacked mode. No follow-up is planned while a sequence speculates (in the plan to follow
  // or ready to run): speculating sequences wait for each result and decode in the M chains.
  bool plan_ahead = false;
  // Speculative decoding (speculation.h): off while speculation.max_drafts is 0. Sequences that
  // ask for prompt log-probabilities never speculate.
  SpeculationOptions speculation{};
};

// Token-level limits of one request (sampling parameters stay with the engine).
struct SequenceParams {
  int max_tokens = 16;                  // >= 1
  std::vector<int32_t> stop_token_ids;  // finish (kStop) after sampling one of these
  bool ignore_eos = false;              // do not stop on SchedulerOptions::eos_token_ids
  // Prompt log-probabilities: chunks that hold prompt positions ask for every row's logits
  // (kAllTokens) and carry the ids their rows are scored against (PlannedChunk).
  bool prompt_logprobs = false;
};

// One chunk of a plan, parallel to MicroBatchPlan::batch.chunks.
struct PlannedChunk {
  uint64_t seq_id = 0;
  bool is_decode = false;  // one token: the last sampled token of a running sequence (a decode)
  bool samples = false;    // chunk.logits != kNone: the last stage samples one token for it
  // When `samples`: the index of the token to be generated within its request (tokens
  // generated so far). Keys the sampler's RNG, so it survives preemption and re-prefill.
  int32_t token_index = 0;
  // kAllTokens chunks (SequenceParams::prompt_logprobs): the tokens at positions start + 1 ..
  // of the chunk, one per row that has a known next token (num_tokens, or num_tokens - 1 when
  // the chunk samples).
  std::vector<int32_t> score_token_ids{};
  // Planned ahead: a decode whose input token is not known yet: the token plan
  // MicroBatchPlan::tokens_from samples for the sequence, which stage 0 takes from the token
  // back edge. batch.token_ids holds 0 in its place.
  bool ahead = false;
  // A speculating sequence (ring/speculation_wire.h): what the last stage is told. A
  // verification chunk (is_decode, 1 + draft_ids.size() tokens) has draft ids.
  ChunkSpeculationWire speculation{};
};

struct MicroBatchPlan {
  uint64_t id = 0;  // increasing from 1; names the plan in OnMicroBatchDone and in logs
  // What the stages run: chunks (seq id, start position, tokens, block table, logits mode:
  // kAllTokens for prompt chunks of a sequence that asked for prompt log-probabilities, else
  // kLastToken where a token is sampled, else kNone) and stage 0's token ids, chunk after chunk.
  MicroBatch batch;
  std::vector<PlannedChunk> entries;  // one per batch.chunks entry, same order
  // Sequences preempted (by recompute) while building this plan. Informational: they were
  // requeued and continue by themselves; stages need not do anything (their blocks are free).
  std::vector<uint64_t> preempted;
  // Plan-ahead (SchedulerOptions::plan_ahead): the plan whose sampled tokens the ahead chunks
  // feed (0: none); stage 0 first takes the back edge's messages of every plan up to
  // back_edge_through (all of them sent by then), and may forget those of plans below
  // back_edge_keep_from afterwards (no later plan names them).
  uint64_t tokens_from = 0;
  uint64_t back_edge_through = 0;
  uint64_t back_edge_keep_from = 0;
  // Sequences the last stage may drop its speculation state of (finished, cancelled,
  // preempted since the previous plan).
  std::vector<uint64_t> released_speculation{};

  int num_sampled() const;  // chunks that sample = tokens OnMicroBatchDone expects
  int num_decodes() const;  // chunks with is_decode
  int64_t num_tokens() const { return batch.TotalTokens(); }
};

// One sampled token, as OnMicroBatchDone reports it.
struct TokenUpdate {
  uint64_t seq_id = 0;
  int32_t token = 0;
  int32_t token_index = 0;  // index within the request's generated tokens
  // kNone: continues. kStop: EOS or a stop token id (the token is still reported; the engine
  // decides whether to show its text). kLength: max_tokens (or the clamp) reached.
  FinishReason finish_reason = FinishReason::kNone;
};

struct MicroBatchResult {
  // In plan order; tokens of sequences cancelled or finished meanwhile are discarded, not listed.
  std::vector<TokenUpdate> tokens;
};

struct SchedulerStats {
  int waiting = 0;  // queued, not holding blocks (new or preempted)
  int running = 0;  // admitted
  int micro_batches_in_flight = 0;
  int kv_blocks_used = 0;
  int kv_blocks_total = 0;
  int64_t preemptions = 0;  // cumulative
  int64_t micro_batches_planned = 0;
  int64_t tokens_generated = 0;      // cumulative, sampled tokens accepted
  int kv_blocks_cached = 0;          // cached prefix blocks nobody holds (evictable)
  int64_t prefix_lookup_tokens = 0;  // tokens of admitted sequences, cumulative
  int64_t prefix_hit_tokens = 0;     // of those, found in the prefix cache (not computed)
  int64_t ahead_decodes = 0;         // decodes planned ahead, cumulative
  int64_t ahead_discarded = 0;       // of those, tokens discarded (the sequence had finished)
  // Speculative decoding, cumulative.
  int64_t verification_chunks = 0;       // verification chunks whose result came back
  int64_t drafts_verified = 0;           // drafts those chunks carried
  int64_t drafts_accepted = 0;           // of those, accepted
  int64_t tokens_from_verification = 0;  // tokens those chunks emitted (accepted + 1)
};

class Scheduler {
 public:
  // InvalidArgument naming the option for values out of range.
  static absl::Status Validate(const SchedulerOptions& options);
  // `options` must be valid (Validate); otherwise this is a programmer error and aborts.
  explicit Scheduler(SchedulerOptions options);

  const SchedulerOptions& options() const { return options_; }
  int max_micro_batches_in_flight() const { return max_in_flight_; }

  // Queues a request. InvalidArgument: duplicate id (among unfinished), empty prompt,
  // max_tokens < 1, or a prompt that cannot fit (prompt length >= max_context, or more than
  // the whole KV cache). max_tokens is clamped to what fits (see above).
  // `generated`: tokens this request already generated (a request resumed after the ring
  // failed): it continues like a preempted sequence, recomputing prompt + generated, and its
  // next token has token_index generated.size(). They count towards max_tokens;
  // InvalidArgument if they already reach it.
  absl::Status AddRequest(uint64_t seq_id, std::vector<int32_t> prompt_ids, SequenceParams params,
                          std::vector<int32_t> generated = {});

  // Removes a request wherever it is and frees its blocks; a token of it that comes back from
  // an in-flight plan is discarded. Returns false for unknown (or already finished) ids.
  // Cancel is for client cancellation, Finish for a stop string the engine matched; they differ
  // only in the statistics.
  bool Cancel(uint64_t seq_id);
  bool Finish(uint64_t seq_id);

  // The next micro-batch to send, or nullopt when M plans are in flight or nothing can run.
  // With plan_ahead: M chains are in flight, each a plan and at most one follow-up of it;
  // a new chain is preferred, then the follow-up of the oldest plan that has none.
  std::optional<MicroBatchPlan> NextMicroBatch();

  // Accepts the sampled tokens of plan `plan_id`: one per chunk with `samples`, in chunk order.
  // `speculation`: empty, or parallel to sampled_tokens (accepted drafts before each token and
  // the drafts proposed after it); a verification chunk's sequence rolls back to its verified
  // length. InvalidArgument (nothing changes) for an unknown plan id, a wrong token count or
  // more accepted drafts than the chunk verified.
  absl::StatusOr<MicroBatchResult> OnMicroBatchDone(
      uint64_t plan_id, std::span<const int32_t> sampled_tokens,
      std::span<const SpeculativeTokens> speculation = {});

  // The ring failed to run plan `plan_id` (a stage error). Removes the plan and every sequence
  // in it (blocks freed) and returns their ids, so the engine can finish them with kError.
  // Unknown plan ids return an empty list.
  std::vector<uint64_t> OnMicroBatchFailed(uint64_t plan_id);

  // True while any request is waiting, running or any plan is in flight.
  bool HasWork() const;
  int num_in_flight() const;
  SchedulerStats Stats() const;

  // Generated tokens of an unfinished request so far; empty for unknown ids.
  std::vector<int32_t> GeneratedTokens(uint64_t seq_id) const;

  // Checks internal consistency (for tests): every block is either free or owned by exactly one
  // sequence, block tables cover the positions planned, in-flight bookkeeping matches.
  // Internal error naming the broken invariant.
  absl::Status CheckInvariants() const;

  ~Scheduler();
  Scheduler(Scheduler&&) noexcept;
  Scheduler& operator=(Scheduler&&) noexcept;
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

 private:
  struct State;
  // One plan; `follows`: the in-flight plan it follows (plan-ahead), 0 for a new chain.
  // `open_slots`: the plans that could be built now (>= 1), over which ready decodes spread.
  std::optional<MicroBatchPlan> BuildMicroBatch(uint64_t follows, int64_t open_slots);
  double SpeculationNow() const;  // SpeculationOptions::clock, seconds
  SchedulerOptions options_;
  int max_in_flight_;
  std::unique_ptr<State> state_;
};

}  // namespace ringserve
