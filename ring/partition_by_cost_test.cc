#include "ring/partition_by_cost.h"

#include <numeric>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ringserve {
namespace {

using ::testing::ElementsAre;

TEST(PartitionByCostTest, EqualCostsSplitEvenly) {
  const std::vector<int64_t> costs(12, 5);
  EXPECT_THAT(*PartitionByCost(costs, 3), ElementsAre(4, 4, 4));
  EXPECT_THAT(*PartitionByCost(costs, 1), ElementsAre(12));
  EXPECT_THAT(*PartitionByCost(costs, 12), ::testing::Each(1));
}

// One dense layer then MoE layers 20x its cost (Qwen3-MoE with mlp_only_layers [0], or
// GLM-4.5 with first_k_dense_replace 1): the first stage takes the dense layer with its share
// of MoE layers, not a layer count's share.
TEST(PartitionByCostTest, DenseAndMoeLayersOfVeryDifferentCost) {
  std::vector<int64_t> costs = {1, 1, 1, 20, 20, 20, 20, 20, 20};
  EXPECT_THAT(*PartitionByCost(costs, 3), ElementsAre(5, 2, 2));  // 43, 40, 40
  costs = {20, 20, 20, 1, 1, 1, 1, 1, 1, 1};
  EXPECT_THAT(*PartitionByCost(costs, 2), ElementsAre(2, 8));  // 40 | 27
}

// Qwen3-30B-A3B with its first layer dense: a MoE layer weighs 33x the dense one, and
// LayerParameterCount counts every expert.
TEST(PartitionByCostTest, LayerParameterCountCountsEveryExpert) {
  ModelConfig c;
  c.hidden_size = 2048;
  c.intermediate_size = 6144;
  c.num_layers = 4;
  c.num_heads = 32;
  c.num_kv_heads = 4;
  c.head_dim = 128;
  c.qk_norm = true;
  c.moe.router.num_experts = 128;
  c.moe.router.top_k = 8;
  c.moe.expert_intermediate_size = 768;
  c.moe.layers = {false, true, true, true};
  const int64_t attention = 2 * 2048 + (4096 + 1024) * 2048 + 2048 * 4096 + 2 * 128;
  EXPECT_EQ(LayerParameterCount(c, 0), attention + 3 * 2048 * 6144);
  EXPECT_EQ(LayerParameterCount(c, 1), attention + 128 * 2048 + 128 * 3 * 2048 * 768);
  std::vector<int64_t> costs;
  for (int layer = 0; layer < 4; ++layer) costs.push_back(LayerParameterCount(c, layer));
  EXPECT_THAT(*PartitionByCost(costs, 2), ElementsAre(2, 2));
  EXPECT_THAT(*PartitionByCost(costs, 3), ElementsAre(2, 1, 1));
}

TEST(PartitionByCostTest, RefusesMoreStagesThanLayers) {
  const std::vector<int64_t> costs = {1, 2};
  EXPECT_FALSE(PartitionByCost(costs, 3).ok());
  EXPECT_FALSE(PartitionByCost(costs, 0).ok());
}

}  // namespace
}  // namespace ringserve
