// See mla_prepare.h. Decode-sized kernels on CUDA cores: each CTA reads one head's slice of
// kv_b_proj once per tile of kTokenTile tokens.
#include "common/status_macros.h"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/cuda/mla_prepare.h"

namespace ringserve::cuda {
namespace {

constexpr float kLatentNormEps = 1e-6f;
constexpr int kTokenTile = 8;
constexpr int kHalfRope = kMlaRopeDim / 2;

// Rotates the rope vector x[kMlaRopeDim] (fp32, shared memory) of a token at `position`; threads
// [0, kHalfRope) each own one pair and write the bf16 results to out.
__device__ __forceinline__ void RotatePair(const float* x, const MlaRope& rope, int position, int i,
                                           bf16* out) {
  const int a = rope.interleave ? 2 * i : i;
  const int b = rope.interleave ? 2 * i + 1 : i + kHalfRope;
  float sn, cs;
  sincosf(static_cast<float>(position) * rope.inv_freq[i], &sn, &cs);
  cs *= rope.factor;
  sn *= rope.factor;
  out[a] = __float2bfloat16(x[a] * cs - x[b] * sn);
  out[b] = __float2bfloat16(x[b] * cs + x[a] * sn);
}

// One CTA (128 threads) per token.
__global__ void __launch_bounds__(128) StoreLatentKernel(MlaStoreLatentArgs a) {
  __shared__ float k_pe[kMlaRopeDim];
  __shared__ float scratch[32];
  const int t = blockIdx.x;
  const int slot = a.slots[t];
  if (slot < 0) return;
  const bf16* src = a.kv_a + static_cast<int64_t>(t) * kMlaRowDim;
  float x[kMlaLatentDim / 128];
  float sq = 0.0f;
#pragma unroll
  for (int j = 0; j < kMlaLatentDim / 128; ++j) {
    const int c = threadIdx.x + 128 * j;
    x[j] = __bfloat162float(src[c]) +
           (a.kv_a_bias != nullptr ? __bfloat162float(a.kv_a_bias[c]) : 0.0f);
    sq += x[j] * x[j];
  }
  if (threadIdx.x < kMlaRopeDim) {
    const int c = kMlaLatentDim + threadIdx.x;
    k_pe[threadIdx.x] = __bfloat162float(src[c]) +
                        (a.kv_a_bias != nullptr ? __bfloat162float(a.kv_a_bias[c]) : 0.0f);
  }
  const float inv = rsqrtf(BlockSum(sq, scratch) / kMlaLatentDim + kLatentNormEps);
  const int block = slot / a.cache.block_size;
  bf16* row = a.cache.data + block * a.cache.block_stride +
              static_cast<int64_t>(slot - block * a.cache.block_size) * kMlaRowDim;
#pragma unroll
  for (int j = 0; j < kMlaLatentDim / 128; ++j) {
    const int c = threadIdx.x + 128 * j;
    row[c] = __float2bfloat16(x[j] * inv * __bfloat162float(a.norm[c]));
  }
  if (threadIdx.x < kHalfRope) {
    RotatePair(k_pe, a.rope, a.rope.positions[t], threadIdx.x, row + kMlaLatentDim);
  }
}

// Grid (head, token tile); 256 threads, thread c owns latent dims c and c + 256.
__global__ void __launch_bounds__(256) AbsorbQueryKernel(MlaAbsorbQueryArgs a) {
  __shared__ float q_nope[kTokenTile][256];
  __shared__ float q_pe[kTokenTile][kMlaRopeDim];
  const int h = blockIdx.x;
  const int t0 = blockIdx.y * kTokenTile;
  const int n = min(kTokenTile, a.num_tokens - t0);
  const int qk = a.nope + kMlaRopeDim;
  for (int i = threadIdx.x; i < kTokenTile * qk; i += blockDim.x) {
    const int t = i / qk, d = i - t * qk;
    const float v =
        t < n ? __bfloat162float(a.q[(static_cast<int64_t>(t0 + t) * a.num_heads + h) * qk + d])
              : 0.0f;
    if (d < a.nope) {
      q_nope[t][d] = v;
    } else {
      q_pe[t][d - a.nope] = v;
    }
  }
  __syncthreads();
  const bf16* w = a.kv_b + static_cast<int64_t>(h) * (a.nope + a.v) * kMlaLatentDim;
  float acc[kTokenTile][2] = {};
  for (int r = 0; r < a.nope; ++r) {
    const float w0 = __bfloat162float(w[r * kMlaLatentDim + threadIdx.x]);
    const float w1 = __bfloat162float(w[r * kMlaLatentDim + threadIdx.x + 256]);
#pragma unroll
    for (int t = 0; t < kTokenTile; ++t) {
      acc[t][0] += q_nope[t][r] * w0;
      acc[t][1] += q_nope[t][r] * w1;
    }
  }
  for (int t = 0; t < n; ++t) {
    bf16* out = a.q_out + (static_cast<int64_t>(t0 + t) * a.num_heads + h) * kMlaRowDim;
    out[threadIdx.x] = __float2bfloat16(acc[t][0]);
    out[threadIdx.x + 256] = __float2bfloat16(acc[t][1]);
    if (threadIdx.x < kHalfRope) {
      RotatePair(q_pe[t], a.rope, a.rope.positions[t0 + t], threadIdx.x, out + kMlaLatentDim);
    }
  }
}

// Grid (head, token tile); 256 threads = 8 warps, warp w computes value dims w, w + 8, ...;
// lane l reads latent dims [16 l, 16 l + 16) of each kv_b row.
__global__ void __launch_bounds__(256) UpProjectValueKernel(MlaUpProjectValueArgs a) {
  __shared__ float lat[kTokenTile][kMlaLatentDim];
  const int h = blockIdx.x;
  const int t0 = blockIdx.y * kTokenTile;
  const int n = min(kTokenTile, a.num_tokens - t0);
  for (int i = threadIdx.x; i < kTokenTile * kMlaLatentDim; i += blockDim.x) {
    const int t = i / kMlaLatentDim, c = i - t * kMlaLatentDim;
    lat[t][c] =
        t < n ? __bfloat162float(
                    a.latent_out[(static_cast<int64_t>(t0 + t) * a.num_heads + h) * kMlaLatentDim +
                                 c])
              : 0.0f;
  }
  __syncthreads();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const bf16* w = a.kv_b + (static_cast<int64_t>(h) * (a.nope + a.v) + a.nope) * kMlaLatentDim;
  for (int j = warp; j < a.v; j += 8) {
    float wf[16];
    const uint4* row = reinterpret_cast<const uint4*>(w + static_cast<int64_t>(j) * kMlaLatentDim);
    Unpack8(row[2 * lane], wf);
    Unpack8(row[2 * lane + 1], wf + 8);
#pragma unroll
    for (int t = 0; t < kTokenTile; ++t) {
      float s = 0.0f;
#pragma unroll
      for (int k = 0; k < 16; ++k) s += wf[k] * lat[t][16 * lane + k];
      s = WarpSum(s);
      if (lane == 0 && t < n) {
        a.out[(static_cast<int64_t>(t0 + t) * a.num_heads + h) * a.v + j] = __float2bfloat16(s);
      }
    }
  }
}

// One CTA (256 threads) per row.
__global__ void __launch_bounds__(256)
    RmsNormKernel(const bf16* x, const bf16* bias, const bf16* w, bf16* out, int dim) {
  __shared__ float scratch[32];
  const int64_t base = static_cast<int64_t>(blockIdx.x) * dim;
  float sq = 0.0f;
  for (int c = threadIdx.x; c < dim; c += blockDim.x) {
    const float v = __bfloat162float(x[base + c]) + (bias ? __bfloat162float(bias[c]) : 0.0f);
    sq += v * v;
  }
  const float inv = rsqrtf(BlockSum(sq, scratch) / dim + kLatentNormEps);
  for (int c = threadIdx.x; c < dim; c += blockDim.x) {
    const float v = __bfloat162float(x[base + c]) + (bias ? __bfloat162float(bias[c]) : 0.0f);
    out[base + c] = __float2bfloat16(v * inv * __bfloat162float(w[c]));
  }
}

}  // namespace

absl::Status LaunchMlaRmsNorm(const bf16* x, const bf16* bias, const bf16* w, bf16* out, int rows,
                              int dim, cudaStream_t stream) {
  if (rows == 0) return absl::OkStatus();
  if (dim < 1 || w == nullptr) return absl::InvalidArgumentError("LaunchMlaRmsNorm: bad shape");
  RmsNormKernel<<<rows, 256, 0, stream>>>(x, bias, w, out, dim);
  return LaunchStatus("RmsNormKernel");
}

absl::Status LaunchMlaStoreLatent(const MlaStoreLatentArgs& args, cudaStream_t stream) {
  if (args.num_tokens == 0) return absl::OkStatus();
  if (args.cache.block_size < 1 || args.norm == nullptr || args.rope.inv_freq == nullptr) {
    return absl::InvalidArgumentError(
        "LaunchMlaStoreLatent: needs a cache block size, the latent norm and inv_freq");
  }
  StoreLatentKernel<<<args.num_tokens, 128, 0, stream>>>(args);
  return LaunchStatus("StoreLatentKernel");
}

absl::Status LaunchMlaAbsorbQuery(const MlaAbsorbQueryArgs& args, cudaStream_t stream) {
  if (args.num_tokens == 0) return absl::OkStatus();
  if (args.nope < 8 || args.nope > 256 || args.nope % 8 != 0 || args.v < 1 || args.num_heads < 1 ||
      args.rope.inv_freq == nullptr) {
    return absl::InvalidArgumentError(
        "LaunchMlaAbsorbQuery: qk_nope_head_dim must be a multiple of 8 in [8, 256], v_head_dim "
        "and heads positive");
  }
  const dim3 grid(args.num_heads, (args.num_tokens + kTokenTile - 1) / kTokenTile);
  AbsorbQueryKernel<<<grid, 256, 0, stream>>>(args);
  return LaunchStatus("AbsorbQueryKernel");
}

absl::Status LaunchMlaUpProjectValue(const MlaUpProjectValueArgs& args, cudaStream_t stream) {
  if (args.num_tokens == 0) return absl::OkStatus();
  if (args.v < 1 || args.v > 256 || args.nope < 0 || args.num_heads < 1) {
    return absl::InvalidArgumentError(
        "LaunchMlaUpProjectValue: v_head_dim must be in [1, 256] and heads positive");
  }
  const dim3 grid(args.num_heads, (args.num_tokens + kTokenTile - 1) / kTokenTile);
  UpProjectValueKernel<<<grid, 256, 0, stream>>>(args);
  return LaunchStatus("UpProjectValueKernel");
}

}  // namespace ringserve::cuda
