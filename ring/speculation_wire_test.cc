// The speculation part of a plan (ring/speculation_wire.h) through the plan codec: it reaches
// the last stage only, verification chunks are checked, released sequences travel.
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ring/plan_codec.h"

namespace ringserve {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

MicroBatch Verification() {
  MicroBatch batch;
  batch.chunks.push_back({.seq_id = 5,
                          .start_position = 9,
                          .num_tokens = 4,
                          .block_table = {0},
                          .logits = LogitsMode::kAllTokens});
  batch.token_ids = {30, 31, 32, 33};
  return batch;
}

std::vector<ChunkSamplingWire> Sampling() {
  std::vector<ChunkSamplingWire> sampling(1);
  sampling[0].token_index = 4;
  sampling[0].speculation = {.active = true,
                             .context_start = 8,
                             .context_ids = {29, 30},
                             .draft_ids = {31, 32, 33},
                             .propose = 2};
  return sampling;
}

TEST(SpeculationWireTest, ReachesTheLastStageOnly) {
  const std::vector<uint64_t> released = {3, 4};
  v1::StepPlan first = EncodeStepPlan(1, Verification(), Sampling(), true, false, released);
  EXPECT_FALSE(first.chunks(0).has_speculation());
  EXPECT_EQ(first.released_seq_ids_size(), 0);
  v1::StepPlan last = EncodeStepPlan(1, Verification(), Sampling(), false, true, released);
  auto decoded = DecodeStepPlan(last, false, true, 16);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  const ChunkSpeculationWire& spec = decoded->outputs[0].speculation;
  EXPECT_TRUE(spec.active);
  EXPECT_EQ(spec.context_start, 8);
  EXPECT_THAT(spec.context_ids, ElementsAre(29, 30));
  EXPECT_THAT(spec.draft_ids, ElementsAre(31, 32, 33));
  EXPECT_EQ(spec.propose, 2);
  EXPECT_TRUE(decoded->outputs[0].samples);
  ASSERT_EQ(decoded->sampling.size(), 1u);
  EXPECT_EQ(decoded->sampling[0].token_index, 4u);
  EXPECT_THAT(decoded->released_seq_ids, ElementsAre(3, 4));
}

TEST(SpeculationWireTest, AVerificationChunkMustHoldItsDrafts) {
  v1::StepPlan last = EncodeStepPlan(1, Verification(), Sampling(), false, true);
  last.mutable_chunks(0)->set_num_tokens(3);  // one draft short
  auto decoded = DecodeStepPlan(last, false, true, 16);
  ASSERT_FALSE(decoded.ok());
  EXPECT_THAT(decoded.status().message(), HasSubstr("verification chunk"));

  last = EncodeStepPlan(1, Verification(), Sampling(), false, true);
  last.mutable_chunks(0)->mutable_speculation()->set_propose(-1);
  EXPECT_FALSE(DecodeStepPlan(last, false, true, 16).ok());
}

}  // namespace
}  // namespace ringserve
