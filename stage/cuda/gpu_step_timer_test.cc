// GpuStepTimer on a real GPU: steps are counted once they ran, each once, in GPU time.
#include "stage/cuda/gpu_step_timer.h"

#include <cuda_runtime.h>

#include "gtest/gtest.h"
#include "kernels/cuda/test_util.h"

namespace ringserve::cuda {
namespace {

constexpr size_t kBytes = size_t{1} << 30;  // a memset of 1 GiB: ~0.3 ms on an H200

class GpuStepTimerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    RS_SKIP_WITHOUT_GPU();
    ASSERT_EQ(cudaStreamCreate(&stream_), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&buffer_, kBytes), cudaSuccess);
  }
  void TearDown() override {
    if (buffer_) cudaFree(buffer_);
    if (stream_) cudaStreamDestroy(stream_);
  }
  void Step(GpuStepTimer& timer, int memsets) {
    timer.Begin(stream_);
    for (int i = 0; i < memsets; ++i) ASSERT_EQ(cudaMemsetAsync(buffer_, i, kBytes, stream_), 0);
    timer.End(stream_);
  }

  cudaStream_t stream_ = nullptr;
  void* buffer_ = nullptr;
};

TEST_F(GpuStepTimerTest, CountsFinishedStepsOnce) {
  GpuStepTimer timer;
  EXPECT_EQ(timer.TakeCompletedMicros(), 0);
  Step(timer, 1);
  ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  const int64_t one = timer.TakeCompletedMicros();
  EXPECT_GT(one, 0);
  EXPECT_EQ(timer.TakeCompletedMicros(), 0);  // already counted

  Step(timer, 20);
  ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  const int64_t twenty = timer.TakeCompletedMicros();
  EXPECT_GT(twenty, 10 * one);  // GPU time grows with the work, not with the CPU's enqueueing
}

TEST_F(GpuStepTimerTest, AStepStillRunningIsCountedLater) {
  GpuStepTimer timer;
  Step(timer, 50);  // tens of milliseconds of GPU work, enqueued in microseconds
  const int64_t early = timer.TakeCompletedMicros();
  ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  const int64_t late = timer.TakeCompletedMicros();
  EXPECT_EQ(early, 0);
  EXPECT_GT(late, 1000);
}

TEST_F(GpuStepTimerTest, TooManyPendingStepsAreDroppedNotMisattributed) {
  GpuStepTimer timer;
  for (int i = 0; i < GpuStepTimer::kMaxPending + 4; ++i) Step(timer, 1);
  ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  const int64_t pending_max = timer.TakeCompletedMicros();
  Step(timer, 1);
  ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  const int64_t one = timer.TakeCompletedMicros();
  EXPECT_GT(one, 0);
  // kMaxPending steps were timed (the 4 beyond were not), each about `one`.
  EXPECT_GT(pending_max, (GpuStepTimer::kMaxPending / 2) * one);
  EXPECT_LT(pending_max, (GpuStepTimer::kMaxPending + 4) * one * 2);
}

}  // namespace
}  // namespace ringserve::cuda
