#include "ring/partition_proposal.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ringserve {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::vector<LayerCost> Layers(const std::vector<double>& us, const std::vector<int64_t>& bytes) {
  std::vector<LayerCost> layers;
  for (size_t i = 0; i < us.size(); ++i) layers.push_back({.step_us = us[i], .bytes = bytes[i]});
  return layers;
}

// MoE layers hold many more bytes than dense ones but, reading only their chosen experts, cost
// a decode step less: the split follows the time, not the parameters.
TEST(ProposePartitionTest, BalancesMeasuredTimeNotBytes) {
  const auto layers = Layers({100, 100, 40, 40, 40, 40, 40}, {10, 10, 80, 80, 80, 80, 80});
  const std::vector<int64_t> memory(2, 1000);
  auto p = ProposePartition(layers, memory);
  ASSERT_TRUE(p.ok()) << p.status();
  // Balancing bytes would give 4,3 (180 | 240 bytes, 280 | 120 us).
  EXPECT_THAT(p->counts, ElementsAre(2, 5));
  EXPECT_THAT(p->stage_us, ElementsAre(200, 200));
}

TEST(ProposePartitionTest, MinimizesTheSlowestStage) {
  const auto layers = Layers({100, 100, 40, 40, 40, 40, 40}, std::vector<int64_t>(7, 1));
  auto p = ProposePartition(layers, std::vector<int64_t>(3, 100));
  ASSERT_TRUE(p.ok());
  EXPECT_THAT(p->counts, ElementsAre(1, 2, 4));  // 100 | 140 | 160
  EXPECT_THAT(p->stage_us, ElementsAre(100, 140, 160));
}

// The time-optimal split puts three 80-byte layers on a stage that holds 200: memory wins,
// at the cost of a slower stage.
TEST(ProposePartitionTest, MemoryOfEachStageBoundsItsLayers) {
  const auto layers = Layers({10, 10, 10, 10}, {80, 80, 80, 20});
  auto p = ProposePartition(layers, std::vector<int64_t>{200, 200});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_THAT(p->counts, ElementsAre(2, 2));
  p = ProposePartition(layers, std::vector<int64_t>{100, 400});  // a small first stage
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_THAT(p->counts, ElementsAre(1, 3));
  EXPECT_THAT(p->stage_bytes, ElementsAre(80, 180));
}

TEST(ProposePartitionTest, NoSplitThatFitsIsAnError) {
  const auto layers = Layers({1, 1, 1}, {50, 50, 50});
  auto p = ProposePartition(layers, std::vector<int64_t>{60, 60});
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(p.status().message(), HasSubstr("fits 2 stage(s)"));
  EXPECT_FALSE(ProposePartition(layers, std::vector<int64_t>(4, 100)).ok());  // 4 stages > 3
}

TEST(LayerCostProfileTest, TextFormRoundTrips) {
  LayerCostProfile profile{.device = "cuda:0",
                           .rows = 32,
                           .context = 256,
                           .layers = Layers({12.5, 30.25}, {1000, 2000}),
                           .memory_bytes = int64_t{1} << 40,
                           .kv_bytes_per_token_and_layer = 4096};
  auto parsed = ParseLayerCostProfile(FormatLayerCostProfile(profile));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->device, "cuda:0");
  EXPECT_EQ(parsed->rows, 32);
  EXPECT_EQ(parsed->context, 256);
  EXPECT_EQ(parsed->memory_bytes, int64_t{1} << 40);
  EXPECT_EQ(parsed->kv_bytes_per_token_and_layer, 4096);
  ASSERT_EQ(parsed->layers.size(), 2u);
  EXPECT_DOUBLE_EQ(parsed->layers[1].step_us, 30.25);
  EXPECT_EQ(parsed->layers[1].bytes, 2000);
}

TEST(LayerCostProfileTest, MalformedTextNamesTheLine) {
  const std::string header = "probe cpu rows 1 context 8 memory 10 kv_bytes 4\n";
  auto p = ParseLayerCostProfile(header + "layer 1 us 3 bytes 4\n");
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(p.status().message(), HasSubstr("line 2"));
  EXPECT_FALSE(ParseLayerCostProfile(header + "layer 0 us x bytes 4\n").ok());
  EXPECT_FALSE(ParseLayerCostProfile("layer 0 us 3 bytes 4\n").ok());
  EXPECT_FALSE(ParseLayerCostProfile(header).ok());
  EXPECT_FALSE(ParseLayerCostProfile(header + header + "layer 0 us 3 bytes 4\n").ok());
}

}  // namespace
}  // namespace ringserve
