#include "coordinator/http/openai_logprobs.h"

#include "gtest/gtest.h"

namespace ringserve::http {
namespace {

std::string Text(int32_t id) {
  switch (id) {
    case 1:
      return "Hello";
    case 2:
      return " world";
    case 3:
      return "\xc3\xa9";  // é
    default:
      return "<" + std::to_string(id) + ">";
  }
}

const std::vector<TokenLogprobs> kTokens = {
    {.token_id = 1, .logprob = -0.5f, .top = {{1, -0.5f}, {7, -1.5f}}},
    {.token_id = 3, .logprob = -2.0f, .top = {{2, -0.25f}, {3, -2.0f}}},
};

TEST(OpenAiLogprobsTest, CompletionShapeAndTextOffsets) {
  int64_t offset = 10;
  nlohmann::json j = CompletionLogprobsJson(kTokens, Text, &offset);
  EXPECT_EQ(j["tokens"], nlohmann::json({"Hello", "\xc3\xa9"}));
  EXPECT_EQ(j["token_logprobs"], nlohmann::json({-0.5, -2.0}));
  EXPECT_EQ(j["text_offset"], nlohmann::json({10, 15}));
  EXPECT_EQ(offset, 17);
  EXPECT_EQ(j["top_logprobs"][0], nlohmann::json({{"Hello", -0.5}, {"<7>", -1.5}}));
  EXPECT_EQ(j["top_logprobs"][1], nlohmann::json({{" world", -0.25}, {"\xc3\xa9", -2.0}}));
  // No alternatives asked: null entries.
  nlohmann::json bare = CompletionLogprobsJson({{.token_id = 2, .logprob = -1.0f}}, Text, &offset);
  EXPECT_TRUE(bare["top_logprobs"][0].is_null());
}

TEST(OpenAiLogprobsTest, ChatShapeWithBytes) {
  nlohmann::json j = ChatLogprobsJson(kTokens, Text);
  ASSERT_EQ(j["content"].size(), 2u);
  EXPECT_TRUE(j["refusal"].is_null());
  const nlohmann::json& second = j["content"][1];
  EXPECT_EQ(second["token"], "\xc3\xa9");
  EXPECT_FLOAT_EQ(second["logprob"].get<float>(), -2.0f);
  EXPECT_EQ(second["bytes"], nlohmann::json({0xc3, 0xa9}));
  ASSERT_EQ(second["top_logprobs"].size(), 2u);
  EXPECT_EQ(second["top_logprobs"][0]["token"], " world");
  EXPECT_EQ(second["top_logprobs"][0]["bytes"].size(), 6u);
}

}  // namespace
}  // namespace ringserve::http
