#include "ring/plan_codec.h"

#include "common/status_macros.h"
#include "fmt/format.h"

namespace ringserve {
namespace {

// The most drafts one chunk may verify or ask for.
constexpr int kMaxDraftsPerChunk = 64;

absl::Status DecodeChunkSpeculation(const v1::ChunkPlan& c, const std::string& where,
                                    ChunkSpeculationWire* out) {
  const v1::ChunkSpeculation& s = c.speculation();
  if (s.context_start() < 0 || s.propose() < 0 || s.propose() > kMaxDraftsPerChunk ||
      s.draft_ids_size() > kMaxDraftsPerChunk) {
    return absl::InvalidArgumentError(
        fmt::format("{}: speculation context_start {}, propose {}, {} drafts out of range", where,
                    s.context_start(), s.propose(), s.draft_ids_size()));
  }
  if (s.draft_ids_size() > 0 &&
      (c.logits() != v1::LOGITS_ALL_TOKENS || !c.has_sampling() ||
       c.num_tokens() != 1 + s.draft_ids_size() || c.score_token_ids_size() != 0)) {
    return absl::InvalidArgumentError(fmt::format(
        "{}: a verification chunk of {} drafts needs ALL_TOKENS logits, sampling, {} tokens and "
        "no score ids (has {} tokens)",
        where, s.draft_ids_size(), 1 + s.draft_ids_size(), c.num_tokens()));
  }
  out->active = true;
  out->context_start = s.context_start();
  out->context_ids.assign(s.context_ids().begin(), s.context_ids().end());
  out->draft_ids.assign(s.draft_ids().begin(), s.draft_ids().end());
  out->propose = s.propose();
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<DecodedPlan> DecodeStepPlan(const v1::StepPlan& plan, bool is_first, bool is_last,
                                           int kv_block_size) {
  DecodedPlan out;
  const uint64_t id = plan.micro_batch_id();
  if (plan.chunks().empty()) {
    return absl::InvalidArgumentError(fmt::format("micro-batch {}: no chunks", id));
  }
  int64_t total = 0;
  for (int i = 0; i < plan.chunks_size(); ++i) {
    const v1::ChunkPlan& c = plan.chunks(i);
    std::string where = fmt::format("micro-batch {} chunk {} (seq {})", id, i, c.seq_id());
    if (c.num_tokens() <= 0) {
      return absl::InvalidArgumentError(
          fmt::format("{}: num_tokens {} <= 0", where, c.num_tokens()));
    }
    if (c.start_position() < 0) {
      return absl::InvalidArgumentError(
          fmt::format("{}: start_position {} < 0", where, c.start_position()));
    }
    int64_t end = static_cast<int64_t>(c.start_position()) + c.num_tokens();
    if (kv_block_size > 0 && static_cast<int64_t>(c.block_table_size()) * kv_block_size < end) {
      return absl::InvalidArgumentError(
          fmt::format("{}: {} blocks of {} positions do not cover {} positions", where,
                      c.block_table_size(), kv_block_size, end));
    }
    SequenceChunk chunk;
    chunk.seq_id = c.seq_id();
    chunk.start_position = c.start_position();
    chunk.num_tokens = c.num_tokens();
    chunk.block_table.assign(c.block_table().begin(), c.block_table().end());
    switch (c.logits()) {
      case v1::LOGITS_NONE:
        chunk.logits = LogitsMode::kNone;
        break;
      case v1::LOGITS_LAST_TOKEN:
        chunk.logits = LogitsMode::kLastToken;
        break;
      case v1::LOGITS_ALL_TOKENS:
        chunk.logits = LogitsMode::kAllTokens;
        break;
      default:
        return absl::InvalidArgumentError(fmt::format(
            "{}: logits mode {} is not supported in plans", where, static_cast<int>(c.logits())));
    }
    ChunkOutput output;
    output.samples = chunk.logits == LogitsMode::kLastToken ||
                     (chunk.logits == LogitsMode::kAllTokens && c.has_sampling());
    if (is_last && c.has_speculation()) {
      RS_RETURN_IF_ERROR(DecodeChunkSpeculation(c, where, &output.speculation));
    }
    const bool verifies = !output.speculation.draft_ids.empty();
    if (chunk.logits == LogitsMode::kAllTokens) {
      const int expected = verifies ? 0 : c.num_tokens() - (output.samples ? 1 : 0);
      if (is_last && c.score_token_ids_size() != expected) {
        return absl::InvalidArgumentError(fmt::format(
            "{}: {} score token ids for {} tokens (the chunk {})", where, c.score_token_ids_size(),
            c.num_tokens(), output.samples ? "samples" : "does not sample"));
      }
      output.score_token_ids.assign(c.score_token_ids().begin(), c.score_token_ids().end());
    }
    if (is_last && output.samples) {
      RowSampling row;
      row.config.temperature = c.sampling().temperature();
      row.config.top_k = c.sampling().top_k();
      row.config.top_p = c.sampling().top_p() == 0.0f ? 1.0f : c.sampling().top_p();
      row.config.seed = c.sampling().seed();
      row.token_index = static_cast<uint64_t>(std::max(0, c.sampling().token_index()));
      row.top_logprobs = c.sampling().top_logprobs();
      if (row.top_logprobs < 0 || row.top_logprobs > kMaxTopLogprobs) {
        return absl::InvalidArgumentError(fmt::format("{}: top_logprobs {} not in [0, {}]", where,
                                                      row.top_logprobs, kMaxTopLogprobs));
      }
      row.suppress_token_ids.assign(c.sampling().suppress_token_ids().begin(),
                                    c.sampling().suppress_token_ids().end());
      absl::Status valid = ValidateSamplingConfig(row.config);
      if (!valid.ok()) {
        return absl::InvalidArgumentError(
            fmt::format("{}: {}", where, std::string(valid.message())));
      }
      out.sampling.push_back(row);
    }
    total += c.num_tokens();
    out.batch.chunks.push_back(std::move(chunk));
    if (is_last) out.outputs.push_back(std::move(output));
  }
  if (is_last)
    out.released_seq_ids.assign(plan.released_seq_ids().begin(), plan.released_seq_ids().end());
  if (is_first) {
    if (plan.token_ids_size() != total) {
      return absl::InvalidArgumentError(fmt::format(
          "micro-batch {}: {} token ids for {} planned tokens", id, plan.token_ids_size(), total));
    }
    out.batch.token_ids.assign(plan.token_ids().begin(), plan.token_ids().end());
  }
  return out;
}

v1::StepPlan EncodeStepPlan(uint64_t micro_batch_id, const MicroBatch& batch,
                            const std::vector<ChunkSamplingWire>& sampling, bool is_first,
                            bool is_last, const std::vector<uint64_t>& released_seq_ids) {
  v1::StepPlan plan;
  plan.set_micro_batch_id(micro_batch_id);
  for (size_t i = 0; i < batch.chunks.size(); ++i) {
    const SequenceChunk& chunk = batch.chunks[i];
    v1::ChunkPlan* c = plan.add_chunks();
    c->set_seq_id(chunk.seq_id);
    c->set_start_position(chunk.start_position);
    c->set_num_tokens(chunk.num_tokens);
    c->mutable_block_table()->Add(chunk.block_table.begin(), chunk.block_table.end());
    c->set_logits(chunk.logits == LogitsMode::kLastToken   ? v1::LOGITS_LAST_TOKEN
                  : chunk.logits == LogitsMode::kAllTokens ? v1::LOGITS_ALL_TOKENS
                                                           : v1::LOGITS_NONE);
    const bool samples =
        chunk.logits == LogitsMode::kLastToken ||
        (chunk.logits == LogitsMode::kAllTokens && i < sampling.size() && sampling[i].samples);
    if (is_last && chunk.logits == LogitsMode::kAllTokens && i < sampling.size()) {
      c->mutable_score_token_ids()->Add(sampling[i].score_token_ids.begin(),
                                        sampling[i].score_token_ids.end());
    }
    if (is_last && samples && i < sampling.size()) {
      v1::ChunkSampling* s = c->mutable_sampling();
      s->set_temperature(sampling[i].config.temperature);
      s->set_top_k(sampling[i].config.top_k);
      s->set_top_p(sampling[i].config.top_p);
      s->set_seed(sampling[i].config.seed);
      s->set_has_seed(true);
      s->set_token_index(sampling[i].token_index);
      s->set_top_logprobs(sampling[i].top_logprobs);
      s->mutable_suppress_token_ids()->Add(sampling[i].suppress_token_ids.begin(),
                                           sampling[i].suppress_token_ids.end());
    }
    if (is_last && i < sampling.size() && sampling[i].speculation.active) {
      const ChunkSpeculationWire& spec = sampling[i].speculation;
      v1::ChunkSpeculation* w = c->mutable_speculation();
      w->set_context_start(spec.context_start);
      w->mutable_context_ids()->Add(spec.context_ids.begin(), spec.context_ids.end());
      w->mutable_draft_ids()->Add(spec.draft_ids.begin(), spec.draft_ids.end());
      w->set_propose(spec.propose);
    }
  }
  if (is_last) {
    plan.mutable_released_seq_ids()->Add(released_seq_ids.begin(), released_seq_ids.end());
  }
  if (is_first) plan.mutable_token_ids()->Add(batch.token_ids.begin(), batch.token_ids.end());
  return plan;
}

}  // namespace ringserve
