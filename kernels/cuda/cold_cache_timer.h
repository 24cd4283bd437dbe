// Times one kernel launch (or a few) with the GPU's L2 cache emptied of its operands first, as a
// decode step meets each weight matrix: the model is far larger than L2, so every matrix comes
// from DRAM. Back-to-back timing of the same call instead finds a matrix that fits L2 (on an
// H200, 50 MB: the Llama-3.1-8B o and qkv matrices) already there: the o projection at 32 rows
// read 10.6 us warm and 14.9 cold. (GEMM tuning with either timing gave the same decode rate at
// 32 streams on an H200, within 0.6%: bench/cuda/NOTES.md, run 12.)
//
// Each round reads a scratch buffer of twice the L2 size on the stream (untimed; reads, so L2 is
// left clean: evicting the dirty lines a memset leaves cost a following 117 MB read 10 us on an
// H200), then times the call between two events; the result is the median over the rounds. Not
// thread-safe; the stream must not be capturing.
#pragma once

#include <algorithm>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/cuda/cuda_utils.h"

namespace ringserve::cuda {

class ColdCacheTimer {
 public:
  // Allocates the scratch buffer (2 x the current device's L2) and two events.
  static absl::StatusOr<std::unique_ptr<ColdCacheTimer>> Create();
  ~ColdCacheTimer();
  ColdCacheTimer(const ColdCacheTimer&) = delete;
  ColdCacheTimer& operator=(const ColdCacheTimer&) = delete;

  // Median microseconds of `run` (returns absl::Status) over `rounds` cold-cache rounds (warm
  // ones, the operands left in L2 by the call before, when `evict` is false), after one untimed
  // call; -1 when a call or the timing failed.
  template <typename Fn>
  float MedianUs(Fn&& run, cudaStream_t stream, bool evict = true, int rounds = 7) {
    if (rounds < 1 || !run().ok()) return -1;
    std::vector<float> us;
    for (int r = 0; r < rounds; ++r) {
      if (evict) Evict(stream);
      cudaEventRecord(start_, stream);
      if (!run().ok()) return -1;
      cudaEventRecord(stop_, stream);
      float ms = 0;
      if (cudaEventSynchronize(stop_) != cudaSuccess ||
          cudaEventElapsedTime(&ms, start_, stop_) != cudaSuccess) {
        return -1;
      }
      us.push_back(1000 * ms);
    }
    std::nth_element(us.begin(), us.begin() + us.size() / 2, us.end());
    return us[us.size() / 2];
  }

 private:
  ColdCacheTimer() = default;
  // Queues the read pass. It does not query the launch status: that would consume an error left
  // by the caller's last call (the event sync below still fails on a sticky one).
  void Evict(cudaStream_t stream);

  DeviceBuffer scratch_;
  int grid_ = 0;
  cudaEvent_t start_ = nullptr;
  cudaEvent_t stop_ = nullptr;
};

}  // namespace ringserve::cuda
