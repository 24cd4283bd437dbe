#include "stage/speculative/mtp_hidden_regions.h"

#include <gtest/gtest.h>

namespace ringserve {
namespace {

TEST(MtpHiddenRegionsTest, PositionsMapIntoTheSequencesRegionAndWrap) {
  MtpHiddenRegions regions(/*store_rows=*/10, /*rows_per_region=*/4);  // two regions
  EXPECT_EQ(regions.num_regions(), 2);
  EXPECT_EQ(regions.RowOf(7, 0), -1);
  ASSERT_TRUE(regions.Acquire(7));
  ASSERT_TRUE(regions.Acquire(7));  // the same region again
  ASSERT_TRUE(regions.Acquire(8));
  EXPECT_FALSE(regions.Acquire(9));  // none left
  EXPECT_EQ(regions.free_regions(), 0);
  const int base7 = regions.RowOf(7, 0);
  const int base8 = regions.RowOf(8, 0);
  EXPECT_NE(base7, base8);
  EXPECT_EQ(regions.RowOf(7, 5), base7 + 1);

  // Positions 2..5 of seq 7: rows 2, 3 then wrap to 0, 1.
  const auto runs = regions.Runs(7, 2, 4);
  ASSERT_EQ(runs.size(), 2u);
  EXPECT_EQ(runs[0].first_position, 2);
  EXPECT_EQ(runs[0].first_row, base7 + 2);
  EXPECT_EQ(runs[0].count, 2);
  EXPECT_EQ(runs[1].first_position, 4);
  EXPECT_EQ(runs[1].first_row, base7);
  EXPECT_EQ(runs[1].count, 2);
  EXPECT_EQ(regions.Runs(7, 2, 9).size(), 2u);  // capped at one region's rows
}

TEST(MtpHiddenRegionsTest, OverwrittenAndReleasedPositionsAreMissingNotStale) {
  MtpHiddenRegions regions(8, 4);
  ASSERT_TRUE(regions.Acquire(1));
  EXPECT_EQ(regions.Find(1, 3), -1);  // never put
  regions.Put(1, 3);
  EXPECT_EQ(regions.Find(1, 3), regions.RowOf(1, 3));
  regions.Put(1, 7);  // the same row, a later position
  EXPECT_EQ(regions.Find(1, 3), -1);
  EXPECT_EQ(regions.Find(1, 7), regions.RowOf(1, 7));
  regions.Release(1);
  EXPECT_EQ(regions.Find(1, 7), -1);
  ASSERT_TRUE(regions.Acquire(2));  // may reuse the region: nothing of seq 1 shows through
  EXPECT_EQ(regions.Find(2, 7), -1);
}

}  // namespace
}  // namespace ringserve
