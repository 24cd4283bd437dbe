// Where a GPU MTP drafter (cuda_mtp_drafter.h) keeps the target's hidden states between steps:
// a store of rows split into regions of rows_per_region rows, one region per sequence, position
// p of a sequence in row region * rows_per_region + p % rows_per_region. Consecutive positions
// are consecutive rows (at most one wrap), so a chunk's rows copy in one or two transfers. Each
// row remembers the position it holds: a position overwritten by a later one rows_per_region
// further on is found missing, never stale. Host bookkeeping only (the rows live on the device).
// Not thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

namespace ringserve {

class MtpHiddenRegions {
 public:
  // store_rows / rows_per_region regions (rows_per_region > 0).
  MtpHiddenRegions(int store_rows, int rows_per_region);

  int rows_per_region() const { return rows_per_region_; }
  int num_regions() const {
    return static_cast<int>(free_.size()) + static_cast<int>(owner_.size());
  }
  int free_regions() const { return static_cast<int>(free_.size()); }

  // The sequence's region, taking a free one on first use; false when none is free.
  bool Acquire(uint64_t seq_id);
  // Frees the sequence's region and forgets what its rows held.
  void Release(uint64_t seq_id);

  // The store row that holds (after Put) or will hold position p of the sequence: -1 without a
  // region.
  int RowOf(uint64_t seq_id, int32_t position) const;
  // Records that the row of position p now holds p (the caller copies it there).
  void Put(uint64_t seq_id, int32_t position);
  // The row holding position p, or -1 when it holds nothing or another position.
  int Find(uint64_t seq_id, int32_t position) const;

  struct Run {
    int32_t first_position = 0;
    int first_row = 0;
    int count = 0;
  };
  // Positions [first, first + count) (count <= rows_per_region) as runs of consecutive rows: one,
  // or two where the region wraps. Empty without a region.
  std::vector<Run> Runs(uint64_t seq_id, int32_t first, int count) const;

 private:
  int rows_per_region_;
  std::vector<int> free_;          // free regions (taken from the back)
  std::map<uint64_t, int> owner_;  // seq -> region
  std::vector<int32_t> held_;      // [store rows] the position a row holds, or -1
};

}  // namespace ringserve
