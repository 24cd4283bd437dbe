// Validation of a MicroBatch against what one slice can run, shared by every backend so that a
// malformed plan gets the same clear error from a CPU or a CUDA stage.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "stage/model/model_slice.h"

namespace ringserve {

struct MicroBatchLimits {
  int64_t max_positions = 0;       // positions a sequence may reach
  std::string max_positions_name;  // how the error names that limit, e.g. "max_model_len"
  int kv_block_size = 0;
  int kv_num_blocks = 0;
  int vocab_size = 0;
  int hidden_size = 0;
  bool is_first = false;  // the first slice embeds token ids instead of reading hidden_in
  // The input sits in the slice's activation buffer (Prepare): hidden_in is not checked.
  bool hidden_in_resident = false;
};

// InvalidArgument naming the chunk and sequence when: there are no chunks; a chunk has no tokens
// or a negative start; its positions pass max_positions; its block table is too short or names
// a block outside [0, kv_num_blocks); on the first slice the token ids do not match the token
// count or leave the vocabulary; elsewhere hidden_in is not [total_tokens, hidden] fp32.
absl::Status ValidateMicroBatch(const MicroBatch& batch, std::span<const float> hidden_in,
                                const MicroBatchLimits& limits);

}  // namespace ringserve
