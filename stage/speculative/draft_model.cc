#include "stage/speculative/draft_model.h"

#include <algorithm>
#include <deque>
#include <utility>

#include "common/status_macros.h"
#include "fmt/format.h"
#include "stage/sampling/sampler.h"
#include "stage/speculative/speculative_sampling.h"

namespace ringserve {
namespace {

// Greedy pieces of up to this many tokens take every row's logits (CUDA graphs run them).
constexpr int32_t kGraphedPiece = 17;
// ... while the batch's logits rows stay within this (a CUDA slice samples only the rows of one
// lm_head pass: max_logit_rows, 256 by default).
constexpr size_t kMaxAllRows = 64;

}  // namespace

int32_t DrawDraft(std::span<const float> logits, const RowSampling& sampling, uint64_t token_index,
                  std::vector<double>* probs) {
  if (sampling.config.temperature == 0.0f) return GreedyToken(logits);
  std::vector<double> q = SamplingDistribution(logits, sampling.config);
  const int32_t token = DrawFromDistribution(
      q, SpeculativeUniform(sampling.config, token_index, SpeculativeDraw::kDraft));
  probs->insert(probs->end(), q.begin(), q.end());
  return token;
}

DraftModel::DraftModel(std::unique_ptr<ModelSlice> slice, int max_batch_tokens, bool fed_rounds)
    : slice_(std::move(slice)),
      max_batch_tokens_(std::max(1, max_batch_tokens)),
      fed_rounds_(fed_rounds) {
  const int blocks = slice_->options().kv_num_blocks;
  free_blocks_.reserve(blocks);
  for (int b = blocks - 1; b >= 0; --b) free_blocks_.push_back(b);
}

void DraftModel::FreeBlocks(Sequence& seq) {
  free_blocks_.insert(free_blocks_.end(), seq.blocks.begin(), seq.blocks.end());
  seq.blocks.clear();
  seq.fed.clear();
}

bool DraftModel::Reserve(Sequence& seq, int64_t positions) {
  const int64_t block_size = slice_->options().kv_block_size;
  const int64_t want = (positions + block_size - 1) / block_size;
  if (want > static_cast<int64_t>(seq.blocks.size() + free_blocks_.size())) return false;
  while (static_cast<int64_t>(seq.blocks.size()) < want) {
    seq.blocks.push_back(free_blocks_.back());
    free_blocks_.pop_back();
  }
  return true;
}

void DraftModel::Sync(uint64_t seq_id, const ChunkSpeculationWire& speculation) {
  Sequence& seq = sequences_[seq_id];
  if (speculation.context_start == 0) {
    FreeBlocks(seq);
    seq = Sequence{};
  } else if (seq.lost || static_cast<int64_t>(seq.tokens.size()) < speculation.context_start) {
    seq.lost = true;
    return;
  }
  seq.tokens.resize(speculation.context_start);
  seq.tokens.insert(seq.tokens.end(), speculation.context_ids.begin(),
                    speculation.context_ids.end());
}

void DraftModel::Release(uint64_t seq_id) {
  auto it = sequences_.find(seq_id);
  if (it == sequences_.end()) return;
  FreeBlocks(it->second);
  sequences_.erase(it);
}

std::span<const double> DraftModel::DraftProbabilities(uint64_t seq_id) const {
  auto it = sequences_.find(seq_id);
  if (it == sequences_.end()) return {};
  return it->second.probs;
}

std::span<const int32_t> DraftModel::LastDrafts(uint64_t seq_id) const {
  auto it = sequences_.find(seq_id);
  if (it == sequences_.end()) return {};
  return it->second.drafts;
}

DraftModel::PieceBatch DraftModel::BatchPieces(const std::vector<Piece>& pieces, bool greedy) {
  PieceBatch out;
  for (const Piece& piece : pieces) {
    SequenceChunk chunk;
    chunk.seq_id = piece.seq_id;
    chunk.start_position = piece.start;
    chunk.num_tokens = static_cast<int32_t>(piece.tokens.size());
    chunk.block_table = piece.seq->blocks;
    // Greedy: a short piece asks for every row's logits (and its last row's argmax is taken),
    // which lets a CUDA slice run the batch in a CUDA graph, as a verification chunk.
    const bool all_rows = greedy && piece.want_logits && chunk.num_tokens > 1 &&
                          chunk.num_tokens <= kGraphedPiece &&
                          out.logits_rows + chunk.num_tokens <= kMaxAllRows;
    chunk.logits = all_rows            ? LogitsMode::kAllTokens
                   : piece.want_logits ? LogitsMode::kLastToken
                                       : LogitsMode::kNone;
    out.logits_rows += all_rows ? chunk.num_tokens : piece.want_logits ? 1 : 0;
    out.last_rows.push_back(piece.want_logits ? static_cast<int64_t>(out.logits_rows) - 1 : -1);
    out.batch.chunks.push_back(std::move(chunk));
    out.batch.token_ids.insert(out.batch.token_ids.end(), piece.tokens.begin(), piece.tokens.end());
  }
  return out;
}

absl::StatusOr<DraftModel::PieceRows> DraftModel::RunPieces(const std::vector<Piece>& pieces,
                                                            bool greedy) {
  PieceBatch pieced = BatchPieces(pieces, greedy);
  const MicroBatch& batch = pieced.batch;
  const size_t logits_rows = pieced.logits_rows;
  const std::vector<int64_t>& last_rows = pieced.last_rows;
  RS_RETURN_IF_ERROR(slice_->Prepare(batch));
  RS_RETURN_IF_ERROR(slice_->Run(batch));
  PieceRows out;
  if (logits_rows == 0) return out;
  if (greedy) {
    std::vector<RowSampling> rows(logits_rows);
    for (RowSampling& row : rows) row.config.temperature = 0.0f;
    RS_ASSIGN_OR_RETURN(SampledRows sampled, slice_->Sample(batch, rows));
    if (sampled.tokens.size() != logits_rows) {
      return absl::InternalError("the draft model sampled too few logits rows");
    }
    for (int64_t row : last_rows) {
      if (row >= 0) out.argmax.push_back(sampled.tokens[row]);
    }
    return out;
  }
  RS_ASSIGN_OR_RETURN(out.logits, slice_->LogitsToHost());
  return out;
}

absl::Status DraftModel::ProposeFed(std::span<const Request> requests,
                                    const std::vector<Piece>& catch_up,
                                    const std::vector<size_t>& owner,
                                    std::span<Sequence* const> seqs,
                                    std::span<const int64_t> context_len, int max_k,
                                    std::vector<std::vector<int32_t>>& drafts) {
  // A sampling in flight: its batch (kept alive until collected) and the (request, row) of
  // each draft it draws.
  struct Round {
    MicroBatch batch;
    std::vector<std::pair<size_t, int64_t>> drafted{};
  };
  std::deque<Round> rounds;  // started, not yet collected
  int sampling = 0;          // samplings in flight on the slice
  auto launch = [&](Round& round, size_t rows) -> absl::Status {
    std::vector<RowSampling> argmax(rows);
    for (RowSampling& row : argmax) row.config.temperature = 0.0f;
    RS_RETURN_IF_ERROR(slice_->Run(round.batch));
    RS_RETURN_IF_ERROR(slice_->SampleAsync(round.batch, argmax));
    ++sampling;
    return absl::OkStatus();
  };
  auto collect = [&]() -> absl::Status {
    absl::StatusOr<SampledRows> sampled = slice_->WaitSample();
    --sampling;
    const Round round = std::move(rounds.front());
    rounds.pop_front();
    if (!sampled.ok()) return sampled.status();
    for (const auto& [request, row] : round.drafted) {
      if (row >= static_cast<int64_t>(sampled->tokens.size())) {
        return absl::InternalError("the draft model sampled too few logits rows");
      }
      drafts[request].push_back(sampled->tokens[row]);
    }
    return absl::OkStatus();
  };
  auto run = [&]() -> absl::Status {
    PieceBatch first = BatchPieces(catch_up, /*greedy=*/true);
    // Each request's newest draft: its row in the newest sampling (-1: it drafts no more).
    std::vector<int64_t> newest(requests.size(), -1);
    Round& start = rounds.emplace_back(Round{.batch = std::move(first.batch)});
    for (size_t i = 0; i < catch_up.size(); ++i) {
      if (first.last_rows[i] < 0) continue;
      start.drafted.emplace_back(owner[i], first.last_rows[i]);
      newest[owner[i]] = first.last_rows[i];
    }
    RS_RETURN_IF_ERROR(slice_->Prepare(start.batch));
    RS_RETURN_IF_ERROR(launch(start, first.logits_rows));
    for (int r = 1; r < max_k; ++r) {
      Round round;
      std::vector<TokenFeed> feeds;
      std::vector<int64_t> next(requests.size(), -1);
      for (size_t q = 0; q < requests.size(); ++q) {
        if (newest[q] < 0 || requests[q].k <= r) continue;
        const int32_t row = static_cast<int32_t>(round.batch.chunks.size());
        round.batch.chunks.push_back(
            SequenceChunk{.seq_id = requests[q].seq_id,
                          .start_position = static_cast<int32_t>(context_len[q] + r - 1),
                          .num_tokens = 1,
                          .block_table = seqs[q]->blocks,
                          .logits = LogitsMode::kLastToken});
        round.batch.token_ids.push_back(0);  // fed on the device
        feeds.push_back(
            TokenFeed{.token_row = row, .sampled_row = static_cast<int32_t>(newest[q])});
        round.drafted.emplace_back(q, row);
        next[q] = row;
      }
      if (round.batch.chunks.empty()) break;
      // The rounds run ahead of the host as far as the slice holds samplings in flight: the
      // host collects a round's drafts only to make room.
      if (sampling >= ModelSlice::kMaxSamplesInFlight) RS_RETURN_IF_ERROR(collect());
      Round& fed = rounds.emplace_back(std::move(round));
      RS_RETURN_IF_ERROR(slice_->PrepareFed(fed.batch, feeds));
      RS_RETURN_IF_ERROR(launch(fed, fed.batch.chunks.size()));
      newest = std::move(next);
    }
    while (sampling > 0) RS_RETURN_IF_ERROR(collect());
    return absl::OkStatus();
  };
  const absl::Status status = run();
  // After an error: what is still in flight is collected and dropped (the slice takes no other
  // use of its logits before).
  for (; sampling > 0; --sampling) (void)slice_->WaitSample();
  if (!status.ok()) return status;
  // Every draft but the last of each request was fed: its K/V is in the cache.
  for (size_t q = 0; q < requests.size(); ++q) {
    if (seqs[q] != nullptr && !drafts[q].empty()) {
      seqs[q]->fed.insert(seqs[q]->fed.end(), drafts[q].begin(), drafts[q].end() - 1);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::vector<int32_t>>> DraftModel::Propose(
    std::span<const Request> requests) {
  const size_t vocab = static_cast<size_t>(slice_->config().vocab_size);
  std::vector<std::vector<int32_t>> drafts(requests.size());
  std::vector<Sequence*> seqs(requests.size(), nullptr);
  std::vector<int64_t> context_len(requests.size(), 0);
  const bool greedy = std::all_of(requests.begin(), requests.end(), [](const Request& request) {
    return request.sampling.config.temperature == 0.0f;
  });

  // Draws draft j of request r from its logits row.
  auto draw = [&](size_t r, std::span<const float> row) {
    const Request& request = requests[r];
    drafts[r].push_back(DrawDraft(
        row, request.sampling, request.sampling.token_index + drafts[r].size(), &seqs[r]->probs));
  };

  // Runs pieces in batches of at most max_batch_tokens_ tokens; calls on_row(piece, row) for
  // every piece that asked for logits.
  auto run_all = [&](std::vector<Piece>& pieces, std::vector<size_t>& owner) -> absl::Status {
    size_t begin = 0;
    while (begin < pieces.size()) {
      size_t end = begin;
      int64_t tokens = 0;
      while (end < pieces.size() &&
             (end == begin ||
              tokens + static_cast<int64_t>(pieces[end].tokens.size()) <= max_batch_tokens_)) {
        tokens += static_cast<int64_t>(pieces[end].tokens.size());
        ++end;
      }
      std::vector<Piece> batch(pieces.begin() + begin, pieces.begin() + end);
      RS_ASSIGN_OR_RETURN(PieceRows rows, RunPieces(batch, greedy));
      size_t row = 0;
      for (size_t i = begin; i < end; ++i) {
        if (!pieces[i].want_logits) continue;
        if (greedy ? row >= rows.argmax.size() : (row + 1) * vocab > rows.logits.size()) {
          return absl::InternalError("the draft model returned too few logits rows");
        }
        if (greedy) {
          drafts[owner[i]].push_back(rows.argmax[row]);  // what DrawDraft picks when greedy
        } else {
          draw(owner[i], std::span<const float>(rows.logits).subspan(row * vocab, vocab));
        }
        ++row;
      }
      begin = end;
    }
    return absl::OkStatus();
  };

  // 1. Catch up: the context not yet in the draft's cache, in pieces; the last one's logits
  //    give the first draft.
  std::vector<Piece> pieces;
  std::vector<size_t> owner;
  int max_k = 0;
  for (size_t r = 0; r < requests.size(); ++r) {
    const Request& request = requests[r];
    auto it = sequences_.find(request.seq_id);
    if (request.k <= 0 || it == sequences_.end() || it->second.lost) continue;
    Sequence& seq = it->second;
    seq.drafts.clear();
    seq.probs.clear();
    std::vector<int32_t> context = seq.tokens;
    context.insert(context.end(), request.emitted.begin(), request.emitted.end());
    if (context.empty()) continue;
    if (!Reserve(seq, static_cast<int64_t>(context.size()) + request.k - 1)) continue;
    size_t common = 0;
    while (common < seq.fed.size() && common < context.size() &&
           seq.fed[common] == context[common]) {
      ++common;
    }
    common = std::min(common, context.size() - 1);  // at least one token, for its logits
    seqs[r] = &seq;
    context_len[r] = static_cast<int64_t>(context.size());
    max_k = std::max(max_k, request.k);
    for (size_t pos = common; pos < context.size();) {
      const size_t n = std::min(context.size() - pos, static_cast<size_t>(max_batch_tokens_));
      Piece piece{.seq = &seq,
                  .seq_id = request.seq_id,
                  .start = static_cast<int32_t>(pos),
                  .tokens = std::vector<int32_t>(context.begin() + pos, context.begin() + pos + n),
                  .want_logits = pos + n == context.size()};
      pieces.push_back(std::move(piece));
      owner.push_back(r);
      pos += n;
    }
    seq.fed = std::move(context);
  }
  // 2. One token per round: feed draft j, draw draft j + 1. Greedy on a slice that samples on
  //    the device: fed there, round after round (ProposeFed); else each round's drafts come to
  //    the host before the next round is built.
  int64_t catch_up_tokens = 0;
  for (const Piece& piece : pieces) catch_up_tokens += static_cast<int64_t>(piece.tokens.size());
  if (fed_rounds_ && greedy && max_k > 1 && !pieces.empty() && slice_->can_sample_async() &&
      catch_up_tokens <= max_batch_tokens_) {
    RS_RETURN_IF_ERROR(ProposeFed(requests, pieces, owner, seqs, context_len, max_k, drafts));
  } else {
    RS_RETURN_IF_ERROR(run_all(pieces, owner));
    for (int round = 1; round < max_k; ++round) {
      pieces.clear();
      owner.clear();
      for (size_t r = 0; r < requests.size(); ++r) {
        if (seqs[r] == nullptr || requests[r].k <= round) continue;
        const int32_t token = drafts[r].back();
        pieces.push_back(Piece{.seq = seqs[r],
                               .seq_id = requests[r].seq_id,
                               .start = static_cast<int32_t>(context_len[r] + round - 1),
                               .tokens = {token},
                               .want_logits = true});
        owner.push_back(r);
        seqs[r]->fed.push_back(token);
      }
      RS_RETURN_IF_ERROR(run_all(pieces, owner));
    }
  }
  for (size_t r = 0; r < requests.size(); ++r) {
    if (seqs[r] != nullptr) seqs[r]->drafts = drafts[r];
  }
  return drafts;
}

}  // namespace ringserve
