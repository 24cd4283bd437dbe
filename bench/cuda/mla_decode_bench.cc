// mla_decode_bench: the absorbed MLA decode attention (kernels/cuda/mla_decode.h) of one
// DeepSeek-V3 layer (128 heads, latent 512 + rope 64, bf16 paged cache in blocks of 16) at
// 1 and 32 streams and several contexts, against the bandwidth bound of the cache bytes it must
// read (streams x context x 1,152 bytes). The device's achievable read bandwidth is measured as
// a device-to-device copy (bytes read + written over time) beside the datasheet figure, and the
// tensor-core rate it reaches (128 heads x (576 + 512) x 2 FLOP per cached token). Each row runs
// both kernels (mma.sync, and wgmma where the device is compute capability 9.0 and the build has
// its sm_90a code), with the splits each one's plan chooses.
//
//   mla_decode_bench [--contexts 4096,32768] [--streams 1,32] [--iters 20] [--kernels mma,wgmma]
#include <algorithm>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "bench/cuda/event_timer.h"
#include "common/dtype.h"
#include "common/flags.h"
#include "kernels/cuda/cuda_utils.h"
#include "kernels/cuda/device_info.h"
#include "kernels/cuda/mla_decode.h"

ABSL_FLAG(std::vector<std::string>, contexts, std::vector<std::string>({"4096", "32768"}),
          "context lengths (keys per stream)");
ABSL_FLAG(std::vector<std::string>, streams, std::vector<std::string>({"1", "32"}),
          "decode streams (entries) per launch");
ABSL_FLAG(int, iters, 20, "timed launches per row");
ABSL_FLAG(int, heads, 128, "query heads");
ABSL_FLAG(std::vector<std::string>, kernels, std::vector<std::string>({"mma", "wgmma"}),
          "kernels to time: mma (mma.sync), wgmma (compute capability 9.0 only)");
ABSL_FLAG(double, datasheet_tbps, 4.8, "the device's datasheet HBM bandwidth, TB/s");

namespace {

using ringserve::cuda::DeviceBuffer;

// Fills `bytes` of device memory with random bf16 in [-1, 1): 1 MiB from the host, then
// doubling device-to-device copies.
bool FillRandom(void* device, size_t bytes) {
  const size_t seed_bytes = std::min<size_t>(bytes, size_t{1} << 20);
  std::vector<uint16_t> host(seed_bytes / 2);
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (uint16_t& v : host) v = ringserve::FloatToBF16(dist(rng));
  if (cudaMemcpy(device, host.data(), seed_bytes, cudaMemcpyHostToDevice) != cudaSuccess) {
    return false;
  }
  for (size_t done = seed_bytes; done < bytes;) {
    const size_t n = std::min(done, bytes - done);
    auto* base = static_cast<char*>(device);
    if (cudaMemcpy(base + done, base, n, cudaMemcpyDeviceToDevice) != cudaSuccess) return false;
    done += n;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  ringserve::ParseCommandLineFlags(argc, argv, "Times the absorbed MLA decode attention.");
  if (ringserve::cuda::CudaDeviceCount() == 0) {
    std::fprintf(stderr, "mla_decode_bench: no CUDA device\n");
    return 1;
  }
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  const int heads = absl::GetFlag(FLAGS_heads);
  const int iters = absl::GetFlag(FLAGS_iters);
  const double datasheet = absl::GetFlag(FLAGS_datasheet_tbps) * 1e12;
  std::vector<int> contexts, streams;
  for (const std::string& s : absl::GetFlag(FLAGS_contexts)) contexts.push_back(std::stoi(s));
  for (const std::string& s : absl::GetFlag(FLAGS_streams)) streams.push_back(std::stoi(s));
  std::vector<ringserve::cuda::MlaDecodeKernel> kernels;
  for (const std::string& k : absl::GetFlag(FLAGS_kernels)) {
    if (k == "mma") {
      kernels.push_back(ringserve::cuda::MlaDecodeKernel::kMmaSync);
    } else if (k == "wgmma") {
      if (prop.major * 10 + prop.minor == 90 &&
          ringserve::cuda::CompiledKernelsOfThisBuild().sm90a_prefill) {
        kernels.push_back(ringserve::cuda::MlaDecodeKernel::kWgmmaSm90);
      } else {
        std::fprintf(stderr, "mla_decode_bench: no wgmma kernel on this device or build\n");
      }
    } else {
      std::fprintf(stderr, "mla_decode_bench: unknown kernel %s (mma, wgmma)\n", k.c_str());
      return 1;
    }
  }
  const int block_size = 16;
  const int64_t row_bytes = ringserve::cuda::kMlaRowDim * 2;

  // Achievable bandwidth: a 1 GiB device-to-device copy reads and writes 1 GiB each.
  double copy_tbps = 0;
  {
    const size_t n = size_t{1} << 30;
    DeviceBuffer a, b;
    if (!a.Allocate(n).ok() || !b.Allocate(n).ok()) return 1;
    const double ms = ringserve::cuda::TimeMs(
        [&] { return cudaMemcpyAsync(b.get(), a.get(), n, cudaMemcpyDeviceToDevice); }, 2, 10);
    copy_tbps = 2.0 * n / (ms * 1e-3) / 1e12;
  }
  std::printf("device %s, %d SMs; d2d copy %.2f TB/s (read + write), datasheet %.2f TB/s\n",
              prop.name, prop.multiProcessorCount, copy_tbps, datasheet / 1e12);
  std::printf("%8s %8s %8s %7s %9s %10s %9s %8s %8s %8s\n", "kernel", "streams", "context",
              "splits", "us", "cache MB", "TB/s", "%sheet", "%copy", "TFLOP/s");
  for (int ctx : contexts) {
    for (int n : streams) {
      const int blocks_per_seq = (ctx + block_size - 1) / block_size;
      const int64_t num_blocks = static_cast<int64_t>(n) * blocks_per_seq;
      const int64_t block_stride = static_cast<int64_t>(block_size) * ringserve::cuda::kMlaRowDim;
      DeviceBuffer cache, q, out, lens, tables;
      if (!cache.Allocate(num_blocks * block_stride * 2).ok() ||
          !FillRandom(cache.get(), cache.bytes())) {
        std::fprintf(stderr, "cache of %lld blocks: allocation failed\n",
                     static_cast<long long>(num_blocks));
        return 1;
      }
      const size_t q_elems = static_cast<size_t>(n) * heads * ringserve::cuda::kMlaRowDim;
      if (!q.Allocate(q_elems * 2).ok() || !FillRandom(q.get(), q.bytes()) ||
          !out.Allocate(static_cast<size_t>(n) * heads * ringserve::cuda::kMlaLatentDim * 2).ok()) {
        return 1;
      }
      std::vector<int32_t> ids(num_blocks);
      std::iota(ids.begin(), ids.end(), 0);
      std::shuffle(ids.begin(), ids.end(), std::mt19937(11));  // paged, not contiguous
      const std::vector<int32_t> host_lens(n, ctx);
      if (!lens.Allocate(n * 4).ok() || !tables.Allocate(num_blocks * 4).ok()) return 1;
      cudaMemcpy(lens.get(), host_lens.data(), n * 4, cudaMemcpyHostToDevice);
      cudaMemcpy(tables.get(), ids.data(), num_blocks * 4, cudaMemcpyHostToDevice);
      for (const ringserve::cuda::MlaDecodeKernel planned : kernels) {
        const ringserve::cuda::MlaDecodeKernel kernel =
            ringserve::cuda::MlaDecodeKernelFor(planned, heads);
        const ringserve::cuda::MlaSplitPlan plan =
            ringserve::cuda::PlanMlaDecodeSplits(n, heads, ctx, prop.multiProcessorCount, kernel);
        const int64_t ws_floats =
            ringserve::cuda::MlaDecodeWorkspaceFloats(n, heads, plan.num_splits);
        DeviceBuffer ws;
        if (ws_floats > 0 && !ws.Allocate(ws_floats * 4).ok()) return 1;
        const ringserve::cuda::MlaCacheLayer layer{
            .data = static_cast<ringserve::cuda::bf16*>(cache.get()),
            .block_stride = block_stride,
            .block_size = block_size};
        const ringserve::cuda::MlaDecodeBatch batch{
            .context_lens = static_cast<const int32_t*>(lens.get()),
            .block_tables = static_cast<const int32_t*>(tables.get()),
            .max_blocks = blocks_per_seq,
            .num_entries = n,
            .num_splits = plan.num_splits,
            .partition = plan.partition,
            .workspace = static_cast<float*>(ws.get()),
            .kernel = kernel};
        const auto launch = [&] {
          return ringserve::cuda::LaunchMlaDecode(
              heads, 0.1f, layer, static_cast<const ringserve::cuda::bf16*>(q.get()),
              static_cast<ringserve::cuda::bf16*>(out.get()), batch, nullptr);
        };
        const absl::Status first = launch();
        if (!first.ok() || cudaDeviceSynchronize() != cudaSuccess) {
          std::fprintf(stderr, "launch failed: %s\n", first.ToString().c_str());
          return 1;
        }
        const double ms = ringserve::cuda::TimeMs(launch, 3, iters);
        const double bytes = static_cast<double>(n) * ctx * row_bytes;
        const double tbps = bytes / (ms * 1e-3) / 1e12;
        const double flops = static_cast<double>(n) * ctx * heads * 2.0 *
                             (ringserve::cuda::kMlaRowDim + ringserve::cuda::kMlaLatentDim);
        std::printf("%8s %8d %8d %7d %9.1f %10.1f %9.2f %7.1f%% %7.1f%% %8.1f\n",
                    kernel == ringserve::cuda::MlaDecodeKernel::kWgmmaSm90 ? "wgmma" : "mma", n,
                    ctx, plan.num_splits, ms * 1e3, bytes / 1e6, tbps,
                    100 * tbps * 1e12 / datasheet, 100 * tbps / copy_tbps,
                    flops / (ms * 1e-3) / 1e12);
      }
    }
  }
  return 0;
}
