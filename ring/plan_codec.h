// Conversions between the wire form of a step plan (ringserve.v1.StepPlan, proto/stage.proto)
// and the model's MicroBatch (stage/model/model_slice.h). Used by the stage (decode) and the
// coordinator (encode). Pure functions; thread-safe.
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "proto/stage.pb.h"
#include "ring/micro_batch.h"
#include "ring/sampling_config.h"

namespace ringserve {

// What a stage runs for one plan: the micro-batch and, on the last stage, one sampling request
// per chunk whose logits are LAST_TOKEN (in chunk order).
struct DecodedPlan {
  MicroBatch batch;
  std::vector<RowSampling> sampling;
};

// Checks and converts a plan. `is_first`: token ids must cover every chunk's tokens exactly;
// `is_last`: chunks with LAST_TOKEN logits carry valid sampling parameters. InvalidArgument
// naming the micro-batch and chunk otherwise (non-positive token count, negative position,
// a block table too short for the positions, ALL_TOKENS logits, ...).
absl::StatusOr<DecodedPlan> DecodeStepPlan(const v1::StepPlan& plan, bool is_first, bool is_last,
                                           int kv_block_size);

// One chunk's sampling as the coordinator sends it to the last stage.
struct ChunkSamplingWire {
  SamplingConfig config;
  int32_t token_index = 0;
};

// Builds the plan for one stage. Token ids go to the first stage only; `sampling` (one entry
// per chunk, used where the chunk's logits are kLastToken) to the last stage only.
v1::StepPlan EncodeStepPlan(uint64_t micro_batch_id, const MicroBatch& batch,
                            const std::vector<ChunkSamplingWire>& sampling, bool is_first,
                            bool is_last);

}  // namespace ringserve
