#include "common/parallel_ranges.h"

#include <atomic>
#include <mutex>
#include <numeric>
#include <set>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace ringserve {
namespace {

TEST(ParallelRangesTest, CoversEveryItemOnceInDisjointRanges) {
  for (const int64_t n : {1, 7, 1000, 100003}) {
    for (const int64_t min_items : {1, 64, 5000}) {
      std::vector<std::atomic<int>> seen(n);
      std::mutex mu;
      std::set<std::pair<int64_t, int64_t>> ranges;
      ASSERT_TRUE(ParallelRanges(n, min_items, [&](int64_t begin, int64_t end) {
                    for (int64_t i = begin; i < end; ++i) seen[i].fetch_add(1);
                    std::lock_guard<std::mutex> lock(mu);
                    ranges.insert({begin, end});
                    return absl::OkStatus();
                  }).ok());
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(seen[i].load(), 1) << n << " item " << i;
      // Contiguous, and no range shorter than min_items except the last.
      int64_t next = 0;
      for (const auto& [begin, end] : ranges) {
        EXPECT_EQ(begin, next);
        if (end != n) {
          EXPECT_GE(end - begin, std::min(n, min_items));
        }
        next = end;
      }
      EXPECT_EQ(next, n);
    }
  }
}

TEST(ParallelRangesTest, ReturnsTheErrorOfTheFirstFailingRange) {
  // Every range fails with its begin: the answer is the one a sequential loop meets first.
  const absl::Status s = ParallelRanges(10000, 1, [](int64_t begin, int64_t) {
    return absl::InvalidArgumentError(std::to_string(begin));
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "0");
  // Only a later range fails.
  const absl::Status later = ParallelRanges(10000, 1, [](int64_t, int64_t end) {
    return end == 10000 ? absl::NotFoundError("last") : absl::OkStatus();
  });
  EXPECT_EQ(later.code(), absl::StatusCode::kNotFound);
}

TEST(ParallelRangesTest, NothingToDoCallsNothing) {
  int calls = 0;
  EXPECT_TRUE(ParallelRanges(0, 1, [&](int64_t, int64_t) {
                ++calls;
                return absl::OkStatus();
              }).ok());
  EXPECT_EQ(calls, 0);
}

}  // namespace
}  // namespace ringserve
