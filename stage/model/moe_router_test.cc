#include "stage/model/moe_router.h"

#include <cmath>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ringserve {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

struct Routed {
  std::vector<int32_t> ids;
  std::vector<float> weights;
};

Routed Route(const RouterOptions& o, const std::vector<float>& logits,
             const std::vector<float>& bias = {}) {
  EXPECT_TRUE(ValidateRouterOptions(o).ok()) << ValidateRouterOptions(o);
  const int64_t tokens = static_cast<int64_t>(logits.size()) / o.num_experts;
  Routed r{std::vector<int32_t>(tokens * o.top_k), std::vector<float>(tokens * o.top_k)};
  RouteTokens(o, logits, bias, tokens, r.ids, r.weights);
  return r;
}

float Sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

TEST(MoeRouterTest, SoftmaxTopKKeepsFullSoftmaxWeightsWithoutNormalization) {
  const std::vector<float> logits = {0.0f, 2.0f, 1.0f, -1.0f};
  float sum = 0;
  for (float l : logits) sum += std::exp(l);
  RouterOptions o{.scoring = RouterScoring::kSoftmaxTopK, .num_experts = 4, .top_k = 2};
  Routed r = Route(o, logits);
  EXPECT_THAT(r.ids, ElementsAre(1, 2));
  EXPECT_NEAR(r.weights[0], std::exp(2.0f) / sum, 1e-6);
  EXPECT_NEAR(r.weights[1], std::exp(1.0f) / sum, 1e-6);

  o.norm_topk_prob = true;
  r = Route(o, logits);
  EXPECT_THAT(r.ids, ElementsAre(1, 2));
  EXPECT_NEAR(r.weights[0], std::exp(2.0f) / (std::exp(2.0f) + std::exp(1.0f)), 1e-6);
  EXPECT_NEAR(r.weights[0] + r.weights[1], 1.0f, 1e-6);
}

TEST(MoeRouterTest, TopKThenSoftmaxUsesOnlyTheChosenLogits) {
  // Two tokens; the second prefers experts 0 and 3.
  const std::vector<float> logits = {0.5f, 3.0f,  2.0f, -4.0f,  //
                                     1.0f, -1.0f, 0.0f, 1.5f};
  Routed r = Route({.scoring = RouterScoring::kTopKSoftmax, .num_experts = 4, .top_k = 2}, logits);
  EXPECT_THAT(r.ids, ElementsAre(1, 2, 3, 0));
  EXPECT_NEAR(r.weights[0], 1.0f / (1.0f + std::exp(-1.0f)), 1e-6);
  EXPECT_NEAR(r.weights[2], 1.0f / (1.0f + std::exp(-0.5f)), 1e-6);
  EXPECT_NEAR(r.weights[2] + r.weights[3], 1.0f, 1e-6);
}

RouterOptions Grouped() {
  return {.scoring = RouterScoring::kSigmoidGroupedTopK,
          .num_experts = 8,
          .top_k = 2,
          .norm_topk_prob = false,
          .n_group = 4,
          .topk_group = 2,
          .routed_scaling_factor = 2.5f};
}

TEST(MoeRouterTest, GroupLimitedRoutingNeverPicksAnExpertOfADroppedGroup) {
  // Groups {0,1} {2,3} {4,5} {6,7}. Expert 0 has the largest single score, but its group's
  // top-2 sum is the lowest but one: groups 1 and 3 win, so expert 0 is not chosen.
  const std::vector<float> logits = {4.0f, -4.0f, 1.0f, 1.0f, -3.0f, -3.0f, 0.5f, 0.8f};
  Routed r = Route(Grouped(), logits);
  EXPECT_THAT(r.ids, ElementsAre(2, 3));
  EXPECT_NEAR(r.weights[0], Sigmoid(1.0f) * 2.5f, 1e-6);

  // With every group kept, expert 0 wins.
  RouterOptions all = Grouped();
  all.topk_group = 4;
  r = Route(all, logits);
  EXPECT_THAT(r.ids, ElementsAre(0, 2));
}

TEST(MoeRouterTest, CorrectionBiasChangesTheChoiceButNotTheWeights) {
  const std::vector<float> logits = {0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f, 0.7f, 0.8f};
  RouterOptions o = Grouped();
  o.topk_group = 4;
  Routed plain = Route(o, logits);
  EXPECT_THAT(plain.ids, ElementsAre(7, 6));
  // A bias lifts experts 0 and 1 above the others for selection.
  std::vector<float> bias(8, 0.0f);
  bias[0] = 0.5f;
  bias[1] = 0.4f;
  Routed biased = Route(o, logits, bias);
  EXPECT_THAT(biased.ids, ElementsAre(0, 1));
  EXPECT_NEAR(biased.weights[0], Sigmoid(0.1f) * 2.5f, 1e-6);
  EXPECT_NEAR(biased.weights[1], Sigmoid(0.2f) * 2.5f, 1e-6);

  o.norm_topk_prob = true;
  biased = Route(o, logits, bias);
  EXPECT_NEAR(biased.weights[0] + biased.weights[1], 2.5f, 1e-5);
  EXPECT_NEAR(biased.weights[0], Sigmoid(0.1f) / (Sigmoid(0.1f) + Sigmoid(0.2f)) * 2.5f, 1e-6);
}

TEST(MoeRouterTest, DroppedGroupsStayUnchosenWhenKeptChoicesAreNegative) {
  // Groups {0,1} {2,3}; group 1 wins (0.99 - 0.07 against 0.05 + 0.05). A bias of -0.8 makes
  // expert 3's choice negative (sigmoid(1) - 0.8); dropped experts are masked with -inf (as
  // DeepSeek's reference does), so expert 3 is still picked over the dropped group.
  RouterOptions o{.scoring = RouterScoring::kSigmoidGroupedTopK,
                  .num_experts = 4,
                  .top_k = 2,
                  .n_group = 2,
                  .topk_group = 1};
  const std::vector<float> logits = {-3.0f, -3.0f, 5.0f, 1.0f};
  Routed r = Route(o, logits, {0.0f, 0.0f, 0.0f, -0.8f});
  EXPECT_THAT(r.ids, ElementsAre(2, 3));
  // Weights stay the sigmoid scores of the chosen experts.
  EXPECT_NEAR(r.weights[1], Sigmoid(1.0f), 1e-6);
}

TEST(MoeRouterTest, GroupScoreIsTheSumOfTheTwoBestBiasedScores) {
  // Group 0 = {0,1}: one high and one very low; group 1 = {2,3}: two medium. Sum of the top 2
  // decides (not the maximum): group 1 wins with topk_group 1.
  RouterOptions o{.scoring = RouterScoring::kSigmoidGroupedTopK,
                  .num_experts = 4,
                  .top_k = 1,
                  .n_group = 2,
                  .topk_group = 1};
  Routed r = Route(o, {3.0f, -6.0f, 1.0f, 1.0f});
  EXPECT_THAT(r.ids, ElementsAre(2));
}

TEST(MoeRouterTest, SoftmaxGroupLimitedScoresAGroupByItsBestExpertAndScalesTheWeights) {
  // DeepSeek-V2's group_limited_greedy. Group 0 = {0,1}: one high, one very low; group 1 =
  // {2,3}: two medium. The maximum decides (not a sum): group 0 wins with topk_group 1, so
  // expert 1 is chosen although experts 2 and 3 have the larger probabilities.
  const std::vector<float> logits = {3.0f, -6.0f, 1.0f, 1.0f};
  float sum = 0;
  for (float l : logits) sum += std::exp(l);
  RouterOptions o{.scoring = RouterScoring::kSoftmaxTopK,
                  .num_experts = 4,
                  .top_k = 2,
                  .n_group = 2,
                  .topk_group = 1,
                  .routed_scaling_factor = 1.5f};
  Routed r = Route(o, logits);
  EXPECT_THAT(r.ids, ElementsAre(0, 1));
  // Weights are the unnormalized probabilities times routed_scaling_factor (V2 with
  // norm_topk_prob false).
  EXPECT_NEAR(r.weights[0], std::exp(3.0f) / sum * 1.5f, 1e-6);
  EXPECT_NEAR(r.weights[1], std::exp(-6.0f) / sum * 1.5f, 1e-9);
  // Greedy (every group kept) picks the two best probabilities.
  o.topk_group = 2;
  r = Route(o, logits);
  EXPECT_THAT(r.ids, ElementsAre(0, 2));
  EXPECT_NEAR(r.weights[1], std::exp(1.0f) / sum * 1.5f, 1e-6);
}

TEST(MoeRouterTest, InvalidOptionsNameTheField) {
  EXPECT_THAT(ValidateRouterOptions({.num_experts = 4, .top_k = 5}).message(),
              HasSubstr("num_experts_per_tok"));
  RouterOptions o = Grouped();
  o.n_group = 3;
  EXPECT_THAT(ValidateRouterOptions(o).message(), HasSubstr("n_group"));
  o = Grouped();
  o.topk_group = 5;
  EXPECT_THAT(ValidateRouterOptions(o).message(), HasSubstr("topk_group"));
  o = Grouped();
  o.topk_group = 1;
  o.top_k = 3;
  EXPECT_THAT(ValidateRouterOptions(o).message(), HasSubstr("num_experts_per_tok"));
  // The softmax router's groups may hold one expert, but must divide the experts.
  EXPECT_TRUE(
      ValidateRouterOptions({.num_experts = 4, .top_k = 1, .n_group = 4, .topk_group = 2}).ok());
  EXPECT_THAT(ValidateRouterOptions({.num_experts = 4, .top_k = 1, .n_group = 3, .topk_group = 2})
                  .message(),
              HasSubstr("n_group 3"));
}

}  // namespace
}  // namespace ringserve
