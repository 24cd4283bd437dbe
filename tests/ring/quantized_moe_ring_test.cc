// Quantized MoE checkpoints through a 2-stage CPU ring (real stage and coordinator processes):
// a C++-written quantized copy of a MoE fixture (stage/model/testing/quantized_copy.h) generates
// exactly the greedy tokens of its dequantized float copy, each stage reading and dequantizing
// only its own layers' experts.
#include <string>

#include "gtest/gtest.h"
#include "stage/model/testing/quantized_copy.h"
#include "tests/ring/ring_harness.h"

namespace ringserve::testing {
namespace {

struct Case {
  std::string name;
  std::string fixture;  // tests/fixtures/models/<fixture>, or "gpt_oss_wide" (MXFP4-ready)
  CopyOptions options;
};

class QuantizedMoeRingTest : public ::testing::TestWithParam<Case> {};

TEST_P(QuantizedMoeRingTest, TwoStageRingGeneratesTheDequantizedModelsTokens) {
  const Case& c = GetParam();
  TempDir tmp;
  std::string src = FixtureModel(c.fixture);
  if (c.fixture == "gpt_oss_wide") {
    src = tmp.path() + "/src";
    ASSERT_TRUE(WriteMxfp4ReadyGptOss(FixtureModel("gpt_oss"), src).ok());
  }
  auto copy = WriteQuantizedCopy(src, c.options, tmp.path() + "/quant", tmp.path() + "/float");
  ASSERT_TRUE(copy.ok()) << copy.status();
  std::vector<std::vector<int32_t>> tokens;
  for (const std::string& dir : {tmp.path() + "/quant", tmp.path() + "/float"}) {
    auto ring = Ring::Start({.model_dir = dir, .partition = {1, 1}});
    ASSERT_TRUE(ring.ok()) << ring.status();
    Generation g = (*ring)->Generate(IdsRequest({5, 17, 99, 3, 42, 64, 8, 120, 31}, 12));
    ASSERT_TRUE(g.status.ok()) << g.status.error_message() << "\n" << (*ring)->CoordinatorLog();
    EXPECT_EQ(g.tokens.size(), 12u);
    tokens.push_back(g.tokens);
  }
  EXPECT_EQ(tokens[0], tokens[1]);
}

INSTANTIATE_TEST_SUITE_P(
    Formats, QuantizedMoeRingTest,
    ::testing::Values(
        Case{"MixtralFp8Block", "mixtral", {.format = CopyFormat::kFp8Block, .block = 16}},
        Case{"GptOssMxfp4", "gpt_oss_wide", {.format = CopyFormat::kMxfp4, .block = 32}}),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

}  // namespace
}  // namespace ringserve::testing
