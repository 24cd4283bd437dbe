#include "stage/speculative/draft_model.h"

#include <algorithm>

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

DraftModel::DraftModel(std::unique_ptr<ModelSlice> slice, int max_batch_tokens)
    : slice_(std::move(slice)), max_batch_tokens_(std::max(1, max_batch_tokens)) {
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

absl::StatusOr<DraftModel::PieceRows> DraftModel::RunPieces(const std::vector<Piece>& pieces,
                                                            bool greedy) {
  MicroBatch batch;
  size_t logits_rows = 0;
  std::vector<int64_t> last_rows;  // per piece: its last logits row, -1 for none
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
                          logits_rows + chunk.num_tokens <= kMaxAllRows;
    chunk.logits = all_rows            ? LogitsMode::kAllTokens
                   : piece.want_logits ? LogitsMode::kLastToken
                                       : LogitsMode::kNone;
    logits_rows += all_rows ? chunk.num_tokens : piece.want_logits ? 1 : 0;
    last_rows.push_back(piece.want_logits ? static_cast<int64_t>(logits_rows) - 1 : -1);
    batch.chunks.push_back(std::move(chunk));
    batch.token_ids.insert(batch.token_ids.end(), piece.tokens.begin(), piece.tokens.end());
  }
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
  RS_RETURN_IF_ERROR(run_all(pieces, owner));

  // 2. One token per round: feed draft j, draw draft j + 1.
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
  for (size_t r = 0; r < requests.size(); ++r) {
    if (seqs[r] != nullptr) seqs[r]->drafts = drafts[r];
  }
  return drafts;
}

}  // namespace ringserve
