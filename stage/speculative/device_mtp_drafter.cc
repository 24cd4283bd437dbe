#include "stage/speculative/device_mtp_drafter.h"

#include <algorithm>

#include "common/status_macros.h"
#include "fmt/format.h"

namespace ringserve {
namespace {

using Source = MtpDevice::Source;

int LogitRowsOf(const SequenceChunk& chunk) {
  if (chunk.logits == LogitsMode::kAllTokens) return chunk.num_tokens;
  return chunk.logits == LogitsMode::kLastToken ? 1 : 0;
}

}  // namespace

DeviceMtpDrafter::DeviceMtpDrafter(std::unique_ptr<MtpDevice> device)
    : device_(std::move(device)), regions_(device_->store_rows(), kRowsPerSequence) {}

void DeviceMtpDrafter::Sync(uint64_t seq_id, const ChunkSpeculationWire& speculation) {
  Sequence& seq = sequences_[seq_id];
  if (speculation.context_start == 0) {
    seq = Sequence{};
    regions_.Release(seq_id);  // rows of an earlier life of the sequence must not show through
  } else if (seq.lost || static_cast<int64_t>(seq.tokens.size()) < speculation.context_start) {
    Lose(seq_id, seq);
    return;
  }
  seq.tokens.resize(speculation.context_start);
  seq.tokens.insert(seq.tokens.end(), speculation.context_ids.begin(),
                    speculation.context_ids.end());
  // Pairs already fed used tokens this stage emitted itself, which the context now confirms
  // (the coordinator only ever appends verified tokens), so they stay fed.
}

void DeviceMtpDrafter::Release(uint64_t seq_id) {
  sequences_.erase(seq_id);
  regions_.Release(seq_id);
}

void DeviceMtpDrafter::Lose(uint64_t seq_id, Sequence& seq) {
  seq.lost = true;
  regions_.Release(seq_id);
}

void DeviceMtpDrafter::AddPairs(uint64_t seq_id, const Sequence& seq, int32_t first, int32_t count,
                                const std::vector<int32_t>& context, std::vector<int32_t> rows,
                                LogitsMode logits, Feed* feed) {
  SequenceChunk chunk;
  chunk.seq_id = seq_id;
  chunk.start_position = first;
  chunk.num_tokens = count;
  chunk.block_table = seq.block_table;
  chunk.logits = logits;
  feed->logit_rows += LogitRowsOf(chunk);
  feed->batch.chunks.push_back(std::move(chunk));
  for (int32_t p = first; p < first + count; ++p) feed->batch.token_ids.push_back(context[p + 1]);
  feed->rows.insert(feed->rows.end(), rows.begin(), rows.end());
}

absl::Status DeviceMtpDrafter::RunFeed(
    const Feed& feed, Source source,
    const std::function<absl::Status(size_t, size_t, int)>& after) {
  const MicroBatch& all = feed.batch;
  const std::vector<int32_t>& rows = feed.rows;
  const MtpDevice::Limits limits = device_->limits();
  size_t c = 0;
  int64_t token = 0;
  while (c < all.chunks.size()) {
    MicroBatch batch;
    std::vector<int32_t> batch_rows;
    int logit_rows = 0;
    const size_t first = c;
    while (c < all.chunks.size()) {
      const SequenceChunk& chunk = all.chunks[c];
      const bool fits =
          static_cast<int64_t>(batch.token_ids.size()) + chunk.num_tokens <= limits.max_tokens &&
          static_cast<int>(batch.chunks.size()) < limits.max_chunks &&
          logit_rows + LogitRowsOf(chunk) <= limits.max_logit_rows;
      if (!fits && !batch.chunks.empty()) break;
      batch.chunks.push_back(chunk);
      batch.token_ids.insert(batch.token_ids.end(), all.token_ids.begin() + token,
                             all.token_ids.begin() + token + chunk.num_tokens);
      batch_rows.insert(batch_rows.end(), rows.begin() + token,
                        rows.begin() + token + chunk.num_tokens);
      logit_rows += LogitRowsOf(chunk);
      token += chunk.num_tokens;
      ++c;
    }
    RS_ASSIGN_OR_RETURN(const int computed, device_->Run(batch, batch_rows, source));
    if (computed != logit_rows) {
      return absl::InternalError(
          fmt::format("the MTP layer computed {} logits rows, {} asked", computed, logit_rows));
    }
    if (after) RS_RETURN_IF_ERROR(after(first, c - first, logit_rows));
  }
  return absl::OkStatus();
}

absl::Status DeviceMtpDrafter::ObserveTarget(ModelSlice& target, const DecodedPlan& plan) {
  if (&target != &device_->target()) {
    return absl::FailedPreconditionError("the MTP drafter observes another slice");
  }
  Feed from_store, from_run;
  struct Copy {
    int run_row = 0;
    int count = 0;
    int store_row = 0;
  };
  std::vector<Copy> copies;
  int32_t row = 0;
  for (size_t c = 0; c < plan.batch.chunks.size(); ++c) {
    const SequenceChunk& chunk = plan.batch.chunks[c];
    const int32_t chunk_row = row;
    row += chunk.num_tokens;
    auto it = sequences_.find(chunk.seq_id);
    if (c >= plan.outputs.size() || !plan.outputs[c].speculation.active || it == sequences_.end() ||
        it->second.lost) {
      continue;
    }
    const uint64_t seq_id = chunk.seq_id;
    Sequence& seq = it->second;
    seq.block_table = chunk.block_table;
    const int32_t start = chunk.start_position, end = start + chunk.num_tokens;
    // Pairs (h_p, t_{p+1}) whose next token the synced context holds: p < known_end.
    const int32_t known_end = static_cast<int32_t>(seq.tokens.size()) - 1;
    // Earlier positions' pairs from the store.
    const int32_t stored_end = std::min(start, known_end);
    if (seq.fed < stored_end) {
      std::vector<int32_t> rows;
      for (int32_t p = seq.fed; p < stored_end; ++p) rows.push_back(regions_.Find(seq_id, p));
      if (std::find(rows.begin(), rows.end(), -1) != rows.end()) {
        Lose(seq_id, seq);  // positions this stage never saw (or lost)
        continue;
      }
      AddPairs(seq_id, seq, seq.fed, stored_end - seq.fed, seq.tokens, std::move(rows),
               LogitsMode::kNone, &from_store);
      seq.fed = stored_end;
    }
    // This chunk's pairs: a prompt chunk's rows but its last.
    const int32_t run_end = std::min(end, known_end);
    if (seq.fed >= start && seq.fed < run_end) {
      std::vector<int32_t> rows;
      for (int32_t p = seq.fed; p < run_end; ++p) rows.push_back(chunk_row + (p - start));
      AddPairs(seq_id, seq, seq.fed, run_end - seq.fed, seq.tokens, std::move(rows),
               LogitsMode::kNone, &from_run);
      seq.fed = run_end;
    }
    // The rows still waiting for their next token, kept in the sequence's region (positions
    // before fed + kRowsPerSequence: later ones would overwrite rows still needed).
    const int32_t keep = std::max(seq.fed, start);
    const int32_t keep_end = std::min(end, seq.fed + kRowsPerSequence);
    if (keep >= keep_end) continue;
    if (!regions_.Acquire(seq_id)) {
      Lose(seq_id, seq);  // no free region: no drafts for this sequence
      continue;
    }
    for (const MtpHiddenRegions::Run& run : regions_.Runs(seq_id, keep, keep_end - keep)) {
      copies.push_back({.run_row = chunk_row + (run.first_position - start),
                        .count = run.count,
                        .store_row = run.first_row});
    }
    for (int32_t p = keep; p < keep_end; ++p) regions_.Put(seq_id, p);
  }
  // In stream order: the stored pairs are read before the copies may overwrite their rows.
  if (!from_store.batch.chunks.empty()) {
    RS_RETURN_IF_ERROR(RunFeed(from_store, Source::kStore, {}));
  }
  for (const Copy& copy : copies) {
    RS_RETURN_IF_ERROR(device_->StoreHidden(copy.run_row, copy.count, copy.store_row));
  }
  if (!from_run.batch.chunks.empty()) {
    RS_RETURN_IF_ERROR(RunFeed(from_run, Source::kLastRun, {}));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::vector<int32_t>>> DeviceMtpDrafter::Propose(
    std::span<const Request> requests) {
  std::vector<std::vector<int32_t>> drafts(requests.size());
  Feed feed;
  std::vector<size_t> owners;  // the request of each chunk of `feed`
  for (size_t r = 0; r < requests.size(); ++r) {
    const Request& request = requests[r];
    auto it = sequences_.find(request.seq_id);
    if (request.k <= 0 || it == sequences_.end() || it->second.lost) continue;
    Sequence& seq = it->second;
    seq.drafts.clear();
    seq.probs.clear();
    std::vector<int32_t> context = seq.tokens;
    context.insert(context.end(), request.emitted.begin(), request.emitted.end());
    // Pairs (h_p, t_{p+1}) for p in [fed, last], last = the position before the newest token.
    const int32_t last = static_cast<int32_t>(context.size()) - 2;
    if (last < seq.fed) continue;
    std::vector<int32_t> rows;
    for (int32_t p = seq.fed; p <= last; ++p) rows.push_back(regions_.Find(request.seq_id, p));
    if (std::find(rows.begin(), rows.end(), -1) != rows.end()) {
      Lose(request.seq_id, seq);  // positions this stage never saw (prefix-cached blocks)
      continue;
    }
    AddPairs(request.seq_id, seq, seq.fed, last - seq.fed + 1, context, std::move(rows),
             LogitsMode::kLastToken, &feed);
    seq.fed = last + 1;
    owners.push_back(r);
  }
  if (feed.batch.chunks.empty()) return drafts;
  const size_t vocab = static_cast<size_t>(vocab_size());
  auto draw = [&](size_t first, size_t count, int logit_rows) -> absl::Status {
    if (static_cast<size_t>(logit_rows) != count) {
      return absl::InternalError("the MTP layer returned the wrong number of logits rows");
    }
    std::vector<int> to_host;
    for (size_t i = 0; i < count; ++i) {
      if (requests[owners[first + i]].sampling.config.temperature != 0.0f) {
        to_host.push_back(static_cast<int>(i));
      }
    }
    RS_ASSIGN_OR_RETURN(const MtpDevice::Outputs out, device_->Results(logit_rows, to_host));
    size_t sampled = 0;
    for (size_t i = 0; i < count; ++i) {
      const Request& request = requests[owners[first + i]];
      Sequence& seq = sequences_.at(request.seq_id);
      int32_t token = out.argmax[i];
      if (request.sampling.config.temperature != 0.0f) {
        token = DrawDraft(std::span<const float>(out.logits).subspan(sampled++ * vocab, vocab),
                          request.sampling, request.sampling.token_index, &seq.probs);
      }
      drafts[owners[first + i]] = {token};
      seq.drafts = {token};
    }
    return absl::OkStatus();
  };
  RS_RETURN_IF_ERROR(RunFeed(feed, Source::kStore, draw));
  return drafts;
}

std::span<const double> DeviceMtpDrafter::DraftProbabilities(uint64_t seq_id) const {
  auto it = sequences_.find(seq_id);
  if (it == sequences_.end()) return {};
  return it->second.probs;
}

std::span<const int32_t> DeviceMtpDrafter::LastDrafts(uint64_t seq_id) const {
  auto it = sequences_.find(seq_id);
  if (it == sequences_.end()) return {};
  return it->second.drafts;
}

}  // namespace ringserve
