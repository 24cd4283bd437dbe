// Device-side pieces shared by the grouped expert kernels (moe_gemm.cu, moe_gemm_sm90.cu,
// moe_quant.cu). Not for host code.
#pragma once

#include <cuda_bf16.h>

#include <type_traits>

#include "kernels/cuda/moe.h"

namespace ringserve::cuda {

// The grouped GEMM CTA's tile: group g, rows [m0, end) of the gathered rows (tile blockIdx.x of
// the tile list, or of the one group without it). False: this CTA has no tile (past num_tiles,
// a group outside [group_begin, group_end), rows past the end).
struct MoeGemmTile {
  int group = 0;
  int m0 = 0;
  int end = 0;
};
__device__ __forceinline__ bool MoeGemmTileOf(const MoeGroupedLinear& a, const int32_t* tiles,
                                              const int32_t* num_tiles, int tile_rows,
                                              MoeGemmTile& t) {
  t.end = a.rows;
  if (tiles != nullptr) {
    if (static_cast<int>(blockIdx.x) >= *num_tiles) return false;
    t.group = tiles[2 * blockIdx.x];
    if (t.group < a.group_begin || (a.group_end >= 0 && t.group >= a.group_end)) return false;
    t.m0 = tiles[2 * blockIdx.x + 1];
    t.end = a.offsets[t.group + 1];
    return true;
  }
  t.m0 = blockIdx.x * tile_rows;
  return t.m0 < t.end;
}

// stage/model/cpu_moe.cc's activations, on the bf16-rounded gate and up values.
__device__ __forceinline__ float MoeActivate(const MoeActivationParams& p, float g, float u) {
  if (p.kind == MoeActivation::kClampedSwiglu) {
    g = fminf(g, p.limit);
    u = fminf(fmaxf(u, -p.limit), p.limit);
    const float glu = g * (1.0f / (1.0f + expf(-g * p.alpha)));
    return (u + 1.0f) * glu;
  }
  return g / (1.0f + expf(-g)) * u;
}

__device__ __forceinline__ float RoundBf16(float v) {
  return __bfloat162float(__float2bfloat16(v));
}

// The grouped GEMVs' group of block row blockIdx.y (through the active list when given) and its
// rows [begin, end). False when the block row has no group (past the active experts) or no rows.
__device__ __forceinline__ bool MoeGemvGroupRows(const MoeGroupedLinear& a, int* g, int* begin,
                                                 int* end) {
  *g = a.active != nullptr ? a.active[blockIdx.y] : blockIdx.y;
  if (*g < 0) return false;
  *begin = a.offsets != nullptr ? a.offsets[*g] : 0;
  *end = a.offsets != nullptr ? a.offsets[*g + 1] : a.rows;
  return *begin < *end;
}

// The grouped GEMV's output of (row, col) of group g from the warp sums s0 (and, gated, the up
// row's s1), biases added: act(bf16(gate), bf16(up)) as bf16 when kGated, else fp32 or bf16.
template <bool kGated>
__device__ __forceinline__ void StoreGroupedGemvOutput(const MoeGroupedLinear& a, int g, int row,
                                                       int col, float s0, float s1) {
  const int n = a.n;
  const int64_t at = static_cast<int64_t>(row) * n + col;
  if constexpr (kGated) {
    const bf16* b = a.bias != nullptr ? a.bias + static_cast<int64_t>(g) * 2 * n : nullptr;
    const float gate = RoundBf16(s0 + (b ? __bfloat162float(b[col]) : 0.0f));
    const float up = RoundBf16(s1 + (b ? __bfloat162float(b[n + col]) : 0.0f));
    static_cast<bf16*>(a.out)[at] = __float2bfloat16(MoeActivate(a.act, gate, up));
  } else {
    const float v =
        s0 +
        (a.bias != nullptr ? __bfloat162float(a.bias[static_cast<int64_t>(g) * n + col]) : 0.0f);
    if (a.out_f32) {
      static_cast<float*>(a.out)[at] = v;
    } else {
      static_cast<bf16*>(a.out)[at] = __float2bfloat16(v);
    }
  }
}

// Calls fn(std::integral_constant<int, R>{}) with R = `rows` (1, 2 or 4; anything else 8): the
// grouped GEMVs' launchers turn MoeGemvRowChunk's answer into their kernels' template argument.
template <typename Fn>
void WithRowChunk(int rows, Fn&& fn) {
  switch (rows) {
    case 1:
      fn(std::integral_constant<int, 1>{});
      break;
    case 2:
      fn(std::integral_constant<int, 2>{});
      break;
    case 4:
      fn(std::integral_constant<int, 4>{});
      break;
    default:
      fn(std::integral_constant<int, 8>{});
  }
}

}  // namespace ringserve::cuda
