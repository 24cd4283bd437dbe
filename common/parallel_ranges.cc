#include "common/parallel_ranges.h"

#include <algorithm>
#include <thread>
#include <vector>

namespace ringserve {

absl::Status ParallelRanges(int64_t n, int64_t min_items,
                            const std::function<absl::Status(int64_t begin, int64_t end)>& fn) {
  if (n <= 0) return absl::OkStatus();
  min_items = std::max<int64_t>(1, min_items);
  const int64_t threads = std::clamp<int64_t>(std::thread::hardware_concurrency(), 1, 32);
  const int64_t ranges = std::clamp<int64_t>(n / min_items, 1, threads);
  const int64_t per_range = (n + ranges - 1) / ranges;
  std::vector<absl::Status> results(ranges);
  std::vector<std::thread> workers;
  workers.reserve(ranges - 1);
  for (int64_t r = 1; r < ranges; ++r) {
    const int64_t begin = r * per_range, end = std::min(n, begin + per_range);
    if (begin >= end) break;
    workers.emplace_back([&fn, &results, r, begin, end] { results[r] = fn(begin, end); });
  }
  results[0] = fn(0, std::min(n, per_range));
  for (std::thread& w : workers) w.join();
  for (const absl::Status& s : results) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace ringserve
