// Shared by the StepExecutor tests: the fixture model they load, the prefill micro-batch they
// start from and its sampling. Test code only.
#pragma once

#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "ring/micro_batch.h"
#include "ring/plan_codec.h"
#include "stage/model/model_slice.h"

namespace ringserve::testing {

inline constexpr char kStepExecutorModel[] = "tests/fixtures/models/qwen2";  // 3 layers, vocab 448

// `layers` of kStepExecutorModel on the CPU, in 32 KV blocks of 4 positions. A slice that does
// not load fails the calling test (non-fatally, naming the status) and gives nullptr.
inline std::unique_ptr<ModelSlice> LoadStepExecutorSlice(LayerRange layers) {
  auto slice = ModelSlice::LoadCpu(
      {.model_dir = kStepExecutorModel, .layers = layers, .kv_block_size = 4, .kv_num_blocks = 32});
  EXPECT_TRUE(slice.ok()) << slice.status();
  return slice.ok() ? *std::move(slice) : nullptr;
}

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

// The sampling of TwoPromptPrefill's two chunks (and of decodes of the same sequences), both at
// `token_index`: sequence 1 greedy with `top_logprobs` alternatives, sequence 2 at temperature
// 0.9, top-k 50, seed 1234.
inline std::vector<ChunkSamplingWire> TwoPromptSampling(int32_t token_index, int top_logprobs = 0) {
  return {{.config = {}, .token_index = token_index, .top_logprobs = top_logprobs},
          {.config = {.temperature = 0.9f, .top_k = 50, .seed = 1234}, .token_index = token_index}};
}

}  // namespace ringserve::testing
