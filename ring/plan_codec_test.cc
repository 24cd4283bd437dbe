#include "ring/plan_codec.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ringserve {
namespace {

using ::testing::HasSubstr;

MicroBatch TwoChunks() {
  MicroBatch batch;
  batch.chunks.push_back({.seq_id = 7,
                          .start_position = 0,
                          .num_tokens = 3,
                          .block_table = {4},
                          .logits = LogitsMode::kNone});
  batch.chunks.push_back({.seq_id = 9,
                          .start_position = 17,
                          .num_tokens = 1,
                          .block_table = {1, 2},
                          .logits = LogitsMode::kLastToken});
  batch.token_ids = {10, 11, 12, 13};
  return batch;
}

TEST(PlanProtoTest, RoundTripsForFirstMiddleAndLastStage) {
  MicroBatch batch = TwoChunks();
  std::vector<ChunkSamplingWire> sampling(2);
  sampling[1].config = {.temperature = 0.5f, .top_k = 3, .top_p = 0.9f, .seed = 42};
  sampling[1].token_index = 5;

  v1::StepPlan first = EncodeStepPlan(3, batch, sampling, true, false);
  EXPECT_EQ(first.token_ids_size(), 4);
  EXPECT_FALSE(first.chunks(1).has_sampling());
  auto decoded = DecodeStepPlan(first, true, false, 16);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->batch.token_ids, batch.token_ids);
  EXPECT_TRUE(decoded->sampling.empty());

  v1::StepPlan middle = EncodeStepPlan(3, batch, sampling, false, false);
  EXPECT_EQ(middle.token_ids_size(), 0);
  auto mid = DecodeStepPlan(middle, false, false, 16);
  ASSERT_TRUE(mid.ok());
  ASSERT_EQ(mid->batch.chunks.size(), 2u);
  EXPECT_EQ(mid->batch.chunks[1].block_table, (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(mid->batch.chunks[1].start_position, 17);

  v1::StepPlan last = EncodeStepPlan(3, batch, sampling, false, true);
  auto end = DecodeStepPlan(last, false, true, 16);
  ASSERT_TRUE(end.ok());
  ASSERT_EQ(end->sampling.size(), 1u);
  EXPECT_EQ(end->sampling[0].config.seed, 42u);
  EXPECT_EQ(end->sampling[0].config.top_k, 3);
  EXPECT_EQ(end->sampling[0].token_index, 5u);
}

TEST(PlanProtoTest, RefusesMalformedPlans) {
  MicroBatch batch = TwoChunks();
  std::vector<ChunkSamplingWire> sampling(2);
  v1::StepPlan plan = EncodeStepPlan(8, batch, sampling, true, true);

  v1::StepPlan missing_ids = plan;
  missing_ids.mutable_token_ids()->RemoveLast();
  EXPECT_THAT(std::string(DecodeStepPlan(missing_ids, true, true, 16).status().message()),
              HasSubstr("3 token ids for 4 planned tokens"));

  v1::StepPlan short_table = plan;
  short_table.mutable_chunks(1)->mutable_block_table()->RemoveLast();
  EXPECT_THAT(std::string(DecodeStepPlan(short_table, true, true, 16).status().message()),
              HasSubstr("micro-batch 8 chunk 1 (seq 9)"));

  v1::StepPlan empty_chunk = plan;
  empty_chunk.mutable_chunks(0)->set_num_tokens(0);
  EXPECT_FALSE(DecodeStepPlan(empty_chunk, false, false, 16).ok());

  v1::StepPlan bad_sampling = plan;
  bad_sampling.mutable_chunks(1)->mutable_sampling()->set_temperature(-1);
  EXPECT_THAT(std::string(DecodeStepPlan(bad_sampling, true, true, 16).status().message()),
              HasSubstr("temperature"));

  v1::StepPlan no_chunks;
  EXPECT_FALSE(DecodeStepPlan(no_chunks, true, true, 16).ok());
}

}  // namespace
}  // namespace ringserve
