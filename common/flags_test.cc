#include "common/flags.h"

#include "gtest/gtest.h"

namespace ringserve {
namespace {

TEST(FlagsTest, DashesInNamesBecomeUnderscoresAndValuesAreKept) {
  EXPECT_EQ(NormalizeFlagSpelling("--max-tokens=12"), "--max_tokens=12");
  EXPECT_EQ(NormalizeFlagSpelling("--max-tokens"), "--max_tokens");
  EXPECT_EQ(NormalizeFlagSpelling("--prompt-text=a-b --c"), "--prompt_text=a-b --c");
  EXPECT_EQ(NormalizeFlagSpelling("--no-ignore-eos"), "--noignore_eos");
  EXPECT_EQ(NormalizeFlagSpelling("--model_dir"), "--model_dir");
  EXPECT_EQ(NormalizeFlagSpelling("-x-y"), "-x-y");
  EXPECT_EQ(NormalizeFlagSpelling("a-b"), "a-b");
  EXPECT_EQ(NormalizeFlagSpelling("--"), "--");
  EXPECT_EQ(NormalizeFlagSpelling("-5"), "-5");
}

}  // namespace
}  // namespace ringserve
