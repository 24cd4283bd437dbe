// Attention over the paged KV cache (layout: rope.h's KvCacheLayer), causal, grouped-query.
// The cache must already hold the K/V of the tokens being attended (LaunchQkvPrepare stores
// them first; LaunchDecodeAttentionFromQkv stores each entry's newest one itself). Query head h
// uses kv head h / (num_heads / num_kv_heads). fp32 softmax with max subtraction; bf16 in and out.
//
// Two kernels:
//  - Decode (LaunchDecodeAttention): one query token per entry. One CTA per (entry, kv head,
//    context split) processes all query heads of the kv head's group, so K/V are read once per
//    group, in one pass (online softmax; K and V loads in flight together). Contexts are split
//    into `partition`-key pieces (split-K, PlanDecodeSplits) and a second kernel merges the
//    pieces when num_splits > 1. Any head_dim in {16, 32, 64, 128, 256} with group * head_dim
//    <= 1024. Head dim 128 runs on tensor cores (decode_attention_tc.cu: the group's query
//    heads are the rows of an mma.sync tile, K/V through shared memory, 3 tiles in flight per
//    warp) where the device allows 100 KB of shared memory per CTA; others on CUDA cores.
//  - Prefill (LaunchPrefillAttention): flash-attention style on tensor cores with fp32
//    accumulation, online softmax, variable-length batch. Two kernels, picked by the batch's
//    tile_rows: 128-query tiles use Hopper's warpgroup MMA (wgmma, sm_90 devices only:
//    prefill_attention_sm90.cu), 64-query tiles use mma.sync (any sm_80+ device).
//    PrefillTileRows() says which the current device runs. head_dim 128 only; other head dims
//    go through the decode kernel, one entry per query token (correct, slower).
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "kernels/cuda/cuda_utils.h"
#include "kernels/cuda/rope.h"

namespace ringserve::cuda {

inline constexpr int kDecodePartition = 512;

struct AttentionShape {
  int num_heads = 0;
  float scale = 1.0f;  // usually 1 / sqrt(head_dim)
  KvCacheLayer cache;  // num_kv_heads, block_size, head_dim and the layer's K/V
};

// Decode entries, device memory. Entry e attends query row q_rows[e] of q ([rows, num_heads,
// head_dim] bf16) to cache positions [0, context_lens[e]) through block table row
// table_rows[e] of block_tables ([*, max_blocks] int32), and writes the same row of out.
// context_lens[e] <= num_splits * partition is the caller's contract; context_lens[e]
// == 0 writes nothing (padding). `workspace` holds DecodeWorkspaceFloats(...) floats when
// num_splits > 1 (may be nullptr otherwise).
// Under programmatic dependent launch (dependent_launch.cuh) the head_dim-128 kernel reads the
// batch arrays and the cache rows of keys < context_lens[e] - 1 BEFORE waiting for the previous
// kernel on the stream: those must have been written before that kernel started (a decode
// step's QKV prepare writes only q and each entry's newest key, which are read after the wait).
struct DecodeBatch {
  const int32_t* q_rows = nullptr;
  const int32_t* context_lens = nullptr;
  const int32_t* table_rows = nullptr;
  const int32_t* block_tables = nullptr;
  int max_blocks = 0;
  int num_entries = 0;
  int num_splits = 1;
  float* workspace = nullptr;
  // Keys per split (>= 1): smaller pieces give short contexts more CTAs.
  int partition = kDecodePartition;
};

// Split-K choice: as many splits as fit one wave of the decode kernel (DecodeCtasPerSm CTAs per
// SM; num_entries x num_kv_heads x splits CTAs in all) — never a second, partial wave, and no
// split (and no merge kernel) when the batch alone fills the GPU — but no split shorter than
// kMinDecodePartition keys (a multiple of it); partition * splits >= max_context. Measured on
// an H200 (Llama-3.1-8B shape, 32 sequences of 160 keys): 2 splits = 1.3 waves took 27.4 us +
// 5.3 us of merge, where the batch alone is 256 CTAs.
inline constexpr int kMinDecodePartition = 32;
// CTAs of the decode kernel one SM holds: the tensor-core kernel (head_dim 128) by its shared
// memory (100 KB), the CUDA-core kernel by its registers at group 4. (On a device without 100 KB
// of shared memory per CTA head dim 128 runs the CUDA-core kernel with this same plan.)
inline int DecodeCtasPerSm(int head_dim) { return head_dim == 128 ? 2 : 3; }
struct DecodeSplitPlan {
  int partition = kDecodePartition;
  int splits = 1;
};
inline DecodeSplitPlan PlanDecodeSplits(int num_entries, int num_kv_heads, int head_dim,
                                        int max_context, int num_sms) {
  const int ctx = max_context < 1 ? 1 : max_context;
  const int base = num_entries * num_kv_heads < 1 ? 1 : num_entries * num_kv_heads;
  int splits = DecodeCtasPerSm(head_dim) * num_sms / base;
  const int max_splits = (ctx + kMinDecodePartition - 1) / kMinDecodePartition;
  if (splits > max_splits) splits = max_splits;
  if (splits < 1) splits = 1;
  int partition = (ctx + splits - 1) / splits;
  partition = (partition + kMinDecodePartition - 1) / kMinDecodePartition * kMinDecodePartition;
  return {partition, (ctx + partition - 1) / partition};
}

// A decode step's q/k/v projection before the attention input stage, for
// LaunchDecodeAttentionFromQkv: entry e's row q_rows[e] of qkv ([rows, (num_heads + 2 *
// num_kv_heads) * head_dim] bf16: q heads, k heads, v heads) is its token; positions, slots:
// [rows] device, per token (as QkvPrepareArgs).
struct DecodeQkv {
  const bf16* qkv = nullptr;
  const bf16* bias = nullptr;  // [(num_heads + 2 * num_kv_heads) * head_dim] or nullptr
  const int32_t* positions = nullptr;
  const int32_t* slots = nullptr;
  const float* inv_freq = nullptr;  // [head_dim / 2]
};
// Whether LaunchDecodeAttentionFromQkv runs for this head dim on the current device (head_dim
// 128 on the tensor-core kernel).
bool DecodeAttentionTakesQkv(int head_dim);
// LaunchQkvPrepare (without q/k norms) for the entries' rows followed by LaunchDecodeAttention,
// as one kernel: each entry's q heads are biased and rotated on the way into the kernel (q_out is
// not written), and the CTA whose split holds the newest key (context_lens[e] - 1, which must be
// the cache slot slots[q_rows[e]]) biases, rotates and stores that key and value first. Same
// values as the two launches, bit for bit. Needs DecodeAttentionTakesQkv(head_dim), and every
// entry's older keys in the cache before the launch (one entry per sequence: an entry never
// attends to a key another entry of the launch stores).
absl::Status LaunchDecodeAttentionFromQkv(const AttentionShape& shape, const DecodeQkv& qkv,
                                          bf16* out, const DecodeBatch& batch, cudaStream_t stream);

int64_t DecodeWorkspaceFloats(int num_entries, int num_heads, int head_dim, int num_splits);
// Splits needed so that every context up to max_context fits.
inline int DecodeSplitsFor(int max_context, int partition = kDecodePartition) {
  return max_context <= partition ? 1 : (max_context + partition - 1) / partition;
}

absl::Status LaunchDecodeAttention(const AttentionShape& shape, const bf16* q, bf16* out,
                                   const DecodeBatch& batch, cudaStream_t stream);

// Prefill chunks, device memory. Sequence s owns query rows [q_starts[s], q_starts[s] +
// num_tokens[s]) whose positions are start_positions[s] + i; its keys are cache positions
// [0, start_positions[s] + num_tokens[s]) through block table row s ([num_seqs, max_blocks]).
// `tiles` ([num_tiles] int2 = (seq, first query of the tile), tiles of tile_rows queries)
// comes from MakePrefillTiles with the same tile_rows.
inline constexpr int kPrefillTile = 64;       // mma.sync kernel; the smallest tile
inline constexpr int kPrefillTileSm90 = 128;  // wgmma kernel (sm_90 only)
struct PrefillBatch {
  const int32_t* q_starts = nullptr;
  const int32_t* num_tokens = nullptr;
  const int32_t* start_positions = nullptr;
  const int32_t* block_tables = nullptr;
  int max_blocks = 0;
  const int32_t* tiles = nullptr;  // [num_tiles, 2]
  int num_tiles = 0;
  int tile_rows = kPrefillTile;  // kPrefillTile or kPrefillTileSm90
};

// The tile size of the fastest prefill kernel the current device runs: kPrefillTileSm90 on
// compute capability 9.0 (when the build targets sm_90), else kPrefillTile. Cached per device.
int PrefillTileRows();

// Keys per K/V tile of the sm_90 kernel: 64 (the default: 97 KB of shared memory, two CTAs per
// SM, so one's softmax runs beside the other's tensor-core work) or 128 (one CTA per SM). On an
// H200 the 64-key tiles ran the 8k causal attention in 1.33-1.37 ms against 1.66-1.78 and prefill
// 8k 1.6-1.7% faster (bench/cuda/NOTES.md, run 12). Process-wide; other values are refused
// (false). For A/B measurements (stage_bench --prefill_key_tile).
bool SetPrefillKeyTileSm90(int keys);
int PrefillKeyTileSm90();
// Holds the key tile it was made with (kept as it is when refused) and puts the previous one
// back when it goes out of scope, however the scope ends.
class ScopedPrefillKeyTileSm90 {
 public:
  explicit ScopedPrefillKeyTileSm90(int keys) : ok_(SetPrefillKeyTileSm90(keys)) {}
  ~ScopedPrefillKeyTileSm90() { SetPrefillKeyTileSm90(previous_); }
  ScopedPrefillKeyTileSm90(const ScopedPrefillKeyTileSm90&) = delete;
  ScopedPrefillKeyTileSm90& operator=(const ScopedPrefillKeyTileSm90&) = delete;
  bool ok() const { return ok_; }

 private:
  int previous_ = PrefillKeyTileSm90();
  bool ok_;
};

// Host-side: the (seq, first query) pairs covering every chunk in tiles of `tile_rows` queries,
// longest-running tiles (most keys) first. Appends to `tiles` as flat pairs. At most
// sum(num_tokens) / kPrefillTile + num_seqs tiles for any tile_rows >= kPrefillTile.
void MakePrefillTiles(const std::vector<int32_t>& num_tokens,
                      const std::vector<int32_t>& start_positions, std::vector<int32_t>* tiles,
                      int tile_rows = kPrefillTile);

// Requires cache.head_dim == 128, a group size num_heads / num_kv_heads >= 1, and
// batch.tile_rows == kPrefillTile, or kPrefillTileSm90 on a compute capability 9.0 device.
absl::Status LaunchPrefillAttention(const AttentionShape& shape, const bf16* q, bf16* out,
                                    const PrefillBatch& batch, cudaStream_t stream);

}  // namespace ringserve::cuda
