// Runs a range of independent work items on several threads, for load-time loops over the rows
// of a weight (dequantizing and repacking a checkpoint's tensors). Not a pool: each call starts
// and joins its threads, so it suits work of milliseconds or more per call.
#pragma once

#include <cstdint>
#include <functional>

#include "absl/status/status.h"

namespace ringserve {

// Splits [0, n) into contiguous ranges of at least `min_items` items (the last may be shorter),
// one per thread up to std::thread::hardware_concurrency() (capped at 32; 1 on a machine that
// does not say), and calls fn(begin, end) once per range, the first range on the calling thread.
// Every range runs to its end; the result is the error of the lowest-numbered range that failed
// (what a sequential loop over the ranges would have stopped at), OK otherwise. fn must be safe
// to call concurrently on disjoint ranges. n <= 0 calls nothing.
absl::Status ParallelRanges(int64_t n, int64_t min_items,
                            const std::function<absl::Status(int64_t begin, int64_t end)>& fn);

}  // namespace ringserve
