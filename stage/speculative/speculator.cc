#include "stage/speculative/speculator.h"

#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "fmt/format.h"
#include "stage/last_stage_outputs.h"
#include "stage/sampling/sampler.h"
#include "stage/speculative/speculative_sampling.h"

namespace ringserve {
namespace {

// The logits rows a chunk has (ring/micro_batch.h LogitsMode).
int64_t RowsOf(const SequenceChunk& chunk) {
  return chunk.logits == LogitsMode::kAllTokens   ? chunk.num_tokens
         : chunk.logits == LogitsMode::kLastToken ? 1
                                                  : 0;
}

// At most this many logits rows are verified on the device: a CUDA slice computes up to
// max_logit_rows (its max_seqs, 256 by default) in one lm_head pass, and Sample needs them all.
constexpr int64_t kMaxDeviceVerifiedRows = 64;

// Whether every row of `plan` is greedy and asks for nothing but its token, every ALL_TOKENS
// chunk is a verification chunk, and the rows fit kMaxDeviceVerifiedRows: then the target's
// argmax of each row decides, and the slice computes it (on the GPU for a CUDA slice).
bool GreedyOnly(const DecodedPlan& plan) {
  for (const RowSampling& row : plan.sampling) {
    if (row.config.temperature != 0.0f || row.top_logprobs > 0 || !row.suppress_token_ids.empty()) {
      return false;
    }
  }
  int64_t rows = 0;
  for (size_t c = 0; c < plan.batch.chunks.size(); ++c) {
    const SequenceChunk& chunk = plan.batch.chunks[c];
    if (chunk.logits == LogitsMode::kAllTokens && plan.outputs[c].speculation.draft_ids.empty()) {
      return false;
    }
    rows += RowsOf(chunk);
  }
  return rows <= kMaxDeviceVerifiedRows;
}

}  // namespace

Speculator::Speculator(std::unique_ptr<Drafter> draft, int max_drafts)
    : draft_(std::move(draft)), max_drafts_(max_drafts) {}

bool Speculator::Applies(const DecodedPlan& plan) {
  if (!plan.released_seq_ids.empty()) return true;
  for (const ChunkOutput& output : plan.outputs) {
    if (output.speculation.active) return true;
  }
  return false;
}

SpeculatorStats Speculator::stats() const { return stats_; }

absl::Status Speculator::SampleInto(ModelSlice& target, const DecodedPlan& plan,
                                    std::vector<v1::SampledToken>* tokens,
                                    std::vector<v1::PromptLogprobs>* prompt_logprobs) {
  for (uint64_t seq_id : plan.released_seq_ids) draft_->Release(seq_id);
  const std::vector<SequenceChunk>& chunks = plan.batch.chunks;
  const int vocab_size = target.config().vocab_size;
  const size_t vocab = static_cast<size_t>(vocab_size);
  if (draft_->vocab_size() != vocab_size) {
    return absl::FailedPreconditionError(
        fmt::format("the draft model's vocabulary ({}) differs from the model's ({})",
                    draft_->vocab_size(), vocab_size));
  }
  for (size_t c = 0; c < chunks.size(); ++c) {
    const ChunkSpeculationWire& spec = plan.outputs[c].speculation;
    if (!spec.active) continue;
    if (spec.propose > max_drafts_ || static_cast<int>(spec.draft_ids.size()) > max_drafts_) {
      return absl::InvalidArgumentError(
          fmt::format("seq {}: {} drafts asked, {} verified; this stage drafts at most {}",
                      chunks[c].seq_id, spec.propose, spec.draft_ids.size(), max_drafts_));
    }
    draft_->Sync(chunks[c].seq_id, spec);
  }

  RS_RETURN_IF_ERROR(draft_->ObserveTarget(target, plan));

  // Greedy plans: the target's argmax and its log-probability of every logits row, from the
  // slice's sampler (on the GPU of a CUDA slice: ids come back, not logits rows).
  const bool greedy = GreedyOnly(plan);
  ++stats_.plans;
  const absl::Time target_start = absl::Now();
  SampledRows best;
  std::vector<float> logits;
  LastStageOutputs outputs;
  if (greedy) {
    int64_t rows = 0;
    for (const SequenceChunk& chunk : chunks) rows += RowsOf(chunk);
    std::vector<RowSampling> argmax(static_cast<size_t>(rows));
    for (RowSampling& row : argmax) row.config.temperature = 0.0f;
    RS_ASSIGN_OR_RETURN(best, target.Sample(plan.batch, argmax));
    if (static_cast<int64_t>(best.tokens.size()) != rows ||
        best.logprobs.size() != best.tokens.size()) {
      return absl::InternalError(
          fmt::format("the slice chose {} tokens for {} logits rows", best.tokens.size(), rows));
    }
    int64_t end = 0;
    for (size_t c = 0; c < chunks.size(); ++c) {
      end += RowsOf(chunks[c]);
      if (!plan.outputs[c].samples) continue;
      v1::SampledToken& token = outputs.tokens.emplace_back();
      token.set_seq_id(chunks[c].seq_id);
      token.set_token_id(best.tokens[end - 1]);
      token.set_logprob(best.logprobs[end - 1]);
    }
  } else {
    // The ordinary outputs first (verification chunks sample their last row here too; that
    // token is replaced below).
    RS_ASSIGN_OR_RETURN(logits, target.LogitsToHost());
    RS_ASSIGN_OR_RETURN(outputs, SampleAndScore(logits, vocab_size, plan));
    for (v1::PromptLogprobs& scores : outputs.prompt_logprobs) {
      if (scores.logprobs_size() > 0) prompt_logprobs->push_back(std::move(scores));
    }
  }

  stats_.target_rows_us += absl::ToInt64Microseconds(absl::Now() - target_start);

  std::vector<Drafter::Request> requests;
  std::vector<size_t> request_token;  // index into outputs.tokens
  int64_t row = 0;
  size_t next_token = 0;
  size_t next_sampling = 0;
  for (size_t c = 0; c < chunks.size(); ++c) {
    const SequenceChunk& chunk = chunks[c];
    const ChunkOutput& output = plan.outputs[c];
    row += RowsOf(chunk);
    if (!output.samples) continue;
    const RowSampling& sampling = plan.sampling[next_sampling++];
    v1::SampledToken& token = outputs.tokens[next_token++];
    const ChunkSpeculationWire& spec = output.speculation;
    std::vector<int32_t> emitted;
    if (!spec.draft_ids.empty() && greedy) {
      // Greedy: accepted while the draft is the target's argmax; then the argmax of that row.
      const int64_t first_row = row - chunk.num_tokens;
      size_t accepted = 0;
      while (accepted < spec.draft_ids.size() &&
             spec.draft_ids[accepted] == best.tokens[first_row + accepted]) {
        ++accepted;
      }
      token.set_token_id(best.tokens[first_row + accepted]);
      token.set_logprob(best.logprobs[first_row + accepted]);
      token.mutable_accepted_ids()->Add(spec.draft_ids.begin(), spec.draft_ids.begin() + accepted);
      for (size_t i = 0; i < accepted; ++i) {
        token.add_accepted_logprobs(best.logprobs[first_row + i]);
      }
      ++stats_.verifications;
      stats_.drafts_verified += static_cast<int64_t>(spec.draft_ids.size());
      stats_.drafts_accepted += static_cast<int64_t>(accepted);
      emitted.assign(spec.draft_ids.begin(), spec.draft_ids.begin() + accepted);
    } else if (!spec.draft_ids.empty()) {
      const int64_t first_row = row - chunk.num_tokens;
      std::span<const float> rows =
          std::span<const float>(logits).subspan(first_row * vocab, chunk.num_tokens * vocab);
      std::span<const double> q = draft_->DraftProbabilities(chunk.seq_id);
      std::span<const int32_t> proposed = draft_->LastDrafts(chunk.seq_id);
      const bool known = proposed.size() >= spec.draft_ids.size() &&
                         std::equal(spec.draft_ids.begin(), spec.draft_ids.end(), proposed.begin());
      Verification verified;
      if (sampling.config.temperature != 0.0f &&
          (!known || q.size() < spec.draft_ids.size() * vocab)) {
        // Without the distributions the drafts came from (this stage lost the sequence's
        // state) they cannot be verified: emit a plain sample of the first row instead, which
        // is what decoding without drafts would have drawn.
        verified.token = SampleRow(rows.subspan(0, vocab), sampling);
      } else {
        verified = VerifyDrafts(rows, vocab_size, spec.draft_ids, q, sampling);
      }
      token.set_token_id(verified.token);
      token.set_logprob(
          TokenLogprob(rows.subspan(verified.accepted.size() * vocab, vocab), verified.token));
      token.mutable_accepted_ids()->Add(verified.accepted.begin(), verified.accepted.end());
      for (size_t i = 0; i < verified.accepted.size(); ++i) {
        token.add_accepted_logprobs(
            TokenLogprob(rows.subspan(i * vocab, vocab), verified.accepted[i]));
      }
      ++stats_.verifications;
      stats_.drafts_verified += static_cast<int64_t>(spec.draft_ids.size());
      stats_.drafts_accepted += static_cast<int64_t>(verified.accepted.size());
      emitted = verified.accepted;
    }
    emitted.push_back(token.token_id());
    if (spec.active && spec.propose > 0) {
      RowSampling draft_sampling = sampling;
      draft_sampling.token_index = sampling.token_index + emitted.size();
      requests.push_back({.seq_id = chunk.seq_id,
                          .emitted = std::move(emitted),
                          .k = spec.propose,
                          .sampling = draft_sampling});
      request_token.push_back(next_token - 1);
    }
  }
  if (!requests.empty()) {
    const absl::Time draft_start = absl::Now();
    RS_ASSIGN_OR_RETURN(std::vector<std::vector<int32_t>> drafts, draft_->Propose(requests));
    stats_.draft_us += absl::ToInt64Microseconds(absl::Now() - draft_start);
    for (size_t r = 0; r < requests.size(); ++r) {
      v1::SampledToken& token = outputs.tokens[request_token[r]];
      token.mutable_draft_ids()->Add(drafts[r].begin(), drafts[r].end());
      stats_.drafts_proposed += static_cast<int64_t>(drafts[r].size());
    }
  }
  for (v1::SampledToken& token : outputs.tokens) tokens->push_back(std::move(token));
  return absl::OkStatus();
}

}  // namespace ringserve
