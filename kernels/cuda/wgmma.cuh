// Hopper warpgroup MMA (wgmma) helpers for the sm_90a kernels (prefill_attention_sm90.cu,
// mla_decode_sm90.cu): shared-memory matrix descriptors for the 128-byte swizzle, the fences and
// waits, and the m64nNk16 bf16 instructions with fp32 accumulators. Include only from files
// compiled for sm_90a (wgmma exists in no other code).
//
// Tiles in shared memory are stored as 64-column "halves" of R rows x 128 bytes (64 bf16 a row)
// in the 128-byte swizzle wgmma expects: 16-byte chunk c of row r at half (c / 8), byte
// r * 128 + ((c % 8 ^ (r & 7)) << 4) of it, every half 1024-byte aligned. A K-major operand
// (rows = M or N, K contiguous) steps through K 16 values (32 bytes) at a time within a half, then
// to the next half; an MN-major operand (rows = K) steps 16 rows (2,048 bytes) at a time.
#pragma once

#include <cstdint>

namespace ringserve::cuda {

// Byte offset of 16-byte chunk `chunk` (0..8 x halves - 1) of row `row` in a swizzled tile whose
// 64-column halves are `half_bytes` apart.
__device__ __forceinline__ uint32_t ChunkOffset(int row, int chunk, int half_bytes) {
  return (chunk >> 3) * half_bytes + row * 128 + (((chunk & 7) ^ (row & 7)) << 4);
}

// wgmma shared-memory matrix descriptor, 128-byte swizzle. K-major operands: `stride` = bytes
// between 8-row groups (1024), `leading` unused. MN-major: `leading` = bytes between 64-column
// halves, `stride` = bytes between 8-row groups.
__device__ __forceinline__ uint64_t Descriptor(uint32_t smem_addr, uint32_t leading,
                                               uint32_t stride) {
  return static_cast<uint64_t>((smem_addr & 0x3FFFF) >> 4) |
         (static_cast<uint64_t>(leading >> 4) << 16) | (static_cast<uint64_t>(stride >> 4) << 32) |
         (uint64_t{1} << 62);
}

__device__ __forceinline__ void WgmmaFence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
// Closes the group of wgmma issued since the last commit.
__device__ __forceinline__ void WgmmaCommit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
// Waits until at most N committed groups are still running (N = 0: all done).
template <int N>
__device__ __forceinline__ void WgmmaWait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ void WgmmaCommitAndWait() {
  WgmmaCommit();
  WgmmaWait<0>();
}
// Keeps the compiler from moving accesses of the accumulators across a wgmma wait or fence.
template <int N = 64>
__device__ __forceinline__ void FenceRegisters(float* r) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
// Makes this thread's completed shared-memory writes (cp.async) visible to wgmma's reads.
__device__ __forceinline__ void FenceProxyAsync() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// The 64 fp32 accumulators of an m64n128 wgmma: operands %0..%63 and their "+f" bindings.
#define RS_WGMMA_D64_REGS                                                            \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "           \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define RS_WGMMA_D64(d)                                                                           \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
      "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),    \
      "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),  \
      "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),  \
      "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),  \
      "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]),  \
      "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]),  \
      "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),  \
      "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])

// D (64 x 128 fp32; this thread's 64 values) = A (64 x 16, smem, K-major) * B (16 x 128, smem,
// K-major: one key per row) + (scale_d ? D : 0).
__device__ __forceinline__ void WgmmaSS(float* d, uint64_t desc_a, uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {" RS_WGMMA_D64_REGS
      "}, %64, %65, p, 1, 1, 0, 0;\n}\n"
      : RS_WGMMA_D64(d)
      : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}

// The 32 accumulators of an m64n64 wgmma.
#define RS_WGMMA_D32_REGS                                                  \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define RS_WGMMA_D32(d)                                                                           \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
      "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),    \
      "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),  \
      "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),  \
      "+f"(d[29]), "+f"(d[30]), "+f"(d[31])

// D (64 x BK fp32) = A (64 x 16, smem, K-major) * B (16 x BK, smem, K-major) + (scale_d ? D : 0).
template <int BK>
__device__ __forceinline__ void WgmmaScores(float* d, uint64_t desc_a, uint64_t desc_b,
                                            int scale_d) {
  if constexpr (BK == 128) {
    WgmmaSS(d, desc_a, desc_b, scale_d);
  } else {
    static_assert(BK == 64);
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {" RS_WGMMA_D32_REGS
        "}, %32, %33, p, 1, 1, 0, 0;\n}\n"
        : RS_WGMMA_D32(d)
        : "l"(desc_a), "l"(desc_b), "r"(scale_d));
  }
}

// D (64 x 128) += A (64 x 16 bf16 in registers, per warp the mma.sync m16n8k16 A-fragment
// layout) * B (16 x 128, smem, MN-major: one key per row of head dims).
__device__ __forceinline__ void WgmmaRS(float* d, const uint32_t* a, uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {" RS_WGMMA_D64_REGS
      "}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
      : RS_WGMMA_D64(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1));
}

// 2^x on the special-function unit (ex2.approx; ftz: results below the normal range are 0).
__device__ __forceinline__ float Exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// The 16 accumulators of an m64n32 wgmma.
#define RS_WGMMA_D16_REGS "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
#define RS_WGMMA_D16(d)                                                                           \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
      "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),    \
      "+f"(d[15])

// D (64 x 32 fp32; this thread's 16 values) = A (64 x 16, smem, K-major) * B (16 x 32, smem,
// K-major) + (scale_d ? D : 0).
__device__ __forceinline__ void WgmmaM64N32SS(float* d, uint64_t desc_a, uint64_t desc_b,
                                              int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {" RS_WGMMA_D16_REGS
      "}, %16, %17, p, 1, 1, 0, 0;\n}\n"
      : RS_WGMMA_D16(d)
      : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}

// D (64 x 128) += A (64 x 16, smem, K-major) * B (16 x 128, smem, MN-major: row k holds the
// 128 columns of B's row k, in two halves `leading` bytes apart).
__device__ __forceinline__ void WgmmaM64N128SSTransB(float* d, uint64_t desc_a, uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {" RS_WGMMA_D64_REGS
      "}, %64, %65, p, 1, 1, 0, 1;\n}\n"
      : RS_WGMMA_D64(d)
      : "l"(desc_a), "l"(desc_b), "r"(1));
}

}  // namespace ringserve::cuda
