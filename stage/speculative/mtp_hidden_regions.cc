#include "stage/speculative/mtp_hidden_regions.h"

#include <algorithm>

namespace ringserve {

MtpHiddenRegions::MtpHiddenRegions(int store_rows, int rows_per_region)
    : rows_per_region_(std::max(1, rows_per_region)) {
  const int regions = std::max(0, store_rows) / rows_per_region_;
  for (int r = regions - 1; r >= 0; --r) free_.push_back(r);
  held_.assign(static_cast<size_t>(regions) * rows_per_region_, -1);
}

bool MtpHiddenRegions::Acquire(uint64_t seq_id) {
  if (owner_.count(seq_id) > 0) return true;
  if (free_.empty()) return false;
  owner_[seq_id] = free_.back();
  free_.pop_back();
  return true;
}

void MtpHiddenRegions::Release(uint64_t seq_id) {
  auto it = owner_.find(seq_id);
  if (it == owner_.end()) return;
  const int base = it->second * rows_per_region_;
  std::fill(held_.begin() + base, held_.begin() + base + rows_per_region_, -1);
  free_.push_back(it->second);
  owner_.erase(it);
}

int MtpHiddenRegions::RowOf(uint64_t seq_id, int32_t position) const {
  auto it = owner_.find(seq_id);
  if (it == owner_.end() || position < 0) return -1;
  return it->second * rows_per_region_ + position % rows_per_region_;
}

void MtpHiddenRegions::Put(uint64_t seq_id, int32_t position) {
  const int row = RowOf(seq_id, position);
  if (row >= 0) held_[row] = position;
}

int MtpHiddenRegions::Find(uint64_t seq_id, int32_t position) const {
  const int row = RowOf(seq_id, position);
  return row >= 0 && held_[row] == position ? row : -1;
}

std::vector<MtpHiddenRegions::Run> MtpHiddenRegions::Runs(uint64_t seq_id, int32_t first,
                                                          int count) const {
  std::vector<Run> runs;
  int32_t p = first;
  const int32_t end = first + std::min(count, rows_per_region_);
  while (p < end) {
    const int row = RowOf(seq_id, p);
    if (row < 0) return {};
    const int to_wrap = rows_per_region_ - p % rows_per_region_;
    const int n = std::min(to_wrap, end - p);
    runs.push_back({.first_position = p, .first_row = row, .count = n});
    p += n;
  }
  return runs;
}

}  // namespace ringserve
