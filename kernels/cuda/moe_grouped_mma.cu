// The grouped expert GEMV on tensor cores (moe.h: LaunchMoeGroupedMma).
//
// Fragments (PTX mma.m16n8k16, lane = 4 g + t): A registers {a0a1, a2a3, a4a5, a6a7} hold rows
// g, g + 8, g, g + 8 at k slots {2t, 2t+1} and {2t+8, 2t+9}; B registers {b0b1, b2b3} hold
// column g at the same slots; C holds rows g, g + 8 at columns 2t, 2t + 1. The MMA sums over k,
// so any one-to-one map of k slots to matrix columns gives the product if A and B share it. Here
// lane t of each quad owns the columns [32 b + 8 t, 32 b + 8 t + 8) of each 32-column block b
// and loads them as one 16-byte vector of each of its weight rows (g and g + 8 of the warp's 16)
// and of its group row (g of each 8-row tile): step 0 of the block takes the vectors' words 0
// and 1 as slots {2t, 2t+1} and {2t+8, 2t+9}, step 1 words 2 and 3. No shared memory, no
// conversion instruction: the weights go from the load to the MMA.
#include "common/status_macros.h"
#include "kernels/cuda/dependent_launch.cuh"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/cuda/mma_sync.cuh"
#include "kernels/cuda/moe.h"
#include "kernels/cuda/moe_device.cuh"

namespace ringserve::cuda {
namespace {

constexpr int kMmaWarps = 4;                      // warps of a block
constexpr int kMmaCols = 16;                      // output columns of a warp
constexpr int kBlockCols = kMmaWarps * kMmaCols;  // output columns of a block
constexpr int kKBlock = 32;                       // k columns of one load of a lane quad
constexpr int kInFlight = 4;                      // k blocks of weights in flight per lane

// Block (column block, group): warp w computes output columns [16 w, 16 w + 16) of the block
// (with an activation, their gate and up rows) for the group's rows, NT tiles of 8 rows per pass
// over the weights (tiles past the group's rows are skipped, warp-uniformly).
template <bool kGated, int NT>
__global__ void __launch_bounds__(kMmaWarps * 32) GroupedMmaKernel(MoeGroupedLinear a) {
  WaitForPreviousKernel();
  int g, begin, end;
  if (!MoeGemvGroupRows(a, &g, &begin, &end)) return;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int quad_row = lane >> 2, t = lane & 3;
  const int col0 = blockIdx.x * kBlockCols + warp * kMmaCols;
  if (col0 >= a.n) return;
  constexpr int P = kGated ? 2 : 1;
  const int n = a.n, k = a.k, blocks = k / kKBlock;
  const bf16* wg = a.w + static_cast<int64_t>(g) * P * n * k;
  // The lane's weight rows: part p (gate, up), half h (row quad_row + 8 h); past n, the last row
  // (read, never stored).
  const bf16* wrow[P][2];
#pragma unroll
  for (int p = 0; p < P; ++p) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      wrow[p][h] =
          wg + (static_cast<int64_t>(p) * n + min(col0 + quad_row + 8 * h, n - 1)) * k + 8 * t;
    }
  }
  for (int r0 = begin; r0 < end; r0 += 8 * NT) {
    const bf16* xrow[NT];  // the lane's group row in each tile, null past the group's rows
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const int r = r0 + 8 * nt + quad_row;
      const int src = r < end ? (a.row_token != nullptr ? a.row_token[r] : r) : -1;
      xrow[nt] = src >= 0 ? a.x + static_cast<int64_t>(src) * k + 8 * t : nullptr;
    }
    float acc[P][NT][4];
#pragma unroll
    for (int p = 0; p < P; ++p) {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
        acc[p][nt][0] = acc[p][nt][1] = acc[p][nt][2] = acc[p][nt][3] = 0;
    }
    uint4 ring[kInFlight][P][2];
    const auto load = [&](uint4(&w)[P][2], int b) {
#pragma unroll
      for (int p = 0; p < P; ++p) {
#pragma unroll
        for (int h = 0; h < 2; ++h) w[p][h] = LoadStreaming(wrow[p][h] + b * kKBlock);
      }
    };
#pragma unroll
    for (int i = 0; i < kInFlight; ++i) {
      if (i < blocks) load(ring[i], i);
    }
    for (int b0 = 0; b0 < blocks; b0 += kInFlight) {
#pragma unroll
      for (int i = 0; i < kInFlight; ++i) {
        const int b = b0 + i;
        if (b >= blocks) break;
        uint4 cur[P][2];
#pragma unroll
        for (int p = 0; p < P; ++p) cur[p][0] = ring[i][p][0], cur[p][1] = ring[i][p][1];
        if (b + kInFlight < blocks) load(ring[i], b + kInFlight);
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          if (r0 + 8 * nt >= end) break;  // the same for every lane
          const uint4 xv = xrow[nt] != nullptr
                               ? __ldg(reinterpret_cast<const uint4*>(xrow[nt] + b * kKBlock))
                               : make_uint4(0, 0, 0, 0);
#pragma unroll
          for (int p = 0; p < P; ++p) {
            const uint32_t s0[4] = {cur[p][0].x, cur[p][1].x, cur[p][0].y, cur[p][1].y};
            Mma(acc[p][nt], s0, xv.x, xv.y);
            const uint32_t s1[4] = {cur[p][0].z, cur[p][1].z, cur[p][0].w, cur[p][1].w};
            Mma(acc[p][nt], s1, xv.z, xv.w);
          }
        }
      }
    }
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int col = col0 + quad_row + (j >= 2 ? 8 : 0);
        const int r = r0 + 8 * nt + 2 * t + (j & 1);
        if (col < n && r < end) {
          StoreGroupedGemvOutput<kGated>(a, g, r, col, acc[0][nt][j], acc[P - 1][nt][j]);
        }
      }
    }
  }
}

template <int NT>
void LaunchMma(const MoeGroupedLinear& a, dim3 grid, bool gated, LaunchStream stream) {
  if (gated) {
    LaunchDependent(GroupedMmaKernel<true, NT>, grid, kMmaWarps * 32, 0, stream, a);
  } else {
    LaunchDependent(GroupedMmaKernel<false, NT>, grid, kMmaWarps * 32, 0, stream, a);
  }
}

}  // namespace

bool MoeGroupedMmaSupported(const MoeGroupedLinear& a) {
  return a.k > 0 && a.k % kKBlock == 0 && a.w != nullptr &&
         reinterpret_cast<uintptr_t>(a.w) % 16 == 0 && reinterpret_cast<uintptr_t>(a.x) % 16 == 0;
}

absl::Status LaunchMoeGroupedMma(const MoeGroupedLinear& a, LaunchStream stream) {
  if (a.n <= 0 || a.groups < 1 || (a.offsets == nullptr && a.groups != 1) || a.rows < 0 ||
      (a.act.kind != MoeActivation::kNone && a.out_f32) ||
      (a.active != nullptr && a.offsets == nullptr) || !MoeGroupedMmaSupported(a)) {
    return absl::InvalidArgumentError(
        "LaunchMoeGroupedMma: bad arguments (k % 32 == 0, 16-byte aligned x and w)");
  }
  if (a.offsets == nullptr && a.rows == 0) return absl::OkStatus();
  const int group_rows =
      a.active != nullptr && a.max_active > 0 ? std::min(a.groups, a.max_active) : a.groups;
  const dim3 grid((a.n + kBlockCols - 1) / kBlockCols, group_rows);
  const bool gated = a.act.kind != MoeActivation::kNone;
  // Tiles of 8 rows per pass over the weights: as many as a group can hold, up to 4.
  const int most = a.max_group_rows > 0 ? a.max_group_rows : 32;
  if (most <= 8) {
    LaunchMma<1>(a, grid, gated, stream);
  } else if (most <= 16) {
    LaunchMma<2>(a, grid, gated, stream);
  } else {
    LaunchMma<4>(a, grid, gated, stream);
  }
  return LaunchStatus("GroupedMmaKernel");
}

}  // namespace ringserve::cuda
