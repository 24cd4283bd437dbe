// Test-only helpers for the CUDA kernel tests: skipping without a GPU, random bf16 data that
// the fp32 CPU reference sees exactly, host<->device copies, and the relative L2 error.
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "common/dtype.h"
#include "gtest/gtest.h"
#include "kernels/cuda/cuda_utils.h"

namespace ringserve::cuda::testing {

#define RS_SKIP_WITHOUT_GPU()                                                        \
  do {                                                                               \
    if (::ringserve::cuda::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device"; \
  } while (0)

#define RS_ASSERT_OK(expr)                       \
  do {                                           \
    const ::absl::Status rs_s_ = (expr);         \
    ASSERT_TRUE(rs_s_.ok()) << rs_s_.ToString(); \
  } while (0)

// Random values rounded to bf16, returned as fp32 (exactly representable in bf16).
inline std::vector<float> RandomBf16Values(std::mt19937& rng, size_t n, float scale = 1.0f) {
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = BF16ToFloat(FloatToBF16(dist(rng)));
  return v;
}

inline std::vector<uint16_t> ToBf16Bits(const std::vector<float>& v) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = FloatToBF16(v[i]);
  return out;
}

inline std::vector<float> FromBf16Bits(const std::vector<uint16_t>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = BF16ToFloat(v[i]);
  return out;
}

template <typename T>
DeviceBuffer Upload(const std::vector<T>& host) {
  DeviceBuffer buf;
  EXPECT_TRUE(buf.Allocate(host.size() * sizeof(T) + 16).ok());
  EXPECT_EQ(cudaMemcpy(buf.get(), host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice),
            cudaSuccess);
  return buf;
}

// fp32 values -> device bf16.
inline DeviceBuffer UploadBf16(const std::vector<float>& host) { return Upload(ToBf16Bits(host)); }

template <typename T>
std::vector<T> Download(const DeviceBuffer& buf, size_t n) {
  std::vector<T> host(n);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(host.data(), buf.get(), n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return host;
}

inline std::vector<float> DownloadBf16(const DeviceBuffer& buf, size_t n) {
  return FromBf16Bits(Download<uint16_t>(buf, n));
}

// Fills a device buffer with a NaN pattern (0xFFFF bf16 / 0xFFFFFFFF fp32) so unwritten
// outputs fail the comparison.
inline void Poison(DeviceBuffer& buf) {
  ASSERT_EQ(cudaMemset(buf.get(), 0xff, buf.bytes()), cudaSuccess);
}

// ||got - want|| / ||want||; infinity if any value is NaN.
inline double RelL2(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (std::isnan(got[i])) return INFINITY;
    num += (got[i] - want[i]) * static_cast<double>(got[i] - want[i]);
    den += want[i] * static_cast<double>(want[i]);
  }
  return std::sqrt(num / (den > 0 ? den : 1));
}

}  // namespace ringserve::cuda::testing
