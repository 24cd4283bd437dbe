#include "stage/model/micro_batch_check.h"

#include "fmt/format.h"

namespace ringserve {

absl::Status ValidateMicroBatch(const MicroBatch& batch, std::span<const float> hidden_in,
                                const MicroBatchLimits& limits) {
  if (batch.chunks.empty()) return absl::InvalidArgumentError("micro-batch has no chunks");
  const int64_t total = batch.TotalTokens();
  for (size_t c = 0; c < batch.chunks.size(); ++c) {
    const SequenceChunk& chunk = batch.chunks[c];
    if (chunk.num_tokens <= 0 || chunk.start_position < 0) {
      return absl::InvalidArgumentError(
          fmt::format("chunk {} (seq {}): num_tokens {} must be > 0 and start_position {} >= 0", c,
                      chunk.seq_id, chunk.num_tokens, chunk.start_position));
    }
    const int64_t end = static_cast<int64_t>(chunk.start_position) + chunk.num_tokens;
    if (end > limits.max_positions) {
      return absl::InvalidArgumentError(
          fmt::format("chunk {} (seq {}): positions up to {} exceed {} {}", c, chunk.seq_id, end,
                      limits.max_positions_name, limits.max_positions));
    }
    const int64_t blocks_needed = (end + limits.kv_block_size - 1) / limits.kv_block_size;
    if (static_cast<int64_t>(chunk.block_table.size()) < blocks_needed) {
      return absl::InvalidArgumentError(
          fmt::format("chunk {} (seq {}): block table has {} blocks, positions [0, {}) need {}", c,
                      chunk.seq_id, chunk.block_table.size(), end, blocks_needed));
    }
    for (int64_t i = 0; i < blocks_needed; ++i) {
      const int32_t block = chunk.block_table[i];
      if (block < 0 || block >= limits.kv_num_blocks) {
        return absl::InvalidArgumentError(
            fmt::format("chunk {} (seq {}): block id {} at table index {} outside [0, {})", c,
                        chunk.seq_id, block, i, limits.kv_num_blocks));
      }
    }
  }
  if (limits.is_first) {
    if (static_cast<int64_t>(batch.token_ids.size()) != total) {
      return absl::InvalidArgumentError(
          fmt::format("micro-batch has {} token ids for {} tokens", batch.token_ids.size(), total));
    }
    for (size_t t = 0; t < batch.token_ids.size(); ++t) {
      if (batch.token_ids[t] < 0 || batch.token_ids[t] >= limits.vocab_size) {
        return absl::InvalidArgumentError(
            fmt::format("token id {} at index {} outside the vocabulary [0, {})",
                        batch.token_ids[t], t, limits.vocab_size));
      }
    }
  } else if (!limits.hidden_in_resident &&
             static_cast<int64_t>(hidden_in.size()) != total * limits.hidden_size) {
    return absl::InvalidArgumentError(
        fmt::format("hidden_in has {} floats, expected {} tokens x hidden {} = {}",
                    hidden_in.size(), total, limits.hidden_size, total * limits.hidden_size));
  }
  return absl::OkStatus();
}

}  // namespace ringserve
