// Speculative decoding as both processes see it on the wire (proto/stage.proto ChunkSpeculation):
// what the coordinator tells the last stage about one chunk of a sequence that speculates.
//
// The last stage keeps a draft model's state per sequence (stage/speculative/). The coordinator
// owns the truth about a sequence's tokens; each chunk tells the last stage the verified tokens
// it has not told it yet (`context_*`), the drafts this chunk verifies (`draft_ids`) and how
// many drafts to propose after the token(s) it emits (`propose`).
#pragma once

#include <cstdint>
#include <vector>

namespace ringserve {

struct ChunkSpeculationWire {
  bool active = false;  // false: the chunk's sequence does not speculate (no message on the wire)
  // The verified tokens at positions [context_start, context_start + context_ids.size()): the
  // last stage's copy of the sequence is cut to context_start tokens and extended by them.
  // context_start 0 starts the sequence afresh (new request, preemption, re-admission).
  int32_t context_start = 0;
  std::vector<int32_t> context_ids{};
  // A verification chunk: its tokens are [the last emitted token, draft_ids...], its logits are
  // ALL_TOKENS (1 + draft_ids.size() rows) and it samples. Empty for any other chunk.
  std::vector<int32_t> draft_ids{};
  // Drafts to propose after the token(s) this chunk emits (0 = none). Sampling chunks only.
  int32_t propose = 0;
};

}  // namespace ringserve
