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
//    pieces when num_splits > 1. Any head_dim in {8, 16, 32, 64, 128, 256}; a group of more
//    than 8 query heads (GLM-4.5: 12) is cut into parts of at most 8 (DecodeHeadParts,
//    kernel_selector.h), a CTA each, CUDA-core kernel only; a CTA's heads * head_dim <= 1024.
//    DecodeBatch::kernel picks the kernel (the KernelPlan's decode_attention,
//    kernel_selector.h): kTensorCore runs head dim 128 on tensor cores (decode_attention_tc.cu:
//    the group's query heads are the rows of an mma.sync tile, K/V through shared memory, 3
//    tiles in flight per warp; the device must allow 100 KB of shared memory per CTA; groups of
//    at most 8), kCudaCore any head dim on CUDA cores.
//  - Prefill (LaunchPrefillAttention): flash-attention style on tensor cores with fp32
//    accumulation, online softmax, variable-length batch. Two kernels, picked by the batch's
//    tile_rows (the KernelPlan's prefill_tile_rows): 128-query tiles use Hopper's warpgroup MMA
//    (wgmma, compute capability 9.0 only: prefill_attention_sm90.cu), 64-query tiles use
//    mma.sync (any sm_80+ device). head_dim 128 only; other head dims go through the decode
//    kernel, one entry per query token (correct, slower).
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "kernels/cuda/cuda_utils.h"
#include "kernels/cuda/kernel_selector.h"
#include "kernels/cuda/rope.h"

namespace ringserve::cuda {

struct AttentionShape {
  int num_heads = 0;
  float scale = 1.0f;  // usually 1 / sqrt(head_dim)
  KvCacheLayer cache;  // num_kv_heads, block_size, head_dim and the layer's K/V
  // gpt-oss: [num_heads] fp32 or null: head h's softmax gets one more logit, sinks[h] (not
  // scaled), with no value. Decode kernels only (the prefill kernels refuse it).
  const float* sinks = nullptr;
  // > 0: a query at position p sees positions (p - sliding_window, p] only. The CUDA-core decode
  // kernel only (the tensor-core and prefill kernels refuse it).
  int sliding_window = 0;
};

// The most splits a decode launch merges in its last CTA (DecodeBatch::split_tickets).
inline constexpr int kMaxSplitsMergedByCta = 16;

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
  // Keys per split (>= 1): smaller pieces give short contexts more CTAs (PlanDecodeSplits,
  // kernel_selector.h).
  int partition = kDecodePartition;
  // The KernelPlan's decode_attention. kTensorCore needs head_dim 128 (InvalidArgument
  // otherwise) and a device with 100 KB of shared memory per CTA (an Internal launch error
  // otherwise).
  DecodeAttentionKernel kernel = DecodeAttentionKernel::kCudaCore;
  // Optional, with num_splits > 1: DecodeSplitTickets(num_entries, num_heads) int32 of device
  // memory, zero before the launch and left zero after it. The CTA that finishes an entry's head
  // set last then merges its splits, instead of a merge kernel after the attention kernel (one
  // launch fewer a layer) — for up to kMaxSplitsMergedByCta splits; more keep the merge kernel.
  // Launches that share tickets must not run concurrently.
  int32_t* split_tickets = nullptr;
};

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
// LaunchQkvPrepare (without q/k norms) for the entries' rows followed by LaunchDecodeAttention,
// as one kernel: each entry's q heads are biased and rotated on the way into the kernel (q_out is
// not written), and the CTA whose split holds the newest key (context_lens[e] - 1, which must be
// the cache slot slots[q_rows[e]]) biases, rotates and stores that key and value first. Same
// values as the two launches, bit for bit. Needs batch.kernel kTensorCore (head_dim 128), and every
// entry's older keys in the cache before the launch (one entry per sequence: an entry never
// attends to a key another entry of the launch stores).
absl::Status LaunchDecodeAttentionFromQkv(const AttentionShape& shape, const DecodeQkv& qkv,
                                          bf16* out, const DecodeBatch& batch, LaunchStream stream);

int64_t DecodeWorkspaceFloats(int num_entries, int num_heads, int head_dim, int num_splits);
// Tickets DecodeBatch::split_tickets needs for a launch of num_entries entries.
int64_t DecodeSplitTickets(int num_entries, int num_heads);

absl::Status LaunchDecodeAttention(const AttentionShape& shape, const bf16* q, bf16* out,
                                   const DecodeBatch& batch, LaunchStream stream);

// Prefill chunks, device memory. Sequence s owns query rows [q_starts[s], q_starts[s] +
// num_tokens[s]) whose positions are start_positions[s] + i; its keys are cache positions
// [0, start_positions[s] + num_tokens[s]) through block table row s ([num_seqs, max_blocks]).
// `tiles` ([num_tiles] int2 = (seq, first query of the tile), tiles of tile_rows queries)
// comes from MakePrefillTiles with the same tile_rows. kPrefillTile (mma.sync kernel; the
// smallest tile) and kPrefillTileSm90 (wgmma kernel) are in kernel_selector.h.
struct PrefillBatch {
  const int32_t* q_starts = nullptr;
  const int32_t* num_tokens = nullptr;
  const int32_t* start_positions = nullptr;
  const int32_t* block_tables = nullptr;
  int max_blocks = 0;
  const int32_t* tiles = nullptr;  // [num_tiles, 2]
  int num_tiles = 0;
  int tile_rows = kPrefillTile;  // kPrefillTile or kPrefillTileSm90 (KernelPlan's)
  // Keys per K/V tile of the wgmma kernel: 64 (97 KB of shared memory, two CTAs per SM, so one's
  // softmax runs beside the other's tensor-core work) or 128 (one CTA per SM): the KernelPlan's
  // prefill_key_tile. Ignored by the mma.sync kernel.
  int key_tile = 64;
};

// Host-side: the (seq, first query) pairs covering every chunk in tiles of `tile_rows` queries,
// longest-running tiles (most keys) first. Appends to `tiles` as flat pairs. At most
// sum(num_tokens) / kPrefillTile + num_seqs tiles for any tile_rows >= kPrefillTile.
void MakePrefillTiles(const std::vector<int32_t>& num_tokens,
                      const std::vector<int32_t>& start_positions, std::vector<int32_t>* tiles,
                      int tile_rows = kPrefillTile);

// Requires cache.head_dim == 128, a group size num_heads / num_kv_heads >= 1 (any: one CTA per
// query head), and
// batch.tile_rows == kPrefillTile, or kPrefillTileSm90 (with key_tile 64 or 128) in a build with
// the sm_90a kernel on a compute capability 9.0 device (InvalidArgument for the build, a launch
// error for another device).
absl::Status LaunchPrefillAttention(const AttentionShape& shape, const bf16* q, bf16* out,
                                    const PrefillBatch& batch, LaunchStream stream);

}  // namespace ringserve::cuda
