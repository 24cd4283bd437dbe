// The skinny tensor-core GEMM (skinny_gemm.h).
//
// Work list: row block rb's stage s (k values [64 s, 64 s + 64)) is item rb * S + s, S the
// stages of a row block; block b takes items [b C, b C + C). A block's run is cut into segments
// at row block ends: a segment that is a whole row block stores y itself; any other leaves its
// fp32 partial sums in the workspace (slot 2 b for the block's first segment, 2 b + 1 for its
// last) and the last of the row block's blocks to arrive adds them all, in block order.
//
// The block streams its 128 weight rows and the 8 NT token rows of x through a ring of kStages
// shared-memory stages of 64 k values with cp.async: each warp copies its own 32 rows (4 rows x
// 128 bytes per instruction, whole cache lines), the block the x rows; kStages - 1 stages are in
// flight and no registers wait on them. Stages follow the work list, so the ring runs on across
// row block ends. Rows are stored with their 16-byte units XOR-swizzled by row % 8, so the
// copies in and the fragment reads out are free of bank conflicts.
//
// Fragment layout (mma.sync m16n8k16, lane = 4 g + q): A holds rows g and g + 8 at k columns
// {2q, 2q + 1} (registers 0, 1) and {2q + 8, 2q + 9} (2, 3); B holds column g at the same k rows.
// Lane (g, q) reads the 8 consecutive k values [32 h + 8 q, 32 h + 8 q + 8) of its rows and of
// its tokens for each half h of a stage; words 0, 1 feed the first k16 step and words 2, 3 the
// second. Within each step A's k column 2q (+1) and B's k row 2q (+1) then name the same physical
// k, as do 2q + 8 (+9): the products summed are exactly those of the plain dot product.
#include <atomic>
#include <cstdint>

#include "common/status_macros.h"
#include "kernels/cuda/dependent_launch.cuh"
#include "kernels/cuda/mma_sync.cuh"
#include "kernels/cuda/skinny_gemm.h"

namespace ringserve::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kWarpRows = kSkinnyRowsPerBlock / kWarps;  // 32: two m16 tiles
constexpr int kStageK = kSkinnyStageK;                   // 128 bytes a row
constexpr int kStages = 3;  // 2 stages in flight; 3 blocks a multiprocessor up to NT = 8
constexpr int kRowBytes = kStageK * 2;

// A stage: the block's weight rows, then the x rows.
__host__ __device__ constexpr int StageBytes(int nt) {
  return (kSkinnyRowsPerBlock + 8 * nt) * kRowBytes;
}
__host__ __device__ constexpr int SmemBytes(int nt) { return kStages * StageBytes(nt); }

struct SkinnyArgs {
  const bf16* x;
  const bf16* w;
  void* y;
  float* partials;
  uint32_t* counters;
  int m, n, k;
  int stages;     // S: stages of one row block
  int per_block;  // C: work items of one block
  int items;      // row blocks x S
};

// How the work list is shared out: C items a block, `grid` blocks.
struct WorkSplit {
  int stages, per_block, items, grid;
};
WorkSplit SplitWork(int n, int k, int blocks) {
  const int stages = (k + kStageK - 1) / kStageK;
  const int items = (n + kSkinnyRowsPerBlock - 1) / kSkinnyRowsPerBlock * stages;
  blocks = blocks < items ? blocks : items;  // at least one item a block
  const int per_block = (items + blocks - 1) / blocks;
  return {stages, per_block, items, (items + per_block - 1) / per_block};
}

template <typename OutT>
__device__ __forceinline__ void Store(OutT* y, float v) {
  if constexpr (sizeof(OutT) == 4) {
    *y = v;
  } else {
    *y = __float2bfloat16(v);
  }
}

// CpAsync16 to a shared-window address (no conversion per copy).
__device__ __forceinline__ void CpAsync16Shared(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(valid ? 16 : 0));
}

// The last block to arrive at a shared row block: y[:, row block] = sum of the partials of the
// row block's blocks first..last, in that order. Each thread owns 2 NT float4 of the tile and
// loads up to 8 of them from one sharer at once (one L2 round trip per sharer and 8 float4, not
// per float4; more would cost the NT = 8 kernel registers and its third block an SM).
template <int NT, typename OutT>
__device__ void AddPartials(const SkinnyArgs& a, int rb) {
  constexpr int kThreads = kWarps * 32;
  constexpr int kVecs = 8 * NT * kSkinnyRowsPerBlock / 4 / kThreads;  // float4 a thread
  constexpr int kChunk = kVecs < 8 ? kVecs : 8;
  const int first = rb * a.stages / a.per_block;
  const int last = (rb * a.stages + a.stages - 1) / a.per_block;
  const int tile = a.m * kSkinnyRowsPerBlock;
#pragma unroll 1
  for (int c = 0; c < kVecs; c += kChunk) {
    float4 sum[kChunk];
#pragma unroll
    for (int j = 0; j < kChunk; ++j) sum[j] = make_float4(0, 0, 0, 0);
    for (int b = first; b <= last; ++b) {
      const int slot = 2 * b + (b * a.per_block < rb * a.stages ? 1 : 0);
      const float* part = a.partials + static_cast<int64_t>(slot) * tile;
#pragma unroll
      for (int j = 0; j < kChunk; ++j) {
        const int e = 4 * (threadIdx.x + (c + j) * kThreads);
        if (e < tile) {
          const float4 v = __ldcg(reinterpret_cast<const float4*>(part + e));
          sum[j].x += v.x;
          sum[j].y += v.y;
          sum[j].z += v.z;
          sum[j].w += v.w;
        }
      }
    }
#pragma unroll
    for (int j = 0; j < kChunk; ++j) {
      const int e = 4 * (threadIdx.x + (c + j) * kThreads);
      if (e >= tile) continue;
      const int token = e / kSkinnyRowsPerBlock;
      const int row = rb * kSkinnyRowsPerBlock + e % kSkinnyRowsPerBlock;
      OutT* out = static_cast<OutT*>(a.y) + int64_t{token} * a.n + row;
      const float v[4] = {sum[j].x, sum[j].y, sum[j].z, sum[j].w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        if (row + i < a.n) Store(out + i, v[i]);
      }
    }
  }
}

// NT: 8-token tiles held (m <= 8 NT).
template <int NT, typename OutT>
__global__ void __launch_bounds__(kWarps * 32) SkinnyGemmKernel(SkinnyArgs a) {
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ bool last_arrival;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, q = lane & 3;
  const int m = a.m, n = a.n, k = a.k, S = a.stages;
  const int u0 = blockIdx.x * a.per_block, u1 = min(a.items, u0 + a.per_block);

  // The copy plan, fixed across stages (only the row block and k move): lane l copies unit
  // l % 8 of the warp's rows 4i + l / 8 (i < 8; 4 rows x 128 bytes per instruction) and, spread
  // over the block, x rows tid / 8 + 16 v (v < NT / 2, at least 1) unit tid % 8. Rows past n or m
  // copy zeros.
  const int copy_row = lane >> 3, copy_unit = lane & 7;
  // Rows 4i + copy_row are copy_row + 4 (i % 2) modulo 8: two swizzled unit offsets.
  const int w_dst = warp * kWarpRows * kRowBytes + copy_row * kRowBytes;
  const int w_unit[2] = {(copy_unit ^ copy_row) << 4, (copy_unit ^ (copy_row + 4)) << 4};
  constexpr int kXCopies = NT >= 2 ? NT / 2 : 1;
  const int x_row = threadIdx.x >> 3, x_unit = threadIdx.x & 7;
  const bf16* x_src = a.x + static_cast<int64_t>(x_row) * k + x_unit * 8;
  const int x_dst = kSkinnyRowsPerBlock * kRowBytes + x_row * kRowBytes +
                    ((x_unit ^ (x_row & 7)) << 4);  // rows x_row + 16 v: the same modulo 8
  const uint32_t ring = SmemAddr(smem);

  // Work item v's weights / x into ring slot `slot`; past u1 nothing.
  const auto copy_weights = [&](int v, int slot) {
    if (v >= u1) return;
    const int rb = v / S;
    const int kk = (v - rb * S) * kStageK + copy_unit * 8;
    const int row0 = rb * kSkinnyRowsPerBlock + warp * kWarpRows + copy_row;
    const bf16* src = a.w + static_cast<int64_t>(row0) * k + kk;
    const uint32_t dst = ring + slot * StageBytes(NT) + w_dst;
#pragma unroll
    for (int i = 0; i < kWarpRows / 4; ++i) {
      const bool ok = kk < k && row0 + 4 * i < n;
      CpAsync16Shared(dst + 4 * i * kRowBytes + w_unit[i & 1],
                      ok ? src + static_cast<int64_t>(4 * i) * k : a.w, ok);
    }
  };
  const auto copy_x = [&](int v, int slot) {
    if (v >= u1) return;
    const int kk = v % S * kStageK;
    const bool k_ok = kk + x_unit * 8 < k;
    const uint32_t dst = ring + slot * StageBytes(NT) + x_dst;
#pragma unroll
    for (int i = 0; i < kXCopies; ++i) {
      if (x_row + 16 * i >= 8 * NT) break;  // NT = 1: threads 64.. copy nothing
      const bool ok = k_ok && x_row + 16 * i < m;
      CpAsync16Shared(dst + 16 * i * kRowBytes,
                      ok ? x_src + static_cast<int64_t>(16 * i) * k + kk : a.x, ok);
    }
  };
  // The weights of the first stages go before the wait (no kernel of the step writes them), x
  // after it. Group 0 then holds those weights and item u0's x; every later group one item.
#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) copy_weights(u0 + i, i);
  WaitForPreviousKernel();
#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) {
    copy_x(u0 + i, i);
    CpAsyncCommit();  // empty groups past u1 keep the wait counts uniform
  }

  float acc[2][NT][4];
  // acc[mt][t][i]: token 8t + 2q (+ 1 for odd i) of the row block's row 32 warp + 16 mt + g
  // (+ 8 for i >= 2).
  const auto for_each_acc = [&](auto&& f) {
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
      for (int t = 0; t < NT; ++t) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          f(t * 8 + 2 * q + (i & 1), warp * kWarpRows + 16 * mt + g + (i >= 2 ? 8 : 0),
            acc[mt][t][i]);
        }
      }
    }
  };
  for_each_acc([](int, int, float& v) { v = 0.0f; });

  // The segment [start, end) of row block rb ended: store it, or leave it for the last arrival.
  const auto finish_segment = [&](int rb, int start, int end) {
    const int row_base = rb * kSkinnyRowsPerBlock;
    if (start == rb * S && end == rb * S + S) {
      for_each_acc([&](int token, int r, float& v) {
        if (token < m && row_base + r < n) {
          Store(static_cast<OutT*>(a.y) + int64_t{token} * n + row_base + r, v);
        }
      });
      return;
    }
    const int64_t tile = int64_t{m} * kSkinnyRowsPerBlock;
    float* mine = a.partials + (2 * blockIdx.x + (start > u0 ? 1 : 0)) * tile;
    for_each_acc([&](int token, int r, float& v) {
      if (token < m) mine[token * kSkinnyRowsPerBlock + r] = v;
    });
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
      const int sharers =
          (rb * S + S - 1) / a.per_block - rb * S / a.per_block + 1;  // blocks on rb
      last_arrival = atomicAdd(&a.counters[rb], 1u) == static_cast<uint32_t>(sharers - 1);
      if (last_arrival) a.counters[rb] = 0;  // every sharer has counted: ready for the next launch
    }
    __syncthreads();
    if (last_arrival) {
      __threadfence();
      AddPartials<NT, OutT>(a, rb);
    }
  };

  int read_slot = 0, write_slot = kStages - 1;
  int rb = u0 / S, segment_start = u0;
  for (int u = u0; u < u1; ++u) {
    CpAsyncWait<kStages - 2>();
    __syncthreads();  // item u landed for every thread; every warp is done with item u - 1
    copy_weights(u + kStages - 1, write_slot);
    copy_x(u + kStages - 1, write_slot);
    CpAsyncCommit();
    write_slot = write_slot == kStages - 1 ? 0 : write_slot + 1;
    const unsigned char* slot = smem + read_slot * StageBytes(NT);
    read_slot = read_slot == kStages - 1 ? 0 : read_slot + 1;
    const unsigned char* w_stage = slot + warp * kWarpRows * kRowBytes;
    const unsigned char* x_stage = slot + kSkinnyRowsPerBlock * kRowBytes;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int j = ((4 * h + q) ^ g) << 4;  // rows 16 mt + g (+ 8), 8 t + g: all g modulo 8
      uint4 xv[NT];
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        xv[t] = *reinterpret_cast<const uint4*>(x_stage + (8 * t + g) * kRowBytes + j);
      }
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        const uint4 wa = *reinterpret_cast<const uint4*>(w_stage + (16 * mt + g) * kRowBytes + j);
        const uint4 wb =
            *reinterpret_cast<const uint4*>(w_stage + (16 * mt + g + 8) * kRowBytes + j);
        const uint32_t a0[4] = {wa.x, wb.x, wa.y, wb.y};
        const uint32_t a1[4] = {wa.z, wb.z, wa.w, wb.w};
#pragma unroll
        for (int t = 0; t < NT; ++t) {
          Mma(acc[mt][t], a0, xv[t].x, xv[t].y);
          Mma(acc[mt][t], a1, xv[t].z, xv[t].w);
        }
      }
    }
    if (u + 1 == (rb + 1) * S || u + 1 == u1) {
      finish_segment(rb, segment_start, u + 1);
      for_each_acc([](int, int, float& v) { v = 0.0f; });
      ++rb;
      segment_start = u + 1;
    }
  }
  CpAsyncWait<0>();  // no copy outlives the block (the empty groups)
}

// Over 48 KB of dynamic shared memory needs the opt-in, once per kernel and device (before any
// graph capture: Tune launches every variant first).
template <int NT, typename OutT>
void LaunchTiles(const SkinnyArgs& a, int grid, int device, LaunchStream stream) {
  static std::atomic<uint64_t> opted_in{0};
  const uint64_t bit = uint64_t{1} << (device & 63);
  if ((opted_in.load() & bit) == 0) {
    cudaFuncSetAttribute(SkinnyGemmKernel<NT, OutT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         SmemBytes(NT));
    opted_in.fetch_or(bit);
  }
  LaunchDependent(SkinnyGemmKernel<NT, OutT>, dim3(grid), dim3(kWarps * 32), SmemBytes(NT), stream,
                  a);
}

template <typename OutT>
void Launch(const SkinnyArgs& a, int grid, int device, LaunchStream stream) {
  if (a.m <= 8) {
    LaunchTiles<1, OutT>(a, grid, device, stream);
  } else if (a.m <= 16) {
    LaunchTiles<2, OutT>(a, grid, device, stream);
  } else if (a.m <= 32) {
    LaunchTiles<4, OutT>(a, grid, device, stream);
  } else {
    LaunchTiles<8, OutT>(a, grid, device, stream);
  }
}

}  // namespace

absl::Status AllocateSkinnyWorkspace(size_t bytes, DeviceBuffer* buffer, SkinnyWorkspace* ws) {
  constexpr int64_t kCounters = 8192;  // row blocks: n up to 1 M
  const int64_t counter_bytes = kCounters * sizeof(uint32_t);
  if (bytes <= static_cast<size_t>(counter_bytes)) {
    return absl::InvalidArgumentError("skinny GEMM workspace: too small");
  }
  RS_RETURN_IF_ERROR(buffer->Allocate(bytes));
  RS_CUDA_RETURN_IF_ERROR(cudaMemset(buffer->get(), 0, bytes));
  ws->counters = buffer->as<uint32_t>();
  ws->num_counters = kCounters;
  ws->partials = reinterpret_cast<float*>(buffer->as<unsigned char>() + counter_bytes);
  ws->partial_floats = static_cast<int64_t>((bytes - counter_bytes) / sizeof(float));
  return absl::OkStatus();
}

int64_t SkinnyPartialFloats(int m, int n, int k, int blocks) {
  if (m < 1 || n < 1 || k < 1 || blocks < 1) return 0;
  return int64_t{2} * SplitWork(n, k, blocks).grid * m * kSkinnyRowsPerBlock;
}

absl::Status LaunchSkinnyGemm(const bf16* x, const bf16* w, void* y, OutType out, int m, int n,
                              int k, int blocks, const SkinnyWorkspace& ws, LaunchStream stream) {
  if (m < 1 || m > kSkinnyMaxRows || n < 1 || k < 8 || k % 8 != 0 || blocks < 1) {
    return absl::InvalidArgumentError(
        "skinny GEMM: need 1 <= m <= 64, n >= 1, k a multiple of 8, blocks >= 1");
  }
  if (ws.counters == nullptr || ws.partials == nullptr ||
      ws.num_counters < (n + kSkinnyRowsPerBlock - 1) / kSkinnyRowsPerBlock ||
      ws.partial_floats < SkinnyPartialFloats(m, n, k, blocks)) {
    return absl::InvalidArgumentError("skinny GEMM: workspace too small for this shape and grid");
  }
  int device = 0;
  RS_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  const WorkSplit split = SplitWork(n, k, blocks);
  const SkinnyArgs a{.x = x,
                     .w = w,
                     .y = y,
                     .partials = ws.partials,
                     .counters = ws.counters,
                     .m = m,
                     .n = n,
                     .k = k,
                     .stages = split.stages,
                     .per_block = split.per_block,
                     .items = split.items};
  if (out == OutType::kF32) {
    Launch<float>(a, split.grid, device, stream);
  } else {
    Launch<bf16>(a, split.grid, device, stream);
  }
  return LaunchStatus("SkinnyGemmKernel");
}

}  // namespace ringserve::cuda
