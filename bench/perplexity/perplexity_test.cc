#include "bench/perplexity/perplexity.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ringserve::perplexity {
namespace {

using ::testing::ElementsAre;
using ::testing::Pair;

TEST(PerplexityTest, SplitsDocumentsAtBlankLinesLikeTheTrainingScript) {
  // Python: text.rstrip("\n").split("\n\n"), empty documents dropped.
  EXPECT_THAT(SplitDocuments("a\nb\n\nc\n"), ElementsAre("a\nb", "c"));
  EXPECT_THAT(SplitDocuments("a\n\n\n\nb\n\n"), ElementsAre("a", "b"));
  EXPECT_THAT(SplitDocuments("a\n\n\nb"), ElementsAre("a", "\nb"));
  EXPECT_THAT(SplitDocuments("\n\n"), ElementsAre());
  EXPECT_THAT(SplitDocuments("solo"), ElementsAre("solo"));
}

TEST(PerplexityTest, CutsWindowsAndDropsOnesWithNothingToScore) {
  EXPECT_THAT(Windows(5, 2), ElementsAre(Pair(0, 2), Pair(2, 4)));  // [4, 5) scores nothing
  EXPECT_THAT(Windows(6, 3), ElementsAre(Pair(0, 3), Pair(3, 6)));
  EXPECT_THAT(Windows(1, 512), ElementsAre());
  EXPECT_THAT(Windows(600, 512), ElementsAre(Pair(0, 512), Pair(512, 600)));
}

}  // namespace
}  // namespace ringserve::perplexity
