#include "stage/last_stage_outputs.h"

#include "common/status_macros.h"
#include "fmt/format.h"
#include "stage/sampling/row_extras.h"
#include "stage/sampling/sampler.h"

namespace ringserve {
namespace {

int64_t RowsOf(const SequenceChunk& chunk) {
  switch (chunk.logits) {
    case LogitsMode::kNone:
      return 0;
    case LogitsMode::kLastToken:
      return 1;
    case LogitsMode::kAllTokens:
      return chunk.num_tokens;
  }
  return 0;
}

}  // namespace

bool NeedsHostLogits(const DecodedPlan& plan) {
  if (HasAllTokensChunk(plan.batch)) return true;
  for (const RowSampling& row : plan.sampling) {
    if (row.top_logprobs > 0 || !row.suppress_token_ids.empty()) return true;
  }
  return false;
}

bool HasAllTokensChunk(const MicroBatch& batch) {
  for (const SequenceChunk& chunk : batch.chunks) {
    if (chunk.logits == LogitsMode::kAllTokens) return true;
  }
  return false;
}

absl::StatusOr<LastStageOutputs> SampleAndScore(std::span<const float> logits, int vocab_size,
                                                const DecodedPlan& plan) {
  const std::vector<SequenceChunk>& chunks = plan.batch.chunks;
  if (vocab_size < 1 || plan.outputs.size() != chunks.size()) {
    return absl::InternalError(fmt::format("{} chunk outputs for {} chunks (vocab {})",
                                           plan.outputs.size(), chunks.size(), vocab_size));
  }
  int64_t rows = 0;
  for (const SequenceChunk& chunk : chunks) rows += RowsOf(chunk);
  if (logits.size() != static_cast<size_t>(rows) * vocab_size) {
    return absl::InternalError(fmt::format("slice returned {} logits, expected {} rows x {}",
                                           logits.size(), rows, vocab_size));
  }
  const size_t vocab = static_cast<size_t>(vocab_size);
  auto row_at = [&](int64_t row) { return logits.subspan(row * vocab, vocab); };

  // The rows that sample, contiguous: the logits themselves unless some chunk has every row.
  std::vector<int64_t> sample_rows;
  int64_t row = 0;
  for (size_t c = 0; c < chunks.size(); ++c) {
    row += RowsOf(chunks[c]);
    if (plan.outputs[c].samples) sample_rows.push_back(row - 1);
  }
  if (sample_rows.size() != plan.sampling.size()) {
    return absl::InternalError(fmt::format("{} sampling chunks, {} sampling requests",
                                           sample_rows.size(), plan.sampling.size()));
  }
  std::span<const float> sample_logits = logits;
  std::vector<float> gathered;
  if (static_cast<int64_t>(sample_rows.size()) != rows) {
    gathered.reserve(sample_rows.size() * vocab);
    for (int64_t r : sample_rows) {
      std::span<const float> src = row_at(r);
      gathered.insert(gathered.end(), src.begin(), src.end());
    }
    sample_logits = gathered;
  }
  RS_ASSIGN_OR_RETURN(std::vector<int32_t> sampled,
                      SampleTokens(sample_logits, vocab_size, plan.sampling));

  LastStageOutputs out;
  row = 0;
  size_t next_sample = 0;
  for (size_t c = 0; c < chunks.size(); ++c) {
    const SequenceChunk& chunk = chunks[c];
    const ChunkOutput& output = plan.outputs[c];
    if (chunk.logits == LogitsMode::kAllTokens) {
      if (output.score_token_ids.size() > static_cast<size_t>(chunk.num_tokens)) {
        return absl::InternalError(fmt::format("seq {}: {} score ids for {} rows", chunk.seq_id,
                                               output.score_token_ids.size(), chunk.num_tokens));
      }
      v1::PromptLogprobs scores;
      scores.set_seq_id(chunk.seq_id);
      scores.set_start_position(chunk.start_position);
      for (size_t i = 0; i < output.score_token_ids.size(); ++i) {
        scores.add_logprobs(
            TokenLogprob(row_at(row + static_cast<int64_t>(i)), output.score_token_ids[i]));
      }
      out.prompt_logprobs.push_back(std::move(scores));
    }
    row += RowsOf(chunk);
    if (output.samples) {
      const int top_n = plan.sampling[next_sample].top_logprobs;
      const int32_t token = sampled[next_sample++];
      v1::SampledToken t;
      t.set_seq_id(chunk.seq_id);
      t.set_token_id(token);
      t.set_logprob(TokenLogprob(row_at(row - 1), token));
      for (const TopLogprob& top : TopLogprobs(row_at(row - 1), top_n)) {
        t.add_top_token_ids(top.token);
        t.add_top_logprobs(top.logprob);
      }
      out.tokens.push_back(t);
    }
  }
  return out;
}

}  // namespace ringserve
