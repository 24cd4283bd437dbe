// Speculative decoding on the last stage: after the target slice ran a plan, samples its
// ordinary chunks, verifies the drafts of its verification chunks (speculative_sampling.h),
// and proposes the next drafts with the draft model (draft_model.h), returned with each
// SampledToken (accepted_ids, draft_ids). The step executor hands it every plan that carries
// speculation (Applies); other plans take the slice's own sampling path.
//
// The target's logits rows come to the host (ModelSlice::LogitsToHost), so this works on every
// backend: a CUDA last stage computes the 1 + k rows of a verification chunk (ALL_TOKENS) on the
// GPU and the verification runs on the host.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/stage.pb.h"
#include "ring/plan_codec.h"
#include "stage/model/model_slice.h"
#include "stage/speculative/drafter.h"

namespace ringserve {

struct SpeculatorStats {
  int64_t verifications = 0;  // verification chunks verified
  int64_t drafts_verified = 0;
  int64_t drafts_accepted = 0;
  int64_t drafts_proposed = 0;
  // Wall time (host clock) per plan sampled: waiting for the target's rows (its argmax or
  // logits on the host: the end of the step's GPU work) and drafting (Drafter::Propose).
  int64_t plans = 0;
  int64_t target_rows_us = 0;
  int64_t draft_us = 0;
};

class Speculator {
 public:
  // `max_drafts`: the most drafts a chunk may ask for (ConfigureRequest.num_speculative_tokens).
  Speculator(std::unique_ptr<Drafter> draft, int max_drafts);

  // Whether `plan` carries speculation (a chunk's ChunkSpeculation or released sequences).
  static bool Applies(const DecodedPlan& plan);

  // After target.Run(plan.batch): one SampledToken per sampling chunk (in chunk order) into
  // `tokens` and the prompt log-probabilities of ALL_TOKENS chunks that score into
  // `prompt_logprobs`. InvalidArgument when a chunk asks for more drafts than configured.
  absl::Status SampleInto(ModelSlice& target, const DecodedPlan& plan,
                          std::vector<v1::SampledToken>* tokens,
                          std::vector<v1::PromptLogprobs>* prompt_logprobs);

  SpeculatorStats stats() const;

 private:
  std::unique_ptr<Drafter> draft_;
  int max_drafts_;
  SpeculatorStats stats_;
};

}  // namespace ringserve
