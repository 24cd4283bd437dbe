#include "stage/speculative/mtp_drafter.h"

#include <algorithm>

#include "common/status_macros.h"
#include "kernels/cpu/ops.h"

namespace ringserve {

void MtpDrafter::Sync(uint64_t seq_id, const ChunkSpeculationWire& speculation) {
  Sequence& seq = sequences_[seq_id];
  if (speculation.context_start == 0) {
    seq = Sequence{};
  } else if (seq.lost || static_cast<int64_t>(seq.tokens.size()) < speculation.context_start) {
    seq.lost = true;
    return;
  }
  seq.tokens.resize(speculation.context_start);
  seq.tokens.insert(seq.tokens.end(), speculation.context_ids.begin(),
                    speculation.context_ids.end());
  // Pairs already fed used tokens this stage emitted itself, which the context now confirms
  // (the coordinator only ever appends verified tokens), so they stay fed.
}

absl::Status MtpDrafter::ObserveTarget(ModelSlice& target, const DecodedPlan& plan) {
  const int64_t hidden = target.config().hidden_size;
  ActivationBuffer& activations = target.activations();
  if (activations.memory() != MemorySpace::kHost) {
    return absl::FailedPreconditionError(
        "MTP drafting needs the target's hidden states on the host");
  }
  std::span<const float> x(activations.data(), static_cast<size_t>(activations.num_values()));
  int64_t row = 0;
  for (size_t c = 0; c < plan.batch.chunks.size(); ++c) {
    const SequenceChunk& chunk = plan.batch.chunks[c];
    auto it = sequences_.find(chunk.seq_id);
    if (c < plan.outputs.size() && plan.outputs[c].speculation.active && it != sequences_.end() &&
        !it->second.lost) {
      Sequence& seq = it->second;
      if (static_cast<int64_t>(x.size()) < (row + chunk.num_tokens) * hidden) {
        return absl::InternalError("the target's hidden states do not cover its plan");
      }
      seq.block_table = chunk.block_table;
      for (int32_t i = 0; i < chunk.num_tokens; ++i) {
        std::vector<float>& h = seq.hidden[chunk.start_position + i];
        h.resize(hidden);
        cpu::RmsNorm(x.data() + (row + i) * hidden, target_->final_norm().data(), 1, hidden,
                     target.config().rms_norm_eps, h.data());
      }
    }
    row += chunk.num_tokens;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::vector<int32_t>>> MtpDrafter::Propose(
    std::span<const Request> requests) {
  std::vector<std::vector<int32_t>> drafts(requests.size());
  MicroBatch batch;
  std::vector<float> main_hidden;
  std::vector<size_t> owners;
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
    bool complete = true;
    for (int32_t p = seq.fed; p <= last && complete; ++p) complete = seq.hidden.count(p) == 1;
    if (!complete) {
      seq.lost = true;  // positions this stage never saw (prefix-cached blocks)
      continue;
    }
    SequenceChunk chunk;
    chunk.seq_id = request.seq_id;
    chunk.start_position = seq.fed;
    chunk.num_tokens = last - seq.fed + 1;
    chunk.block_table = seq.block_table;
    chunk.logits = LogitsMode::kLastToken;
    batch.chunks.push_back(std::move(chunk));
    for (int32_t p = seq.fed; p <= last; ++p) {
      batch.token_ids.push_back(context[p + 1]);
      const std::vector<float>& h = seq.hidden.at(p);
      main_hidden.insert(main_hidden.end(), h.begin(), h.end());
    }
    seq.fed = last + 1;
    seq.hidden.erase(seq.hidden.begin(), seq.hidden.lower_bound(seq.fed));
    owners.push_back(r);
  }
  if (batch.chunks.empty()) return drafts;
  RS_ASSIGN_OR_RETURN(std::vector<float> logits, target_->mtp()->Forward(batch, main_hidden));
  const size_t vocab = static_cast<size_t>(target_->config().vocab_size);
  if (logits.size() != owners.size() * vocab) {
    return absl::InternalError("the MTP layer returned the wrong number of logits rows");
  }
  for (size_t i = 0; i < owners.size(); ++i) {
    const Request& request = requests[owners[i]];
    Sequence& seq = sequences_.at(request.seq_id);
    drafts[owners[i]].push_back(DrawDraft(std::span<const float>(logits).subspan(i * vocab, vocab),
                                          request.sampling, request.sampling.token_index,
                                          &seq.probs));
    seq.drafts = drafts[owners[i]];
  }
  return drafts;
}

std::span<const double> MtpDrafter::DraftProbabilities(uint64_t seq_id) const {
  auto it = sequences_.find(seq_id);
  if (it == sequences_.end()) return {};
  return it->second.probs;
}

std::span<const int32_t> MtpDrafter::LastDrafts(uint64_t seq_id) const {
  auto it = sequences_.find(seq_id);
  if (it == sequences_.end()) return {};
  return it->second.drafts;
}

}  // namespace ringserve
