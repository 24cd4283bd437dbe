// A micro-batch as both processes see it: the scheduler builds one per plan, the plan codec
// carries it to every stage, the model slice runs it.
//
// Layout: the tokens of all chunks laid out chunk after chunk, so a tensor of
// [total_tokens, hidden] holds chunk 0's tokens first. KV blocks are allocated by the
// coordinator (it has the global view, capacity = min over stages) and named in each chunk's
// block table; a slice only reads and writes the blocks it is told about.
#pragma once

#include <cstdint>
#include <vector>

namespace ringserve {

// Decoder layers [first, last) of a model with `num_layers` layers.
struct LayerRange {
  int first = 0;
  int last = 0;
  int size() const { return last - first; }
};

// Which logits the last slice returns for a chunk.
enum class LogitsMode {
  kNone,       // no logits (e.g. a prefill chunk that does not end the prompt)
  kLastToken,  // one row: the chunk's final token (decode, or the prompt's last chunk)
  kAllTokens,  // one row per token of the chunk (tests, prompt logprobs)
};

// One sequence's part of a micro-batch.
struct SequenceChunk {
  uint64_t seq_id = 0;
  // Tokens of this sequence whose K/V are already cached; this chunk's tokens take positions
  // [start_position, start_position + num_tokens).
  int32_t start_position = 0;
  int32_t num_tokens = 0;
  // KV block ids; entry i holds positions [i * block_size, (i + 1) * block_size). Must cover
  // start_position + num_tokens positions. The same ids are valid on every stage.
  std::vector<int32_t> block_table;
  LogitsMode logits = LogitsMode::kLastToken;
};

struct MicroBatch {
  std::vector<SequenceChunk> chunks;
  // First slice only: [total_tokens] token ids, chunk after chunk. Empty on other slices.
  std::vector<int32_t> token_ids;

  int64_t TotalTokens() const {
    int64_t total = 0;
    for (const auto& chunk : chunks) total += chunk.num_tokens;
    return total;
  }

  // The token rows (indices into [TotalTokens()]) whose logits the chunks ask for, in chunk
  // order: every row of a kAllTokens chunk, the last row of a kLastToken chunk.
  std::vector<int64_t> LogitRows() const {
    std::vector<int64_t> rows;
    int64_t offset = 0;
    for (const auto& chunk : chunks) {
      if (chunk.logits == LogitsMode::kAllTokens) {
        for (int32_t i = 0; i < chunk.num_tokens; ++i) rows.push_back(offset + i);
      } else if (chunk.logits == LogitsMode::kLastToken) {
        rows.push_back(offset + chunk.num_tokens - 1);
      }
      offset += chunk.num_tokens;
    }
    return rows;
  }
};

}  // namespace ringserve
