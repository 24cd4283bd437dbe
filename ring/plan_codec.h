// Conversions between the wire form of a step plan (ringserve.v1.StepPlan, proto/stage.proto)
// and the model's MicroBatch (stage/model/model_slice.h). Used by the stage (decode) and the
// coordinator (encode). Pure functions; thread-safe.
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "proto/stage.pb.h"
#include "ring/micro_batch.h"
#include "ring/sampling_config.h"
#include "ring/speculation_wire.h"

namespace ringserve {

// What the last stage reports for one chunk.
struct ChunkOutput {
  bool samples = false;  // one token sampled from the chunk's last logits row
  // ALL_TOKENS chunks (prompt log-probabilities): row i is scored against score_token_ids[i].
  std::vector<int32_t> score_token_ids{};
  // A sequence that speculates (ring/speculation_wire.h); a verification chunk has draft ids,
  // ALL_TOKENS logits, 1 + draft_ids.size() tokens, samples and scores nothing.
  ChunkSpeculationWire speculation{};
};

// What a stage runs for one plan: the micro-batch and, on the last stage, one sampling request
// per chunk that samples (LAST_TOKEN logits, or ALL_TOKENS with sampling; in chunk order) and
// one output entry per chunk.
struct DecodedPlan {
  MicroBatch batch{};
  std::vector<RowSampling> sampling{};
  std::vector<ChunkOutput> outputs{};        // last stage only: one per chunk
  std::vector<uint64_t> released_seq_ids{};  // last stage only: speculation state to drop
};

// Checks and converts a plan. `is_first`: token ids must cover every chunk's tokens exactly;
// `is_last`: chunks with LAST_TOKEN logits carry valid sampling parameters, ALL_TOKENS chunks
// num_tokens score ids (num_tokens - 1 when they also sample). InvalidArgument naming the
// micro-batch and chunk otherwise (non-positive token count, negative position, a block table
// too short for the positions, score ids that do not fit, ...).
absl::StatusOr<DecodedPlan> DecodeStepPlan(const v1::StepPlan& plan, bool is_first, bool is_last,
                                           int kv_block_size);

// One chunk's sampling as the coordinator sends it to the last stage.
struct ChunkSamplingWire {
  SamplingConfig config{};
  int32_t token_index = 0;
  bool samples = true;  // kAllTokens chunks: whether the last row also samples a token
  std::vector<int32_t> score_token_ids{};     // kAllTokens chunks: see ChunkOutput
  int top_logprobs = 0;                       // see RowSampling
  std::vector<int32_t> suppress_token_ids{};  // see RowSampling
  ChunkSpeculationWire speculation{};         // last stage: see ChunkOutput
};

// Builds the plan for one stage. Token ids go to the first stage only; `sampling` (one entry
// per chunk, used where the chunk's logits are kLastToken) and `released_seq_ids` to the last
// stage only.
v1::StepPlan EncodeStepPlan(uint64_t micro_batch_id, const MicroBatch& batch,
                            const std::vector<ChunkSamplingWire>& sampling, bool is_first,
                            bool is_last, const std::vector<uint64_t>& released_seq_ids = {});

}  // namespace ringserve
