#include "coordinator/http/request_ids.h"

#include "coordinator/engine.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ringserve::http {
namespace {

using ::testing::HasSubstr;

TEST(RequestIdsTest, ChoiceZeroKeepsTheIdAndTheOthersCarryTheServersMark) {
  EXPECT_EQ(ChoiceRequestId("job", 0), "job");
  EXPECT_EQ(ChoiceRequestId("job", 1), "job#1");
  EXPECT_EQ(ChoiceRequestId("job", kMaxChoices - 1), "job#15");
}

TEST(RequestIdsTest, NoClientIdIsTheIdOfAnotherRequestsChoice) {
  EXPECT_TRUE(CheckClientRequestId("job").ok());
  EXPECT_TRUE(CheckClientRequestId("job-1").ok());  // the old form of choice 1's id: free now
  for (int i = 1; i < kMaxChoices; ++i) {
    absl::Status status = CheckClientRequestId(ChoiceRequestId("job", i));
    EXPECT_TRUE(absl::IsInvalidArgument(status)) << status;
    EXPECT_THAT(status.message(), HasSubstr("request_id"));
  }
  EXPECT_FALSE(CheckClientRequestId("#").ok());
}

}  // namespace
}  // namespace ringserve::http
