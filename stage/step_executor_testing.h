// Shared by the StepExecutor tests: the fixture model they load and the prefill micro-batch they
// start from. Test code only.
#pragma once

#include "ring/micro_batch.h"

namespace ringserve::testing {

inline constexpr char kStepExecutorModel[] = "tests/fixtures/models/qwen2";  // 3 layers, vocab 448

// Sequences 1 (a prompt of 5 tokens) and 2 (3 tokens), in KV blocks {0, 1, 2} and {3, 4, 5} of
// 4 positions.
inline MicroBatch TwoPromptPrefill() {
  MicroBatch batch;
  batch.chunks.push_back({.seq_id = 1,
                          .start_position = 0,
                          .num_tokens = 5,
                          .block_table = {0, 1, 2},
                          .logits = LogitsMode::kLastToken});
  batch.chunks.push_back({.seq_id = 2,
                          .start_position = 0,
                          .num_tokens = 3,
                          .block_table = {3, 4, 5},
                          .logits = LogitsMode::kLastToken});
  batch.token_ids = {11, 200, 37, 5, 401, 90, 91, 3};
  return batch;
}

}  // namespace ringserve::testing
