// The CUDA slice's MTP layer forward (cuda_mtp_layer.h): h' = eh_proj([enorm(Emb(t));
// hnorm(h)]), the MTP decoder block with the slice's MLA attention (its own layer of the latent
// pool) and its dense MLP or MoE block, then shared_head.norm and the head on the rows asked.
// The block runs on the MTP's own residual and normed buffers; the attention's scratch and the
// slice's proj_/gate_up_/act_/gathered_ (written before read by every forward) are shared.
#include <algorithm>

#include "absl/status/status.h"
#include "common/status_macros.h"
#include "fmt/format.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/sampling.h"
#include "stage/cuda/cuda_model_slice.h"
#include "stage/model/micro_batch_check.h"

namespace ringserve::cuda {

absl::Status CudaModelSlice::StoreMtpHidden(int run_row, int count, int store_row) {
  if (mtp_ == nullptr) return absl::FailedPreconditionError("StoreMtpHidden: no MTP layer");
  if (count <= 0) return absl::OkStatus();
  if (run_row < 0 || run_row + count > last_run_tokens_ || store_row < 0 ||
      store_row + count > cuda_.mtp_store_rows) {
    return absl::InvalidArgumentError(fmt::format(
        "StoreMtpHidden: rows [{}, {}) of a run of {} to store rows [{}, {}) of {}", run_row,
        run_row + count, last_run_tokens_, store_row, store_row + count, cuda_.mtp_store_rows));
  }
  const int64_t row_bytes = int64_t{config_.hidden_size} * 2;
  RS_CUDA_RETURN_IF_ERROR(cudaSetDevice(cuda_.device));
  RS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(mtp_store_.as<char>() + store_row * row_bytes,
                                          normed_.as<char>() + run_row * row_bytes,
                                          count * row_bytes, cudaMemcpyDeviceToDevice, stream_));
  return absl::OkStatus();
}

absl::StatusOr<int> CudaModelSlice::RunMtp(const MicroBatch& batch,
                                           std::span<const int32_t> hidden_rows, MtpSource source) {
  if (mtp_ == nullptr) return absl::FailedPreconditionError("RunMtp: the slice has no MTP layer");
  const ModelConfig& c = config_;
  RS_RETURN_IF_ERROR(ValidateMicroBatch(batch, {},
                                        {.max_positions = cuda_.max_model_len,
                                         .max_positions_name = "max_model_len",
                                         .kv_block_size = options_.kv_block_size,
                                         .kv_num_blocks = options_.kv_num_blocks,
                                         .vocab_size = c.vocab_size,
                                         .hidden_size = c.hidden_size,
                                         .is_first = true}));
  const int t = static_cast<int>(batch.TotalTokens());
  const int n = static_cast<int>(batch.chunks.size());
  int rows = 0;
  int max_end = 0;
  for (const SequenceChunk& chunk : batch.chunks) {
    if (chunk.logits == LogitsMode::kAllTokens) rows += chunk.num_tokens;
    if (chunk.logits == LogitsMode::kLastToken) rows += 1;
    max_end = std::max(max_end, chunk.start_position + chunk.num_tokens);
  }
  if (t > cuda_.max_batch_tokens || n > cuda_.max_seqs || rows > cuda_.max_logit_rows) {
    return absl::InvalidArgumentError(fmt::format(
        "RunMtp: {} tokens, {} chunks, {} logits rows exceed the slice's capacity ({}, {}, {})", t,
        n, rows, cuda_.max_batch_tokens, cuda_.max_seqs, cuda_.max_logit_rows));
  }
  const int limit = source == MtpSource::kStore ? cuda_.mtp_store_rows : last_run_tokens_;
  if (static_cast<int>(hidden_rows.size()) != t) {
    return absl::InvalidArgumentError(
        fmt::format("RunMtp: {} hidden rows for {} tokens", hidden_rows.size(), t));
  }
  for (int32_t r : hidden_rows) {
    if (r < 0 || r >= limit) {
      return absl::InvalidArgumentError(
          fmt::format("RunMtp: hidden row {} outside [0, {})", r, limit));
    }
  }
  const int bs = options_.kv_block_size;
  const int stride = std::max(1, (max_end + bs - 1) / bs);
  // Metadata: ids, positions, slots, context lengths, table rows, hidden rows [t]; the logits
  // rows' gather [rows]; block tables [n, stride].
  std::vector<int32_t>& m = mtp_meta_host_;
  const int64_t ids = 0, positions = t, slots = 2 * t, ctx = 3 * t, table_rows = 4 * t,
                hidden = 5 * t, gather = 6 * t, tables = 6 * t + rows;
  const int64_t size = tables + int64_t{n} * stride;
  if (size > mtp_meta_capacity_) {
    return absl::InternalError("RunMtp: metadata exceeds its buffer");
  }
  m.assign(size, 0);
  int row = 0, out = 0;
  for (int ci = 0; ci < n; ++ci) {
    const SequenceChunk& chunk = batch.chunks[ci];
    for (int i = 0; i < chunk.num_tokens; ++i) {
      const int pos = chunk.start_position + i;
      m[ids + row + i] = batch.token_ids[row + i];
      m[positions + row + i] = pos;
      m[slots + row + i] = chunk.block_table[pos / bs] * bs + pos % bs;
      m[ctx + row + i] = pos + 1;
      m[table_rows + row + i] = ci;
      m[hidden + row + i] = hidden_rows[row + i];
    }
    if (chunk.logits == LogitsMode::kAllTokens) {
      for (int i = 0; i < chunk.num_tokens; ++i) m[gather + out++] = row + i;
    } else if (chunk.logits == LogitsMode::kLastToken) {
      m[gather + out++] = row + chunk.num_tokens - 1;
    }
    const int count = std::min(static_cast<int>(chunk.block_table.size()), stride);
    std::copy_n(chunk.block_table.begin(), count, m.begin() + tables + int64_t{ci} * stride);
    row += chunk.num_tokens;
  }
  RS_CUDA_RETURN_IF_ERROR(cudaSetDevice(cuda_.device));
  RS_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(mtp_meta_.get(), m.data(), size * 4, cudaMemcpyHostToDevice, stream_));
  const int32_t* dm = mtp_meta_.as<int32_t>();

  const int h = c.hidden_size, inter = c.intermediate_size;
  const float eps = c.rms_norm_eps;
  const CudaMtpLayer::Weights& w = mtp_->weights();
  float* x = mtp_x_.as<float>();
  bf16* in = mtp_in_.as<bf16>();
  bf16* normed = mtp_normed_.as<bf16>();
  const size_t row_bytes = size_t{2} * h;
  // hnorm(h_p) into the right half of [enorm(Emb(t)); hnorm(h_p)].
  const bf16* src = source == MtpSource::kStore ? mtp_store_.as<bf16>() : normed_.as<bf16>();
  RS_RETURN_IF_ERROR(LaunchGatherRows(src, dm + hidden, normed, t, h, stream_));
  RS_RETURN_IF_ERROR(LaunchBF16ToF32(normed, x, int64_t{t} * h, stream_));
  RS_RETURN_IF_ERROR(LaunchAddRmsNorm(x, nullptr, nullptr, w.hnorm, normed, t, h, eps, stream_));
  RS_CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(in + h, 2 * row_bytes, normed, row_bytes, row_bytes, t,
                                            cudaMemcpyDeviceToDevice, stream_));
  RS_RETURN_IF_ERROR(LaunchEmbedding(w.embedding, dm + ids, x, t, h, stream_));
  RS_RETURN_IF_ERROR(LaunchAddRmsNorm(x, nullptr, nullptr, w.enorm, normed, t, h, eps, stream_));
  RS_CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(in, 2 * row_bytes, normed, row_bytes, row_bytes, t,
                                            cudaMemcpyDeviceToDevice, stream_));
  RS_RETURN_IF_ERROR(gemm_->Linear(in, w.eh_proj, x, OutType::kF32, t, h, 2 * h, stream_));

  // The decoder block on its own layer of the latent pool (after the slice's layers).
  const int kv_layer = options_.layers.size();
  const MlaCacheLayer cache{.data = kv_buffer_.as<bf16>() + 2 * kv_layer * kv_layer_elems_,
                            .block_stride = int64_t{bs} * kMlaRowDim,
                            .block_size = bs};
  RS_RETURN_IF_ERROR(
      LaunchAddRmsNorm(x, nullptr, nullptr, w.input_norm, normed, t, h, eps, stream_));
  RS_RETURN_IF_ERROR(mla_attention_->Forward(mtp_->attention().weights(), cache,
                                             {.positions = dm + positions,
                                              .slots = dm + slots,
                                              .context_lens = dm + ctx,
                                              .table_rows = dm + table_rows,
                                              .block_tables = dm + tables,
                                              .max_blocks = stride,
                                              .num_tokens = t,
                                              .max_context = max_end},
                                             inv_freq_.as<float>(), normed, proj_.as<bf16>(),
                                             *gemm_, stream_));
  RS_RETURN_IF_ERROR(
      LaunchAddRmsNorm(x, proj_.as<bf16>(), nullptr, w.post_norm, normed, t, h, eps, stream_));
  const bf16* pending = nullptr;
  if (mtp_->moe() != nullptr) {
    RS_RETURN_IF_ERROR(mtp_->moe()->Forward(normed, t, x, nullptr, *moe_ws_, -1, stream_));
  } else {
    RS_RETURN_IF_ERROR(
        gemm_->Linear(normed, w.gate_up, gate_up_.get(), OutType::kBF16, t, 2 * inter, h, stream_));
    RS_RETURN_IF_ERROR(LaunchSiluMul(gate_up_.as<bf16>(), act_.as<bf16>(), t, inter, stream_));
    RS_RETURN_IF_ERROR(
        gemm_->Linear(act_.as<bf16>(), w.down, proj_.get(), OutType::kBF16, t, h, inter, stream_));
    pending = proj_.as<bf16>();
  }
  RS_RETURN_IF_ERROR(
      LaunchAddRmsNorm(x, pending, nullptr, w.head_norm, normed, t, h, eps, stream_));
  if (rows == 0) return 0;
  RS_RETURN_IF_ERROR(LaunchGatherRows(normed, dm + gather, gathered_.as<bf16>(), rows, h, stream_));
  RS_RETURN_IF_ERROR(gemm_->Linear(gathered_.as<bf16>(), w.head, logits_.get(), OutType::kF32, rows,
                                   c.vocab_size, h, stream_));
  return rows;
}

absl::StatusOr<CudaModelSlice::MtpOutputs> CudaModelSlice::MtpResults(
    int rows, std::span<const int> to_host) {
  if (mtp_ == nullptr) return absl::FailedPreconditionError("MtpResults: no MTP layer");
  if (samples_in_flight_ > 0) {
    return absl::FailedPreconditionError("MtpResults: an asynchronous sampling is in flight");
  }
  fed_rows_valid_ = false;  // tokens_ is overwritten
  if (rows < 0 || rows > cuda_.max_logit_rows) {
    return absl::InvalidArgumentError(fmt::format("MtpResults: {} rows", rows));
  }
  const int64_t vocab = config_.vocab_size;
  MtpOutputs out;
  out.logits.resize(to_host.size() * vocab);
  RS_CUDA_RETURN_IF_ERROR(cudaSetDevice(cuda_.device));
  if (rows > 0) {
    auto* params = static_cast<GpuRowSampling*>(sample_host_);
    auto* tokens = reinterpret_cast<int32_t*>(params + SampleRowsCapacity());
    for (int r = 0; r < rows; ++r) params[r] = GpuRowSampling{};  // temperature 0: argmax
    RS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(sample_params_.get(), params,
                                            rows * sizeof(GpuRowSampling), cudaMemcpyHostToDevice,
                                            stream_));
    RS_RETURN_IF_ERROR(LaunchSampleRows(logits_.as<float>(), rows, static_cast<int>(vocab),
                                        sample_params_.as<GpuRowSampling>(), tokens_.as<int32_t>(),
                                        nullptr, nullptr, 0, stream_));
    RS_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(tokens, tokens_.get(), rows * 4, cudaMemcpyDeviceToHost, stream_));
    for (size_t i = 0; i < to_host.size(); ++i) {
      if (to_host[i] < 0 || to_host[i] >= rows) {
        return absl::InvalidArgumentError(
            fmt::format("MtpResults: logits row {} of {}", to_host[i], rows));
      }
      RS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
          out.logits.data() + i * vocab, logits_.as<float>() + int64_t{to_host[i]} * vocab,
          vocab * sizeof(float), cudaMemcpyDeviceToHost, stream_));
    }
    RS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    out.argmax.assign(tokens, tokens + rows);
    return out;
  }
  if (!to_host.empty()) return absl::InvalidArgumentError("MtpResults: no logits rows");
  RS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return out;
}

}  // namespace ringserve::cuda
