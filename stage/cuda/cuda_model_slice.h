// The CUDA implementation of ModelSlice (stage/model/model_slice.h): bf16 weights and KV cache
// on one GPU, fp32 residual stream, the kernels of kernels/cuda, cuBLASLt GEMMs and CUDA graphs
// for decode steps.
//
// Its activation buffer is the residual stream on the GPU (DeviceActivationBuffer), so
// activations stay on the device between GPU channels, and the last slice samples its logits
// rows on the GPU: logits never leave the device. Beyond ModelSlice it reports memory. Weights are
// loaded tensor by tensor from the memory-mapped safetensors straight to the GPU (never the whole
// model in host memory); fp32/fp16 checkpoints are converted to bf16 on the GPU. The KV pool is
// sized from free device memory and a utilization fraction unless a block count is given.
//
// Decode micro-batches (every chunk has one token) replay a CUDA graph captured per (batch
// bucket, context bucket): the batch is padded to the bucket (padding rows write no KV and
// attend to nothing), the context bucket fixes the block-table stride and split-K count.
// Graphs are captured lazily on first use of a key.
//
// Not thread-safe: one caller runs micro-batches in order. Owns its device memory; the device
// is selected (cudaSetDevice) by Load/CreateRandom and by every call.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/cuda/cuda_utils.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/kernel_options.h"
#include "kernels/cuda/kernel_selector.h"
#include "kernels/cuda/rope.h"
#include "kernels/cuda/sampling.h"
#include "ring/model_config.h"
#include "stage/cuda/cuda_mla_attention.h"
#include "stage/cuda/cuda_mla_weights.h"
#include "stage/cuda/cuda_moe_layer.h"
#include "stage/cuda/cuda_mtp_layer.h"
#include "stage/cuda/cuda_quant_linear.h"
#include "stage/cuda/device_activation_buffer.h"
#include "stage/cuda/gpu_step_timer.h"
#include "stage/model/model_slice.h"

namespace ringserve::cuda {

struct CudaSliceOptions {
  int device = 0;
  // Size the KV pool from memory, after weights and activations are allocated (when false:
  // SliceOptions::kv_num_blocks). With device_share > 0 the slice may take that fraction of the
  // device's total memory for itself (weights + activations + KV; how several stage processes
  // share one GPU without racing each other's allocations); otherwise
  // memory_utilization * total minus what the whole device already uses. Either way never
  // more than what is free.
  bool kv_from_free_memory = false;
  double memory_utilization = 0.90;
  double device_share = 0;
  int max_batch_tokens = 8192;  // tokens per micro-batch (activation buffers)
  int max_seqs = 256;           // chunks per micro-batch
  int max_model_len = 0;        // positions per sequence; 0 = config.max_position_embeddings
  int max_logit_rows = 256;     // logits rows per lm_head pass (more rows run in several passes)
  bool use_cuda_graphs = true;
  int max_graph_batch = 128;  // decode batches above this run eagerly
  // Which kernels may run (kernels/cuda/kernel_options.h): the selector turns them, the device
  // and the build into the slice's KernelPlan at load time. Among them the decode fusions: at
  // GEMV sizes (tokens <= gemv_max_rows) each RMSNorm folds into the GEMV that reads it, each
  // residual add into the GEMV that produces it, and (no q/k norms) the attention input stage
  // into the q/k/v GEMV: three kernels fewer per layer; in other all-decode steps the attention
  // input stage folds into the decode attention kernel: one kernel fewer per layer.
  KernelOptions kernels{};
  // Sample the logits rows on the GPU (kernels/cuda/sampling.h; the CPU sampler's contract) in
  // Sample; when false they are copied back and sampled on the host.
  bool gpu_sampling = true;
  // CreateRandom only: hold the linear layers quantized ("int4", "int8", "fp8", "fp4";
  // cuda_quant_linear.h), and the routed experts of MoE layers (cuda_moe_layer.h), with random
  // codes, scales per row and group of random_quant_group columns; empty: bf16.
  std::string random_quant = "";
  int random_quant_group = 128;
  // A last slice of a DeepSeek checkpoint with an MTP layer (model.layers.{num_layers}.*) loads
  // it for drafting (CudaMtpLayer; RunMtp): its weights, one more layer of the latent KV pool
  // and mtp_store_rows rows of hidden states (bf16) kept between steps by the drafter.
  bool load_mtp = false;
  int mtp_store_rows = 256 * 20;
};

struct CudaMemoryReport {
  int64_t weight_bytes = 0;        // bf16 weights and the quantized linear layers (below)
  int64_t quant_weight_bytes = 0;  // the quantized linear layers' codes and scales
  // Of weight_bytes: MoE experts (and shared experts) the checkpoint stores quantized, held
  // dequantized in bf16 (quantized experts run as bf16 experts on CUDA).
  int64_t dequantized_expert_bytes = 0;
  // Of weight_bytes: routed experts held quantized (codes and scales; cuda_moe_layer.h).
  int64_t quantized_expert_bytes = 0;
  int64_t kv_bytes = 0;
  int64_t activation_bytes = 0;  // activations, metadata, workspaces
  int64_t device_free_bytes = 0;
  int64_t device_total_bytes = 0;
  int kv_num_blocks = 0;
};

class CudaModelSlice : public ModelSlice {
 public:
  // Loads config.json and the slice's tensors from options.model_dir. InvalidArgument for a bad
  // range, options or an unsupported model; ResourceExhausted when it does not fit.
  static absl::StatusOr<std::unique_ptr<CudaModelSlice>> Load(const SliceOptions& options,
                                                              const CudaSliceOptions& cuda);
  // Random bf16 weights in the shape of `config` (benchmarks; no checkpoint needed).
  // options.model_dir is ignored.
  static absl::StatusOr<std::unique_ptr<CudaModelSlice>> CreateRandom(const ModelConfig& config,
                                                                      const SliceOptions& options,
                                                                      const CudaSliceOptions& cuda,
                                                                      uint64_t seed);
  ~CudaModelSlice() override;

  const ModelConfig& config() const override { return config_; }
  const SliceOptions& options() const override { return options_; }

  // A device buffer (DeviceActivationBuffer) over the residual stream: capacity
  // cuda_options().max_batch_tokens tokens on cuda_options().device, ordered on the slice's
  // stream.
  ActivationBuffer& activations() override { return *activations_; }
  const ActivationBuffer& activations() const override { return *activations_; }
  // Validates `batch`, builds its plan and enqueues its metadata upload, so that Run only
  // launches.
  absl::Status Prepare(const MicroBatch& batch) override;
  // Enqueues the forward pass on the stream (a decode graph when it has one); not synchronized.
  absl::Status Run(const MicroBatch& batch) override;
  // Samples on the GPU (or on the host with cuda_options().gpu_sampling false); returns when
  // the tokens are on the host.
  absl::StatusOr<SampledRows> Sample(const MicroBatch& batch,
                                     std::span<const RowSampling> rows) override;
  absl::StatusOr<std::vector<float>> LogitsToHost() override;
  // Sampling left in flight and the next step fed on the device (ModelSlice's contract;
  // cuda_async_sample.cc): pinned staging in kMaxSamplesInFlight slots, an event per slot.
  bool can_sample_async() const override { return is_first() && is_last() && cuda_.gpu_sampling; }
  absl::Status SampleAsync(const MicroBatch& batch, std::span<const RowSampling> rows) override;
  bool SampleReady() override;
  absl::StatusOr<SampledRows> WaitSample() override;
  absl::Status PrepareFed(const MicroBatch& batch, std::span<const TokenFeed> feeds) override;
  // GPU time (GpuStepTimer on the slice's stream).
  void BeginStepTiming() override { step_timer_.Begin(stream_); }
  void EndStepTiming() override { step_timer_.End(stream_); }
  int64_t TakeStepMicros() override { return step_timer_.TakeCompletedMicros(); }

  CudaMemoryReport memory() const;
  const CudaSliceOptions& cuda_options() const { return cuda_; }
  // Number of decode graphs captured so far.
  int num_graphs() const { return static_cast<int>(graphs_.size()); }
  GemmRunner& gemm() { return *gemm_; }
  // The kernels this slice runs (chosen at load time from cuda_options().kernels).
  const KernelPlan& kernel_plan() const { return kernels_; }
  // Chooses the kernels again for new options (an A/B inside one process: stage_bench): drops
  // the captured graphs and, when the GEMM options change, the GEMM plans (allocating or freeing
  // the skinny GEMM's workspace).
  // InvalidArgument for bad options (the slice keeps its kernels).
  absl::Status ReselectKernels(const KernelOptions& options);
  // Drops the captured graphs, and turns graphs on/off.
  void ResetGraphs();
  void set_use_cuda_graphs(bool use) { cuda_.use_cuda_graphs = use; }
  // The MoE layers' step buffers (null for a dense model): experts_touched() per local layer.
  const CudaMoeWorkspace* moe_workspace() const { return moe_ws_.get(); }

  // DeepSeek's MTP layer (cuda_mtp_forward.cc), loaded with cuda_options().load_mtp by a last
  // slice whose checkpoint has one; else null. Its weights count in memory().weight_bytes, its
  // latent cache (the sequences' blocks, one more layer of the KV pool) in kv_bytes, its hidden
  // store and input buffers in activation_bytes.
  const CudaMtpLayer* mtp() const { return mtp_.get(); }
  // Rows of the MTP hidden store: h_p rows (bf16, after model.norm) the drafter keeps.
  int mtp_store_rows() const { return mtp_ ? cuda_.mtp_store_rows : 0; }
  // After Run of this last slice: copies rows [run_row, run_row + count) of that batch's final
  // hidden states (after model.norm: what lm_head read) to store rows [store_row, + count).
  // Enqueued on the slice's stream. InvalidArgument for rows out of range.
  absl::Status StoreMtpHidden(int run_row, int count, int store_row);
  enum class MtpSource { kStore, kLastRun };
  // The MTP layer on `batch`, laid out as CpuMtpLayer::Forward's: the chunks' positions p and
  // block tables (the sequences' main blocks), token_ids[r] = t_{p+1} of row r, whose h_p is
  // row hidden_rows[r] of `source` (the store, or the last Run's final hidden states). At most
  // cuda_options().max_batch_tokens tokens, max_seqs chunks and max_logit_rows logits rows.
  // Writes the MTP block's latent cache and leaves the logits rows the chunks' LogitsMode ask in
  // the slice's logits buffer, overwriting the last Run's: call it after Sample / LogitsToHost.
  // Enqueued; returns the number of logits rows. FailedPrecondition without an MTP layer.
  absl::StatusOr<int> RunMtp(const MicroBatch& batch, std::span<const int32_t> hidden_rows,
                             MtpSource source);
  struct MtpOutputs {
    std::vector<int32_t> argmax;  // [rows]: each logits row's greedy token
    std::vector<float> logits;    // [to_host.size(), vocab]
  };
  // After RunMtp of `rows` logits rows: their argmax (on the GPU) and the logits rows `to_host`.
  // Synchronizes the stream.
  absl::StatusOr<MtpOutputs> MtpResults(int rows, std::span<const int> to_host);

 private:
  struct LayerWeights {
    bf16* input_norm = nullptr;
    bf16* qkv = nullptr;  // [(heads + 2 kv_heads) * head_dim, hidden]
    bf16* qkv_bias = nullptr;
    bf16* q_norm = nullptr;
    bf16* k_norm = nullptr;
    bf16* o = nullptr;  // [hidden, heads * head_dim]
    bf16* o_bias = nullptr;
    bf16* post_norm = nullptr;
    bf16* gate_up = nullptr;  // [2 * intermediate, hidden]; null on a MoE layer
    bf16* down = nullptr;     // [hidden, intermediate]; null on a MoE layer
    float* sinks = nullptr;   // [num_heads] fp32 (gpt-oss) or null
  };
  struct Plan;  // one micro-batch's layout (cuda_model_slice.cc)
  struct Graph {
    cudaGraphExec_t exec = nullptr;
  };

  CudaModelSlice() = default;
  absl::Status Init(const ModelConfig& config, const SliceOptions& options,
                    const CudaSliceOptions& cuda);
  absl::Status AllocateWeights();
  absl::Status LoadWeights();
  absl::Status RandomizeWeights(uint64_t seed);
  absl::Status AllocateRuntime();
  // `hidden_in` null = the input is resident in residual_ (always, since the activation
  // buffer is residual_).
  absl::Status Validate(const MicroBatch& batch, const std::span<const float>* hidden_in) const;
  absl::Status BuildPlan(const MicroBatch& batch, Plan* plan);
  struct PlanDeleter {
    void operator()(Plan* plan) const;
  };
  using PlanPtr = std::unique_ptr<Plan, PlanDeleter>;
  // Validates `batch`, builds its plan and enqueues the metadata upload; then, for each feed,
  // the token id from the device output of the newest sampling (fed_rows_ maps its rows).
  absl::Status PreparePlan(const MicroBatch& batch, Plan* plan, std::span<const TokenFeed> feeds);
  // Prepare with feeds (none: Prepare).
  absl::Status PrepareBatch(const MicroBatch& batch, std::span<const TokenFeed> feeds);
  // Enqueues the forward pass of a prepared plan (a decode graph when it has one); leaves the
  // logits (last slice) or the complete residual in device buffers.
  absl::Status Launch(const Plan& plan);
  // The plan Prepare made for `batch`, or a fresh one.
  absl::StatusOr<PlanPtr> TakePreparedPlan(const MicroBatch& batch);
  // Samples the logits rows left by Launch (on the host when gpu_sampling is off).
  absl::StatusOr<SampledRows> SampleAfterRun(const MicroBatch& batch, const Plan& plan,
                                             std::span<const RowSampling> rows);
  // Sample's checks, then the plan of the last Run of `batch` (taken: one sampling per Run).
  absl::StatusOr<PlanPtr> TakeRunPlan(const MicroBatch& batch, std::span<const RowSampling> rows,
                                      const char* caller);
  // GPU sampling into the next free slot (parameters up, the sampling kernel, tokens and
  // log-probabilities back, the slot's event), and the oldest slot's rows once on the host.
  absl::Status EnqueueGpuSample(const Plan& plan, std::span<const RowSampling> rows);
  absl::StatusOr<SampledRows> CollectOldestSample();
  absl::Status Enqueue(const Plan& plan);
  // Tunes the GEMM shapes of a decode step of plan.tokens rows (GemmRunner::Tune, on layer 0's
  // weights; writes only buffers the step itself writes before reading). Before a capture.
  absl::Status TuneGemms(const Plan& plan);
  // One decoder layer, with the plan's StepKernels (kernel_selector.h); without fused norms it
  // leaves its MLP output in proj_ for the next layer's (or the slice's final) add.
  absl::Status RunLayer(int layer, const Plan& plan);
  // The layer's input norm, q/k/v projection, q/k rotation and K/V store (into q_ and `cache`;
  // the store in the GEMV or left to the attention kernel as the StepKernels say).
  absl::Status RunQkv(int layer, const Plan& plan, const KvCacheLayer& cache);
  absl::Status RunAttention(int layer, const Plan& plan, const KvCacheLayer& cache);
  // A DeepSeek layer (cuda_mla_forward.cc): input norm, multi-head latent attention over the
  // compressed cache, post-attention norm and the dense MLP or MoE block; leaves the MLP output
  // in proj_ as RunLayer does without fused norms.
  absl::Status RunMlaLayer(int layer, const CudaMlaTokens& tokens);
  // The MLA weights and the attention with its scratch (AllocateWeights), and the GEMM shapes of
  // an MLA decode step (TuneGemms).
  absl::Status AllocateMlaWeights();
  absl::Status TuneMlaGemms(int tokens);
  // A MoE layer's post-attention norm and MoE block (moe_[layer]), in place of the dense MLP.
  absl::Status RunMoeMlp(int layer, const Plan& plan);
  // Dense weights (bf16 and quantized) plus every MoE layer's.
  int64_t WeightBytes() const;
  // Layers of the KV pool: the slice's, plus the MTP layer's.
  int KvLayers() const { return options_.layers.size() + (mtp_ ? 1 : 0); }
  // y = x · W^T for the layer's linear `which` (quantized, or its bf16 `w`).
  absl::Status RunLinear(int layer, LayerLinear which, const bf16* x, const bf16* w, void* y, int m,
                         int n, int k);
  // Logits rows one sampling call handles, and the pinned staging for them.
  int64_t SampleRowsCapacity() const {
    return std::max(cuda_.max_logit_rows, cuda_.max_graph_batch);
  }
  int64_t SampleHostBytes() const {
    return SampleRowsCapacity() * static_cast<int64_t>(sizeof(GpuRowSampling) + 8);
  }

  ModelConfig config_;
  SliceOptions options_;
  CudaSliceOptions cuda_;
  // Carries the plan's dependent_launch to the launchers.
  LaunchStream stream_;
  std::unique_ptr<GemmRunner> gemm_;
  KernelPlan kernels_;
  int max_blocks_per_seq_ = 0;

  DeviceBuffer weight_buffer_;
  // The linear layers held quantized (a layer's bf16 pointer is then null).
  QuantLinears quant_;
  std::vector<LayerWeights> layers_;
  std::vector<std::unique_ptr<CudaMoeLayer>> moe_;  // [layers]: null on dense layers
  std::unique_ptr<CudaMoeWorkspace> moe_ws_;        // when any layer is a MoE layer
  // DeepSeek (config.mla): every layer's MLA weights, and one attention (its scratch) for all.
  std::vector<std::unique_ptr<CudaMlaLayerWeights>> mla_;
  std::unique_ptr<CudaMlaAttention> mla_attention_;
  // The MTP layer and its buffers: the hidden store [mtp_store_rows, hidden] bf16, its
  // residual [max_batch_tokens, hidden] fp32, the eh_proj input [max_batch_tokens, 2 hidden]
  // bf16, a normed row buffer [max_batch_tokens, hidden] bf16 and its metadata.
  std::unique_ptr<CudaMtpLayer> mtp_;
  DeviceBuffer mtp_store_, mtp_x_, mtp_in_, mtp_normed_, mtp_meta_;
  std::vector<int32_t> mtp_meta_host_;
  int64_t mtp_meta_capacity_ = 0;  // int32 elements
  int last_run_tokens_ = 0;        // real rows of the last Run (RunMtp's kLastRun)
  bf16* embedding_ = nullptr;
  bf16* final_norm_ = nullptr;
  bf16* lm_head_ = nullptr;
  DeviceBuffer inv_freq_;
  DeviceBuffer kv_buffer_;      // bf16, or e4m3 codes (options_.kv_cache_dtype)
  int64_t kv_layer_elems_ = 0;  // per layer, K (V the same)
  // An e4m3 cache's per-layer K and V scales (stage/model/kv_cache_scales.h); 1.0 otherwise.
  std::vector<float> kv_k_scales_, kv_v_scales_;

  // Activations [max_batch_tokens, ...] and metadata.
  DeviceBuffer residual_, normed_, qkv_, q_, attn_, proj_, gate_up_, act_, gathered_, logits_,
      tokens_, meta_, decode_ws_, decode_tickets_, sample_params_, logprobs_;
  // Pinned staging for sampling, kMaxSamplesInFlight slots of SampleHostBytes(): each
  // GpuRowSampling [rows] in, tokens and logprobs [rows] out (the MTP drafter uses slot 0's).
  void* sample_host_ = nullptr;
  struct SampleSlot {
    GpuRowSampling* params = nullptr;
    int32_t* tokens = nullptr;
    float* logprobs = nullptr;
    cudaEvent_t copied = nullptr;  // recorded after the copies back
    std::vector<int> output_rows;  // the plan's logits row of each sampled row
  };
  SampleSlot sample_slots_[kMaxSamplesInFlight];
  int oldest_sample_ = 0;      // slot index
  int samples_in_flight_ = 0;  // enqueued, not yet collected
  // The newest SampleAsync's output_rows (rows of tokens_), while tokens_ still holds them.
  std::vector<int> fed_rows_;
  bool fed_rows_valid_ = false;
  int32_t* meta_host_ = nullptr;  // pinned, same capacity as meta_
  // Recorded after each upload from meta_host_: the next plan waits for it before writing
  // meta_host_ again (a stage that is not last returns before its stream has run).
  cudaEvent_t meta_uploaded_ = nullptr;
  int64_t meta_capacity_ = 0;  // int32 elements
  int64_t activation_bytes_ = 0;
  int64_t dequantized_expert_bytes_ = 0;  // CudaMemoryReport::dequantized_expert_bytes
  int64_t quantized_expert_bytes_ = 0;    // CudaMemoryReport::quantized_expert_bytes

  std::map<std::pair<int, int>, Graph> graphs_;
  std::unique_ptr<DeviceActivationBuffer> activations_;  // over residual_
  PlanPtr prepared_;                                     // Prepare's plan, for prepared_batch_
  GpuStepTimer step_timer_;
  const MicroBatch* prepared_batch_ = nullptr;
  PlanPtr ran_;  // the last slice's plan of the last Run, for ran_batch_ (Sample, LogitsToHost)
  const MicroBatch* ran_batch_ = nullptr;
};

}  // namespace ringserve::cuda
