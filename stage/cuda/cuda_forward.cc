// The CUDA slice's forward pass: micro-batch validation, the per-batch metadata plan, the layer
// loop, decode-step CUDA graphs, the ModelSlice entry points and logits sampling.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <string>

#include "absl/status/status.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "fmt/format.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/gemv.h"
#include "kernels/cuda/graph_edges.h"
#include "kernels/cuda/rope.h"
#include "kernels/cuda/sampling.h"
#include "stage/cuda/cuda_model_slice.h"
#include "stage/cuda/cuda_slice_plan.h"
#include "stage/model/micro_batch_check.h"
#include "stage/sampling/sampler.h"

namespace ringserve::cuda {

namespace {

int NextPow2(int x) {
  int p = 1;
  while (p < x) p <<= 1;
  return p;
}

// The most tokens of a chunk that runs in a CUDA graph (as decode rows): 1 + 16 drafts.
constexpr int kMaxGraphChunkTokens = 17;

bool DistinctSequences(const MicroBatch& batch) {
  std::vector<uint64_t> ids;
  ids.reserve(batch.chunks.size());
  for (const SequenceChunk& c : batch.chunks) ids.push_back(c.seq_id);
  std::sort(ids.begin(), ids.end());
  return std::adjacent_find(ids.begin(), ids.end()) == ids.end();
}

int64_t LogitRows(const MicroBatch& batch) {
  int64_t rows = 0;
  for (const SequenceChunk& c : batch.chunks) {
    if (c.logits == LogitsMode::kAllTokens) rows += c.num_tokens;
    if (c.logits == LogitsMode::kLastToken) rows += 1;
  }
  return rows;
}

bool HasAllTokens(const MicroBatch& batch) {
  for (const SequenceChunk& c : batch.chunks) {
    if (c.logits == LogitsMode::kAllTokens) return true;
  }
  return false;
}

}  // namespace

absl::Status CudaModelSlice::Validate(const MicroBatch& batch,
                                      const std::span<const float>* hidden_in) const {
  if (batch.chunks.empty()) return absl::InvalidArgumentError("micro-batch has no chunks");
  const int64_t total = batch.TotalTokens();
  if (total > cuda_.max_batch_tokens || static_cast<int>(batch.chunks.size()) > cuda_.max_seqs) {
    return absl::InvalidArgumentError(
        fmt::format("micro-batch of {} tokens in {} chunks exceeds the CUDA slice's capacity ({} "
                    "tokens, {} chunks)",
                    total, batch.chunks.size(), cuda_.max_batch_tokens, cuda_.max_seqs));
  }
  // More rows than one lm_head pass only for prompt log-probabilities (LogitsToHost runs them
  // in passes); sampling-only batches must fit one pass.
  if (is_last() && LogitRows(batch) > cuda_.max_logit_rows && !HasAllTokens(batch)) {
    return absl::InvalidArgumentError(fmt::format("micro-batch asks for {} logits rows, max {}",
                                                  LogitRows(batch), cuda_.max_logit_rows));
  }
  return ValidateMicroBatch(batch, hidden_in ? *hidden_in : std::span<const float>(),
                            {.max_positions = cuda_.max_model_len,
                             .max_positions_name = "max_model_len",
                             .kv_block_size = options_.kv_block_size,
                             .kv_num_blocks = options_.kv_num_blocks,
                             .vocab_size = config_.vocab_size,
                             .hidden_size = config_.hidden_size,
                             .is_first = is_first(),
                             .hidden_in_resident = hidden_in == nullptr});
}

absl::Status CudaModelSlice::BuildPlan(const MicroBatch& batch, Plan* p) {
  const int n = static_cast<int>(batch.chunks.size());
  const int total = static_cast<int>(batch.TotalTokens());
  const int bs = options_.kv_block_size;
  bool all_decode = true;
  // Speculative verification chunks (a few tokens, every row's logits) run in the graphs too,
  // their tokens as decode rows (K/V stored before attention reads it: not all_decode).
  bool graphable = true;
  int max_end = 0;
  for (const SequenceChunk& c : batch.chunks) {
    all_decode = all_decode && c.num_tokens == 1;
    graphable = graphable && (c.num_tokens == 1 || (c.logits == LogitsMode::kAllTokens &&
                                                    c.num_tokens <= kMaxGraphChunkTokens));
    max_end = std::max(max_end, c.start_position + c.num_tokens);
  }
  p->real_tokens = total;
  p->all_decode = all_decode && DistinctSequences(batch);
  p->graph = cuda_.use_cuda_graphs &&
             (all_decode ? n <= cuda_.max_graph_batch
                         : graphable && NextPow2(total) <= std::min(cuda_.max_graph_batch,
                                                                    cuda_.max_batch_tokens));
  int chunk_cap = n;
  if (p->graph) {
    const int bucket = NextPow2(total);
    const int padded_len =
        (cuda_.max_model_len + kDecodePartition - 1) / kDecodePartition * kDecodePartition;
    const int ctx = std::min(std::max(kDecodePartition, NextPow2(max_end)), padded_len);
    p->tokens = bucket;
    chunk_cap = bucket;
    p->table_stride = (ctx + bs - 1) / bs;
    const DecodeSplitPlan split = PlanDecodeSplits(kernels_, bucket, config_.num_kv_heads, ctx);
    p->partition = split.partition;
    p->splits = split.splits;
    p->graph_key = {p->all_decode ? bucket : -bucket, ctx};  // the kernels differ
  } else {
    p->tokens = total;
    p->table_stride = (max_end + bs - 1) / bs;
  }

  p->kernels = SelectStepKernels(kernels_, {.tokens = p->tokens,
                                            .hidden_size = config_.hidden_size,
                                            .all_decode = p->all_decode,
                                            .qk_norm = config_.qk_norm});
  // The folded attention input stages rotate whole heads of 16+ values: partial rotary and
  // smaller heads take the QKV prepare kernel.
  if ((config_.rotary_dim > 0 && config_.rotary_dim != config_.head_dim) || config_.head_dim < 16) {
    p->kernels.qkv_in_gemv = false;
    p->kernels.qkv_in_attention = false;
  }
  // Quantized linear layers run unfused (cuda_quant_linear.h); so does latent attention (its
  // layer has no fused-norm kernels). MoE models take the fused decode like dense ones: its two
  // misses on earlier GPU runs were random test prompts on a router near-tie (the tests now use
  // fixed prompts; the unfused path missed the same way on other seeds). For A/B runs,
  // RINGSERVE_MOE_FUSED_NORMS=0 runs MoE models unfused (measured on an H100, Qwen3-30B-A3B
  // shape, 1 stream: 230.1 unfused, 260.6 tok/s fused; bench/cuda/NOTES.md).
  static const bool moe_unfused = [] {
    const char* env = std::getenv("RINGSERVE_MOE_FUSED_NORMS");
    return env != nullptr && std::string(env) == "0";
  }();
  if (!quant_.empty() || config_.mla || (config_.moe.enabled() && moe_unfused)) {
    p->kernels.fused_norms = p->kernels.qkv_in_gemv = p->kernels.gate_up_gemv = false;
  }
  // Per-token and per-entry vectors.
  // MLA runs every token as a decode entry over the compressed cache (cuda_mla_attention.h).
  const bool tensor_core_prefill =
      kernels_.prefill_attention != PrefillAttentionKernel::kDecodeKernel && !config_.mla;
  std::vector<int32_t> ids(p->tokens, 0), positions(p->tokens, 0), slots(p->tokens, -1);
  std::vector<int32_t> dec_rows, dec_ctx, dec_tables;
  std::vector<int32_t> q_starts(chunk_cap, 0), pre_tokens(chunk_cap, 0), pre_starts(chunk_cap, 0);
  std::vector<int32_t> gather;
  p->output_rows.clear();
  int row = 0;
  int max_decode_ctx = 0;
  for (int c = 0; c < n; ++c) {
    const SequenceChunk& chunk = batch.chunks[c];
    for (int i = 0; i < chunk.num_tokens; ++i) {
      const int pos = chunk.start_position + i;
      if (is_first()) ids[row + i] = batch.token_ids[row + i];
      positions[row + i] = pos;
      slots[row + i] = chunk.block_table[pos / bs] * bs + pos % bs;
    }
    q_starts[c] = row;
    pre_starts[c] = chunk.start_position;
    if (chunk.num_tokens > 1 && tensor_core_prefill && !p->graph) {
      pre_tokens[c] = chunk.num_tokens;
    } else {
      for (int i = 0; i < chunk.num_tokens; ++i) {
        dec_rows.push_back(row + i);
        dec_ctx.push_back(chunk.start_position + i + 1);
        dec_tables.push_back(c);
        max_decode_ctx = std::max(max_decode_ctx, chunk.start_position + i + 1);
      }
    }
    if (chunk.logits == LogitsMode::kAllTokens) {
      for (int i = 0; i < chunk.num_tokens; ++i) gather.push_back(row + i);
    } else if (chunk.logits == LogitsMode::kLastToken) {
      gather.push_back(row + chunk.num_tokens - 1);
    }
    row += chunk.num_tokens;
  }
  if (p->graph) {
    // Padding entries: no KV store (slot -1), no attention (context 0).
    for (int e = total; e < p->tokens; ++e) {
      dec_rows.push_back(e);
      dec_ctx.push_back(0);
      dec_tables.push_back(0);
    }
    p->max_context = p->graph_key.second;
    p->output_rows.assign(gather.begin(), gather.end());
    gather.resize(p->tokens);
    for (int r = 0; r < p->tokens; ++r) gather[r] = r;
    p->gather_identity = true;
    p->logit_rows = p->tokens;
  } else {
    const DecodeSplitPlan split = PlanDecodeSplits(kernels_, static_cast<int>(dec_rows.size()),
                                                   config_.num_kv_heads, max_decode_ctx);
    p->partition = split.partition;
    p->splits = split.splits;
    p->max_context = max_decode_ctx;
    p->gather_identity = static_cast<int>(gather.size()) == total;
    for (size_t r = 0; r < gather.size() && p->gather_identity; ++r) {
      p->gather_identity = gather[r] == static_cast<int>(r);
    }
    p->logit_rows = static_cast<int>(gather.size());
    for (int r = 0; r < p->logit_rows; ++r) p->output_rows.push_back(r);
  }
  std::vector<int32_t> tiles;
  if (!p->graph) MakePrefillTiles(pre_tokens, pre_starts, &tiles, kernels_.prefill_tile_rows);
  p->num_decode = static_cast<int>(dec_rows.size());
  p->num_tiles = static_cast<int>(tiles.size() / 2);

  // Lay the regions out in the pinned buffer.
  int64_t offset = 0;
  auto put = [&](const std::vector<int32_t>& v) {
    const int64_t at = offset;
    std::copy(v.begin(), v.end(), meta_host_ + at);
    offset += (static_cast<int64_t>(v.size()) + 3) / 4 * 4;
    return at;
  };
  p->ids = put(ids);
  p->positions = put(positions);
  p->slots = put(slots);
  p->dec_rows = put(dec_rows);
  p->dec_ctx = put(dec_ctx);
  p->dec_tables = put(dec_tables);
  p->pre_q_starts = put(q_starts);
  p->pre_tokens = put(pre_tokens);
  p->pre_starts = put(pre_starts);
  p->tiles = put(tiles);
  p->gather = put(gather);
  p->tables = offset;
  const int64_t table_elems = static_cast<int64_t>(chunk_cap) * p->table_stride;
  if (offset + table_elems > meta_capacity_) {
    return absl::InternalError("CUDA slice metadata exceeds its buffer");
  }
  std::fill_n(meta_host_ + offset, table_elems, 0);
  for (int c = 0; c < n; ++c) {
    const auto& table = batch.chunks[c].block_table;
    const int count = std::min(static_cast<int>(table.size()), p->table_stride);
    std::copy_n(table.begin(), count, meta_host_ + offset + int64_t{c} * p->table_stride);
  }
  p->meta_size = offset + table_elems;
  return absl::OkStatus();
}

absl::Status CudaModelSlice::RunQkv(int l, const Plan& p, const KvCacheLayer& cache) {
  const ModelConfig& c = config_;
  const LayerWeights& w = layers_[l];
  const int t = p.tokens;
  const int h = c.hidden_size, d = c.head_dim;
  const int qkv_width = (c.num_heads + 2 * c.num_kv_heads) * d;
  const int32_t* m = meta_.as<int32_t>();
  const float eps = c.rms_norm_eps;
  float* residual = residual_.as<float>();
  const bool fused = p.kernels.fused_norms;
  if (p.kernels.qkv_in_gemv) {
    // The projection rotates q and k and stores K/V itself (no qkv buffer, no prepare kernel).
    return LaunchGemvNormedQkvRope({residual, w.input_norm, eps}, w.qkv,
                                   {.bias = w.qkv_bias,
                                    .positions = m + p.positions,
                                    .inv_freq = inv_freq_.as<float>(),
                                    .slots = m + p.slots,
                                    .q_out = q_.as<bf16>(),
                                    .cache = cache,
                                    .num_heads = c.num_heads},
                                   t, h, stream_);
  }
  if (fused) {
    RS_RETURN_IF_ERROR(LaunchGemvNormed({residual, w.input_norm, eps}, w.qkv, qkv_.as<bf16>(), t,
                                        qkv_width, h, stream_));
  } else {
    // The previous layer's MLP output is still to be added (not on layer 0).
    RS_RETURN_IF_ERROR(LaunchAddRmsNorm(residual, l == 0 ? nullptr : proj_.as<bf16>(), nullptr,
                                        w.input_norm, normed_.as<bf16>(), t, h, eps, stream_));
    RS_RETURN_IF_ERROR(
        RunLinear(l, LayerLinear::kQkv, normed_.as<bf16>(), w.qkv, qkv_.get(), t, qkv_width, h));
  }
  if (p.kernels.qkv_in_attention) return absl::OkStatus();  // RunAttention rotates and stores
  return LaunchQkvPrepare({.qkv = qkv_.as<bf16>(),
                           .bias = w.qkv_bias,
                           .q_norm = w.q_norm,
                           .k_norm = w.k_norm,
                           .norm_eps = eps,
                           .positions = m + p.positions,
                           .inv_freq = inv_freq_.as<float>(),
                           .slots = m + p.slots,
                           .q_out = q_.as<bf16>(),
                           .cache = cache,
                           .num_tokens = t,
                           .num_heads = c.num_heads,
                           .rotary_dim = c.rotary_dim},
                          stream_);
}

absl::Status CudaModelSlice::RunLayer(int l, const Plan& p) {
  const ModelConfig& c = config_;
  const LayerWeights& w = layers_[l];
  const int t = p.tokens;
  const int h = c.hidden_size, d = c.head_dim, inter = c.intermediate_size;
  const float eps = c.rms_norm_eps;
  float* residual = residual_.as<float>();
  const bool fused = p.kernels.fused_norms;
  if (config_.mla) {
    // Every token is a decode entry in row order (BuildPlan), padding included.
    const int32_t* m = meta_.as<int32_t>();
    return RunMlaLayer(l, {.positions = m + p.positions,
                           .slots = m + p.slots,
                           .context_lens = m + p.dec_ctx,
                           .table_rows = m + p.dec_tables,
                           .block_tables = m + p.tables,
                           .max_blocks = p.table_stride,
                           .num_tokens = t,
                           .max_context = p.max_context});
  }
  KvCacheLayer cache{
      .num_kv_heads = c.num_kv_heads, .block_size = options_.kv_block_size, .head_dim = d};
  if (options_.kv_cache_dtype == KvCacheDtype::kFp8E4m3) {
    cache.k8 = kv_buffer_.as<uint8_t>() + 2 * l * kv_layer_elems_;
    cache.v8 = cache.k8 + kv_layer_elems_;
    cache.k_scale = kv_k_scales_[l];
    cache.v_scale = kv_v_scales_[l];
  } else {
    cache.k = kv_buffer_.as<bf16>() + 2 * l * kv_layer_elems_;
    cache.v = cache.k + kv_layer_elems_;
  }
  RS_RETURN_IF_ERROR(RunQkv(l, p, cache));
  RS_RETURN_IF_ERROR(RunAttention(l, p, cache));
  if (moe_[l] != nullptr) return RunMoeMlp(l, p);
  if (fused) {
    RS_RETURN_IF_ERROR(LaunchGemvAddResidual(attn_.as<bf16>(), w.o, w.o_bias, residual, t, h,
                                             c.num_heads * d, stream_));
    RS_RETURN_IF_ERROR(LaunchGemvGateUpSiluNormed({residual, w.post_norm, eps}, w.gate_up,
                                                  act_.as<bf16>(), t, inter, h, stream_));
    return LaunchGemvAddResidual(act_.as<bf16>(), w.down, nullptr, residual, t, h, inter, stream_);
  }
  RS_RETURN_IF_ERROR(
      RunLinear(l, LayerLinear::kO, attn_.as<bf16>(), w.o, proj_.get(), t, h, c.num_heads * d));
  RS_RETURN_IF_ERROR(LaunchAddRmsNorm(residual, proj_.as<bf16>(), w.o_bias, w.post_norm,
                                      normed_.as<bf16>(), t, h, eps, stream_));
  if (p.kernels.gate_up_gemv) {
    // Decode at GEMV sizes: gate/up and SiLU-and-multiply in one kernel.
    RS_RETURN_IF_ERROR(
        LaunchGemvGateUpSilu(normed_.as<bf16>(), w.gate_up, act_.as<bf16>(), t, inter, h, stream_));
  } else {
    RS_RETURN_IF_ERROR(RunLinear(l, LayerLinear::kGateUp, normed_.as<bf16>(), w.gate_up,
                                 gate_up_.get(), t, 2 * inter, h));
    RS_RETURN_IF_ERROR(LaunchSiluMul(gate_up_.as<bf16>(), act_.as<bf16>(), t, inter, stream_));
  }
  // Left in proj_ for the next layer's (or the slice's final) add.
  return RunLinear(l, LayerLinear::kDown, act_.as<bf16>(), w.down, proj_.get(), t, h, inter);
}

absl::Status CudaModelSlice::RunLinear(int l, LayerLinear which, const bf16* x, const bf16* w,
                                       void* y, int m, int n, int k) {
  if (const QuantMatrixView* q = quant_.Get(l, which)) {
    return quant_.Linear(*gemm_, x, *q, y, OutType::kBF16, m, stream_);
  }
  return gemm_->Linear(x, w, y, OutType::kBF16, m, n, k, stream_);
}

absl::Status CudaModelSlice::RunMoeMlp(int l, const Plan& p) {
  const ModelConfig& c = config_;
  const LayerWeights& w = layers_[l];
  const int t = p.tokens, h = c.hidden_size;
  float* residual = residual_.as<float>();
  if (p.kernels.fused_norms) {
    // As the dense fused path: the o projection adds into the residual, the block adds its own.
    RS_RETURN_IF_ERROR(LaunchGemvAddResidual(attn_.as<bf16>(), w.o, w.o_bias, residual, t, h,
                                             c.num_heads * c.head_dim, stream_));
    RS_RETURN_IF_ERROR(LaunchAddRmsNorm(residual, nullptr, nullptr, w.post_norm, normed_.as<bf16>(),
                                        t, h, c.rms_norm_eps, stream_));
    return moe_[l]->Forward(normed_.as<bf16>(), t, residual, nullptr, *moe_ws_, l, stream_);
  }
  // RunLinear: a quantized checkpoint's o projection is held quantized (w.o is null then).
  RS_RETURN_IF_ERROR(RunLinear(l, LayerLinear::kO, attn_.as<bf16>(), w.o, proj_.get(), t, h,
                               c.num_heads * c.head_dim));
  RS_RETURN_IF_ERROR(LaunchAddRmsNorm(residual, proj_.as<bf16>(), w.o_bias, w.post_norm,
                                      normed_.as<bf16>(), t, h, c.rms_norm_eps, stream_));
  // Left in proj_ for the next layer's (or the slice's final) add, as the dense MLP's output.
  return moe_[l]->Forward(normed_.as<bf16>(), t, nullptr, proj_.as<bf16>(), *moe_ws_, l, stream_);
}

absl::Status CudaModelSlice::RunAttention(int l, const Plan& p, const KvCacheLayer& cache) {
  const ModelConfig& c = config_;
  const int32_t* m = meta_.as<int32_t>();
  const AttentionShape shape{.num_heads = c.num_heads,
                             .scale = c.AttentionScale(),
                             .cache = cache,
                             .sinks = layers_[l].sinks,
                             .sliding_window = c.SlidingWindowOf(options_.layers.first + l)};
  if (p.num_decode > 0) {
    const int64_t per_entry = DecodeWorkspaceFloats(1, c.num_heads, c.head_dim, p.splits);
    const int per_launch = p.splits == 1
                               ? p.num_decode
                               : static_cast<int>(std::max<int64_t>(
                                     1, static_cast<int64_t>(decode_ws_.bytes() / 4) / per_entry));
    for (int e0 = 0; e0 < p.num_decode; e0 += per_launch) {
      const DecodeBatch batch{.q_rows = m + p.dec_rows + e0,
                              .context_lens = m + p.dec_ctx + e0,
                              .table_rows = m + p.dec_tables + e0,
                              .block_tables = m + p.tables,
                              .max_blocks = p.table_stride,
                              .num_entries = std::min(per_launch, p.num_decode - e0),
                              .num_splits = p.splits,
                              .workspace = decode_ws_.as<float>(),
                              .partition = p.partition,
                              .kernel = kernels_.decode_attention,
                              .split_tickets = kernels_.merge_splits_in_attention
                                                   ? decode_tickets_.as<int32_t>()
                                                   : nullptr};
      if (p.kernels.qkv_in_attention) {
        RS_RETURN_IF_ERROR(LaunchDecodeAttentionFromQkv(shape,
                                                        {.qkv = qkv_.as<bf16>(),
                                                         .bias = layers_[l].qkv_bias,
                                                         .positions = m + p.positions,
                                                         .slots = m + p.slots,
                                                         .inv_freq = inv_freq_.as<float>()},
                                                        attn_.as<bf16>(), batch, stream_));
      } else {
        RS_RETURN_IF_ERROR(
            LaunchDecodeAttention(shape, q_.as<bf16>(), attn_.as<bf16>(), batch, stream_));
      }
    }
  }
  if (p.num_tiles == 0) return absl::OkStatus();
  const PrefillBatch batch{.q_starts = m + p.pre_q_starts,
                           .num_tokens = m + p.pre_tokens,
                           .start_positions = m + p.pre_starts,
                           .block_tables = m + p.tables,
                           .max_blocks = p.table_stride,
                           .tiles = m + p.tiles,
                           .num_tiles = p.num_tiles,
                           .tile_rows = kernels_.prefill_tile_rows,
                           .key_tile = kernels_.prefill_key_tile};
  return LaunchPrefillAttention(shape, q_.as<bf16>(), attn_.as<bf16>(), batch, stream_);
}

absl::Status CudaModelSlice::TuneGemms(const Plan& p) {
  const ModelConfig& c = config_;
  const int t = p.tokens;
  const int h = c.hidden_size, d = c.head_dim, inter = c.intermediate_size;
  // Not with quantized layers (their GEMM path runs on a scratch matrix, untuned).
  if (config_.mla) RS_RETURN_IF_ERROR(TuneMlaGemms(t));
  if (!layers_.empty() && !p.kernels.fused_norms && quant_.empty() && !config_.mla) {
    // The MLP shapes from a dense layer (MoE layers run their own kernels).
    int dense = 0;
    while (dense + 1 < static_cast<int>(layers_.size()) && layers_[dense].gate_up == nullptr) {
      ++dense;
    }
    const LayerWeights& w = layers_[dense];
    const bf16* normed = normed_.as<bf16>();
    RS_RETURN_IF_ERROR(gemm_->Tune(normed, w.qkv, qkv_.get(), OutType::kBF16, t,
                                   (c.num_heads + 2 * c.num_kv_heads) * d, h, stream_));
    RS_RETURN_IF_ERROR(gemm_->Tune(attn_.as<bf16>(), w.o, proj_.get(), OutType::kBF16, t, h,
                                   c.num_heads * d, stream_));
    if (w.gate_up != nullptr && !p.kernels.gate_up_gemv) {  // else no GEMM, or the GEMV
      RS_RETURN_IF_ERROR(
          gemm_->Tune(normed, w.gate_up, gate_up_.get(), OutType::kBF16, t, 2 * inter, h, stream_));
    }
    if (w.down != nullptr) {
      RS_RETURN_IF_ERROR(
          gemm_->Tune(act_.as<bf16>(), w.down, proj_.get(), OutType::kBF16, t, h, inter, stream_));
    }
  }
  if (!is_last() || p.logit_rows == 0) return absl::OkStatus();
  return gemm_->Tune(normed_.as<bf16>(), lm_head_, logits_.get(), OutType::kF32, p.logit_rows,
                     c.vocab_size, h, stream_);
}

absl::Status CudaModelSlice::Enqueue(const Plan& p) {
  const ModelConfig& c = config_;
  const int32_t* m = meta_.as<int32_t>();
  if (is_first()) {
    RS_RETURN_IF_ERROR(LaunchEmbedding(embedding_, m + p.ids, residual_.as<float>(), p.tokens,
                                       c.hidden_size, stream_));
  }
  for (int l = 0; l < options_.layers.size(); ++l) RS_RETURN_IF_ERROR(RunLayer(l, p));
  // The last layer's MLP output: already in the residual stream when the norms are fused.
  const bf16* pending = p.kernels.fused_norms || layers_.empty() ? nullptr : proj_.as<bf16>();
  if (!is_last()) {
    if (pending == nullptr) return absl::OkStatus();
    return LaunchAddRmsNorm(residual_.as<float>(), pending, nullptr, nullptr, nullptr, p.tokens,
                            c.hidden_size, c.rms_norm_eps, stream_);
  }
  RS_RETURN_IF_ERROR(LaunchAddRmsNorm(residual_.as<float>(), pending, nullptr, final_norm_,
                                      normed_.as<bf16>(), p.tokens, c.hidden_size, c.rms_norm_eps,
                                      stream_));
  // No rows, or more than one lm_head pass holds (LogitsToHost runs those passes).
  if (p.logit_rows == 0 || p.logit_rows > cuda_.max_logit_rows) return absl::OkStatus();
  const bf16* x = normed_.as<bf16>();
  if (!p.gather_identity) {
    RS_RETURN_IF_ERROR(LaunchGatherRows(normed_.as<bf16>(), m + p.gather, gathered_.as<bf16>(),
                                        p.logit_rows, c.hidden_size, stream_));
    x = gathered_.as<bf16>();
  }
  return gemm_->Linear(x, lm_head_, logits_.get(), OutType::kF32, p.logit_rows, c.vocab_size,
                       c.hidden_size, stream_);
}

void CudaModelSlice::PlanDeleter::operator()(Plan* plan) const { delete plan; }

absl::Status CudaModelSlice::PreparePlan(const MicroBatch& batch, Plan* p,
                                         std::span<const TokenFeed> feeds) {
  RS_RETURN_IF_ERROR(Validate(batch, /*hidden_in=*/nullptr));
  RS_CUDA_RETURN_IF_ERROR(cudaSetDevice(cuda_.device));
  // The previous plan's upload from meta_host_ must have run before meta_host_ is rewritten:
  // usually long done; waited for only when the CPU runs steps ahead of the GPU (returns at
  // once before the first record).
  RS_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(meta_uploaded_));
  RS_RETURN_IF_ERROR(BuildPlan(batch, p));
  // Feed pairs (token row, row of tokens_) after the plan's regions.
  const int64_t pairs = p->meta_size;
  if (pairs + 2 * static_cast<int64_t>(feeds.size()) > meta_capacity_) {
    return absl::InternalError("CUDA slice metadata exceeds its buffer");
  }
  for (size_t i = 0; i < feeds.size(); ++i) {
    meta_host_[pairs + 2 * i] = feeds[i].token_row;
    meta_host_[pairs + 2 * i + 1] = fed_rows_[feeds[i].sampled_row];
  }
  const int64_t upload = pairs + 2 * static_cast<int64_t>(feeds.size());
  RS_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(meta_.get(), meta_host_, upload * 4, cudaMemcpyHostToDevice, stream_));
  RS_CUDA_RETURN_IF_ERROR(cudaEventRecord(meta_uploaded_, stream_));
  int32_t* meta = meta_.as<int32_t>();
  return LaunchFeedTokens(tokens_.as<int32_t>(), meta + pairs, static_cast<int>(feeds.size()),
                          meta + p->ids, stream_);
}

absl::Status CudaModelSlice::Launch(const Plan& plan) {
  const Plan* p = &plan;
  RS_CUDA_RETURN_IF_ERROR(cudaSetDevice(cuda_.device));
  if (!p->graph) return Enqueue(*p);

  auto it = graphs_.find(p->graph_key);
  if (it == graphs_.end()) {
    // A new (batch bucket, context bucket) key costs this step the tuning of its batch size's
    // GEMM shapes (once per size) and a capture: logged, since it stalls the whole ring.
    const auto started = std::chrono::steady_clock::now();
    RS_RETURN_IF_ERROR(TuneGemms(*p));
    const auto tuned = std::chrono::steady_clock::now();
    cudaGraph_t graph = nullptr;
    RS_CUDA_RETURN_IF_ERROR(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    const absl::Status status = Enqueue(*p);
    const cudaError_t end = cudaStreamEndCapture(stream_, &graph);
    if (!status.ok()) {
      if (graph) cudaGraphDestroy(graph);
      return status;
    }
    RS_CUDA_RETURN_IF_ERROR(end);
    if (kernels_.early_graph_launch) {
      const absl::Status early = LaunchDependentsAtPredecessorStart(graph);
      if (!early.ok()) {
        cudaGraphDestroy(graph);
        return early;
      }
    }
    cudaGraphExec_t exec = nullptr;
    const cudaError_t instantiated = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    RS_CUDA_RETURN_IF_ERROR(instantiated);
    it = graphs_.emplace(p->graph_key, Graph{exec}).first;
    const auto ms = [](auto d) { return std::chrono::duration<double, std::milli>(d).count(); };
    const int vocab = config_.vocab_size, hidden = config_.hidden_size;
    RS_LOG_INFO(
        "CUDA slice [{}, {}): decode graph for {} rows at context {}: tuning {:.1f} ms, "
        "capture {:.1f} ms{}",
        options_.layers.first, options_.layers.last, p->graph_key.first, p->graph_key.second,
        ms(tuned - started), ms(std::chrono::steady_clock::now() - tuned),
        is_last() && p->logit_rows > 0
            ? "; lm_head: " + gemm_->PlanSummary(p->logit_rows, vocab, hidden, OutType::kF32)
            : std::string());
  }
  RS_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(it->second.exec, stream_));
  return absl::OkStatus();
}

absl::StatusOr<SampledRows> CudaModelSlice::SampleAfterRun(const MicroBatch& batch,
                                                           const Plan& plan,
                                                           std::span<const RowSampling> rows) {
  (void)batch;
  if (rows.size() != plan.output_rows.size()) {
    return absl::InvalidArgumentError(
        fmt::format("{} sampling rows for {} logits rows", rows.size(), plan.output_rows.size()));
  }
  const int64_t vocab = config_.vocab_size;
  SampledRows out;
  if (rows.empty()) {
    RS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    return out;
  }
  if (cuda_.gpu_sampling) {
    if (samples_in_flight_ > 0) {
      return absl::FailedPreconditionError("Sample: an asynchronous sampling is in flight");
    }
    fed_rows_valid_ = false;
    RS_RETURN_IF_ERROR(EnqueueGpuSample(plan, rows));
    return CollectOldestSample();
  }
  // Host sampling: the logits rows come back and go through the CPU sampler.
  std::vector<float> logits(rows.size() * vocab);
  for (size_t r = 0; r < rows.size(); ++r) {
    RS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
        logits.data() + r * vocab, logits_.as<float>() + plan.output_rows[r] * vocab,
        vocab * sizeof(float), cudaMemcpyDeviceToHost, stream_));
  }
  RS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  RS_ASSIGN_OR_RETURN(out.tokens, SampleTokens(logits, static_cast<int>(vocab), rows));
  for (size_t r = 0; r < rows.size(); ++r) {
    out.logprobs.push_back(
        TokenLogprob(std::span<const float>(logits).subspan(r * vocab, vocab), out.tokens[r]));
  }
  return out;
}

absl::Status CudaModelSlice::Prepare(const MicroBatch& batch) { return PrepareBatch(batch, {}); }

absl::Status CudaModelSlice::PrepareBatch(const MicroBatch& batch,
                                          std::span<const TokenFeed> feeds) {
  prepared_.reset();
  prepared_batch_ = nullptr;
  PlanPtr plan(new Plan());
  RS_RETURN_IF_ERROR(PreparePlan(batch, plan.get(), feeds));
  RS_RETURN_IF_ERROR(activations_->Resize(batch.TotalTokens()));
  prepared_ = std::move(plan);
  prepared_batch_ = &batch;
  return absl::OkStatus();
}

absl::StatusOr<CudaModelSlice::PlanPtr> CudaModelSlice::TakePreparedPlan(const MicroBatch& batch) {
  if (prepared_ != nullptr && prepared_batch_ == &batch) {
    prepared_batch_ = nullptr;
    return std::move(prepared_);
  }
  RS_RETURN_IF_ERROR(Prepare(batch));
  prepared_batch_ = nullptr;
  return std::move(prepared_);
}

absl::Status CudaModelSlice::Run(const MicroBatch& batch) {
  ran_.reset();
  ran_batch_ = nullptr;
  RS_ASSIGN_OR_RETURN(PlanPtr plan, TakePreparedPlan(batch));
  RS_RETURN_IF_ERROR(Launch(*plan));
  last_run_tokens_ = plan->real_tokens;
  if (is_last()) {
    ran_ = std::move(plan);
    ran_batch_ = &batch;
  }
  return absl::OkStatus();
}

absl::StatusOr<CudaModelSlice::PlanPtr> CudaModelSlice::TakeRunPlan(
    const MicroBatch& batch, std::span<const RowSampling> rows, const char* caller) {
  if (!is_last())
    return absl::FailedPreconditionError(fmt::format("{} needs the last slice", caller));
  for (size_t r = 0; r < rows.size(); ++r) {
    const absl::Status valid = ValidateSamplingConfig(rows[r].config);
    if (!valid.ok()) {
      return absl::InvalidArgumentError(fmt::format("row {}: {}", r, std::string(valid.message())));
    }
  }
  if (ran_ == nullptr || ran_batch_ != &batch) {
    return absl::FailedPreconditionError(
        fmt::format("{}: no Run of this micro-batch before", caller));
  }
  ran_batch_ = nullptr;
  return std::move(ran_);
}

absl::StatusOr<SampledRows> CudaModelSlice::Sample(const MicroBatch& batch,
                                                   std::span<const RowSampling> rows) {
  RS_ASSIGN_OR_RETURN(const PlanPtr plan, TakeRunPlan(batch, rows, "Sample"));
  return SampleAfterRun(batch, *plan, rows);
}

absl::StatusOr<std::vector<float>> CudaModelSlice::LogitsToHost() {
  if (!is_last() || ran_ == nullptr) {
    return absl::FailedPreconditionError("LogitsToHost: needs the last slice after a Run");
  }
  if (samples_in_flight_ > 0) {
    return absl::FailedPreconditionError("LogitsToHost: an asynchronous sampling is in flight");
  }
  const Plan& plan = *ran_;
  const int64_t vocab = config_.vocab_size;
  std::vector<float> out(plan.output_rows.size() * vocab);
  RS_CUDA_RETURN_IF_ERROR(cudaSetDevice(cuda_.device));
  if (plan.logit_rows > cuda_.max_logit_rows) {
    // Enqueue left the normed rows: the lm_head runs in passes of max_logit_rows gathered rows,
    // each pass's logits copied out before the next overwrites them (stream order).
    const int64_t pass = cuda_.max_logit_rows;
    for (int64_t first = 0; first < plan.logit_rows; first += pass) {
      const int rows = static_cast<int>(std::min<int64_t>(pass, plan.logit_rows - first));
      RS_RETURN_IF_ERROR(
          LaunchGatherRows(normed_.as<bf16>(), meta_.as<int32_t>() + plan.gather + first,
                           gathered_.as<bf16>(), rows, config_.hidden_size, stream_));
      RS_RETURN_IF_ERROR(gemm_->Linear(gathered_.as<bf16>(), lm_head_, logits_.get(), OutType::kF32,
                                       rows, config_.vocab_size, config_.hidden_size, stream_));
      RS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(out.data() + first * vocab, logits_.get(),
                                              rows * vocab * sizeof(float), cudaMemcpyDeviceToHost,
                                              stream_));
    }
    RS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    return out;
  }
  for (size_t r = 0; r < plan.output_rows.size(); ++r) {
    RS_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(out.data() + r * vocab, logits_.as<float>() + plan.output_rows[r] * vocab,
                        vocab * sizeof(float), cudaMemcpyDeviceToHost, stream_));
  }
  RS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return out;
}

}  // namespace ringserve::cuda
