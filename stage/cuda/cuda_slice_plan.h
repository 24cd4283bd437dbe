// One micro-batch's layout on the CUDA slice (CudaModelSlice::Plan): built by BuildPlan
// (cuda_forward.cc) into the pinned metadata buffer, read by the launchers and the sampling.
// Private to the slice's own .cc files.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/kernel_selector.h"
#include "stage/cuda/cuda_model_slice.h"

namespace ringserve::cuda {

struct CudaModelSlice::Plan {
  int tokens = 0;  // rows of the activation buffers this batch uses (graph: the padded bucket)
  int real_tokens = 0;
  int64_t ids = 0, positions = 0, slots = 0;                 // [tokens]
  int64_t dec_rows = 0, dec_ctx = 0, dec_tables = 0;         // [num_decode]
  int64_t pre_q_starts = 0, pre_tokens = 0, pre_starts = 0;  // [chunks]
  int64_t tiles = 0;                                         // [num_tiles, 2]
  int64_t gather = 0;                                        // [logit_rows]
  int64_t tables = 0;                                        // [chunks, table_stride]
  int64_t meta_size = 0;
  int table_stride = 1;
  int num_decode = 0;
  int num_tiles = 0;
  int splits = 1;
  int partition = kDecodePartition;  // decode keys per split
  int max_context = 0;               // the longest decode context (graph: the context bucket)
  int logit_rows = 0;                // rows the lm_head computes
  bool gather_identity = true;
  bool graph = false;
  // Every chunk is one token (a decode entry) of a sequence no other chunk continues: its older
  // keys are all in the cache before the step, so the attention kernel may store each entry's
  // newest key itself.
  bool all_decode = false;
  StepKernels kernels;  // where the decode fusions put each stage of a layer
  std::pair<int, int> graph_key;
  std::vector<int> output_rows;  // logits rows returned, in chunk order
};

}  // namespace ringserve::cuda
