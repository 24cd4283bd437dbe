// Speculative decoding, the scheduler's side: what the last stage returns for a speculating
// sequence (SpeculativeTokens) and how many drafts a sequence asks for next
// (SpeculationPolicy: k adapts to the acceptance rate; 0 = off when it does not pay).
//
// How a sequence speculates (scheduler.h): the chunk that samples its token t also asks the
// last stage for k drafts d_1..d_k; its next chunk is a verification chunk of 1 + k tokens
// [t, d_1..d_k] with logits for every row; the last stage accepts a prefix of the drafts and
// emits one more token (the correction, or the bonus when all were accepted). The scheduler
// then rolls the sequence back to its verified length: positions (and KV blocks) of rejected
// drafts are given back and overwritten later; prefix-cache hashes only ever cover verified
// tokens.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "coordinator/scheduler/speculation_payoff.h"

namespace ringserve {

// One sampling chunk's speculation result, parallel to its sampled token.
struct SpeculativeTokens {
  std::vector<int32_t> accepted{};  // drafts accepted before the sampled token
  std::vector<int32_t> drafts{};    // proposed after the sampled token
};

struct SpeculationOptions {
  int max_drafts = 0;  // k at most; 0 = speculation off
  // Speculation backs off (k = 0) while more sequences than this decode at once: a batch that
  // is large already gains little from verifying more tokens per step.
  int max_decoding_sequences = 16;
  double ewma_weight = 0.3;     // weight of the latest verification in the acceptance EWMA
  double draft_cost = 0.15;     // a draft token's cost relative to a target step
  double off_below = 0.25;      // acceptance under which a sequence stops drafting ...
  int probe_after_tokens = 32;  // ... and tries again (k = 1) after this many plain tokens
  // Whether speculation pays at all, measured (speculation_payoff.h): while plain decoding is
  // faster, chunks carry no speculation (the last stage samples as without a draft model) and
  // decodes are planned ahead again.
  SpeculationPayoffOptions payoff{};
  // Seconds on a monotonic clock, for the payoff's timing; empty: std::chrono::steady_clock.
  std::function<double()> clock{};
};

// Per sequence. k maximizes the expected tokens per unit of cost,
//   (1 - a^(k+1)) / (1 - a) / (1 + draft_cost * k),  a = acceptance EWMA.
class SpeculationPolicy {
 public:
  int NextDrafts(const SpeculationOptions& options, int decoding_sequences) const;
  // A verification of `drafted` drafts accepted `accepted` of them.
  void OnVerified(const SpeculationOptions& options, int drafted, int accepted);
  // A token was generated without drafts.
  void OnPlainToken() { ++plain_tokens_; }
  double acceptance() const { return acceptance_; }

 private:
  double acceptance_ = 0.7;  // optimistic start: a new sequence tries speculation
  int plain_tokens_ = 0;     // since speculation went off
};

}  // namespace ringserve
