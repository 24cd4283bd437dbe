// Warp-level tensor-core helpers (sm_80+): ldmatrix loads of 8x8 bf16 matrices from shared
// memory and the mma.sync m16n8k16 bf16 MMA with fp32 accumulation, in PTX's fragment layouts
// (lane = 4 g + t4: A rows g and g + 8, B column g, C rows g and g + 8, columns 2 t4 and 2 t4 + 1).
#pragma once

#include <cstdint>

#include "kernels/cuda/device_utils.cuh"

namespace ringserve::cuda {

__device__ __forceinline__ void LdMatrixX4(uint32_t* r, const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SmemAddr(p)));
}
__device__ __forceinline__ void LdMatrixX4Trans(uint32_t* r, const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SmemAddr(p)));
}

// C (16 x 8) += A (16 x 16) * B (16 x 8).
__device__ __forceinline__ void Mma(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

}  // namespace ringserve::cuda
