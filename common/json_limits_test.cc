#include "common/json_limits.h"

#include <string>

#include "gtest/gtest.h"

namespace ringserve {
namespace {

std::string Nested(int depth) { return std::string(depth, '[') + std::string(depth, ']'); }

TEST(JsonLimitsTest, AcceptsDepthUpToTheLimit) {
  EXPECT_TRUE(CheckJsonDepth(Nested(kMaxJsonDepth), "body").ok());
  EXPECT_TRUE(CheckJsonDepth(R"({"a": [1, {"b": "]]]]"}]})", "body", 3).ok());
}

TEST(JsonLimitsTest, RefusesDeeperNestingNamingTheSource) {
  absl::Status status = CheckJsonDepth(Nested(kMaxJsonDepth + 1), "request body");
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("request body"), std::string_view::npos) << status;
  // 40 KB of brackets, the body that used to overflow the stack.
  EXPECT_FALSE(CheckJsonDepth(std::string(40000, '['), "body").ok());
  EXPECT_FALSE(CheckJsonDepth(R"({"a": {"b": {"c": 1}}})", "body", 2).ok());
}

TEST(JsonLimitsTest, BracketsInStringsAndEscapesDoNotCount) {
  std::string text = R"(["\"[[[[[[", "\\", "{{{{{{{{"])";
  EXPECT_TRUE(CheckJsonDepth(text, "body", 1).ok());
}

}  // namespace
}  // namespace ringserve
