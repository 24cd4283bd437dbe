// Internal to kernels/cuda: the Hopper (sm_90a) MLA decode kernel behind LaunchMlaDecode
// (mla_decode.h) for MlaDecodeKernel::kWgmmaSm90. Compiled only for sm_90a (the sm90 object
// library), so callers must check the device's compute capability first.
//
// CTA = 2 warpgroups (256 threads) = kMlaHeadsSm90 heads of one entry and context split. Per
// tile of 64 keys (shared memory, cp.async, double-buffered): warpgroup w scores keys
// [32 w, 32 w + 32) for all 64 heads (wgmma m64n32k16 over the 576 dims, the query tile and the
// keys read from shared memory), the two exchange row maxima once, write the probabilities
// (bf16) to shared memory, and warpgroup w accumulates output dims [256 w, 256 w + 256)
// (P . V with V the tile's latents, wgmma m64n128k16 x 2). One CTA per SM: the query tile, two
// key tiles, P and the statistics take 226 KB.
#pragma once

#include "absl/status/status.h"
#include "kernels/cuda/mla_decode.h"

namespace ringserve::cuda {

struct MlaDecodeArgs {
  int num_heads;
  float scale;
  MlaCacheLayer cache;
  const bf16* q;
  bf16* out;
  MlaDecodeBatch batch;
};

// The split partials' layout in batch.workspace (both kernels write it, the merge reads it): for
// row = entry * num_heads + head and part = row * num_splits + split, the unnormalized output at
// workspace[part * kMlaLatentDim], then after all num_entries * num_heads * num_splits of them
// the pair (running maximum in log2 units, sum of exponentials) at [2 * part].
//
// Enqueues the decode kernel only (with splits the caller merges). The arguments are checked by
// LaunchMlaDecode.
absl::Status LaunchMlaDecodeSm90(const MlaDecodeArgs& args, cudaStream_t stream);

}  // namespace ringserve::cuda
