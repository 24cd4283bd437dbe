// Internal to kernels/cuda: the Hopper (sm_90a) grouped expert GEMM behind LaunchMoeGroupedGemm
// (moe.h) for MoeGemmKernel::kWgmmaSm90. Compiled only for sm_90a (the sm90 object library), so
// callers must check the device's compute capability first.
#pragma once

#include "absl/status/status.h"
#include "kernels/cuda/moe.h"

namespace ringserve::cuda {

// Sets the kernel's dynamic shared memory limit on the current device (compute capability 9.0);
// PrepareMoeKernels calls it, before any launch or graph capture.
absl::Status PrepareMoeGroupedGemmSm90();

// The same contract and grid as the WMMA kernel: grid_tiles tile slots (the tile list's capacity,
// or ceil(rows / kMoeTileRows) without one) by ceil(n / 128) column blocks. The arguments are
// checked by LaunchMoeGroupedGemm.
absl::Status LaunchMoeGroupedGemmSm90(const MoeGroupedLinear& a, const int32_t* tiles,
                                      const int32_t* num_tiles, int grid_tiles,
                                      LaunchStream stream);

}  // namespace ringserve::cuda
