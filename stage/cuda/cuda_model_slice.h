// The CUDA implementation of ModelSlice (stage/model/model_slice.h): bf16 weights and KV cache
// on one GPU, fp32 residual stream, the kernels of kernels/cuda, cuBLASLt GEMMs and CUDA graphs
// for decode steps.
//
// Beyond the host-vector ModelSlice interface it offers ForwardSample (the last slice returns
// token ids, sampled on the GPU when greedy, so logits never leave the device) and memory
// reporting. Weights are loaded tensor by tensor from the memory-mapped safetensors straight to
// the GPU (never the whole model in host memory); fp32/fp16 checkpoints are converted to bf16
// on the GPU. The KV pool is sized from free device memory and a utilization fraction unless a
// block count is given.
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
#include "kernels/cuda/rope.h"
#include "kernels/cuda/sampling.h"
#include "stage/cuda/gpu_step_timer.h"
#include "ring/model_config.h"
#include "stage/model/model_slice.h"
#include "stage/model/resident_slice.h"
#include "stage/sampling/sampler.h"

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
  // GemmOptions::gemv_max_rows. Measured on H200: our GEMV wins only at m = 1 (cuBLASLt is
  // about 2x faster from m = 4 on).
  int gemv_max_rows = 1;
  // Decode fusions. At GEMV sizes (tokens <= gemv_max_rows), fold each RMSNorm into the GEMV
  // that reads it and each residual add into the GEMV that produces it, and (no q/k norms) the
  // attention input stage into the q/k/v GEMV (gemv.h): three kernels fewer per layer. In other
  // all-decode steps, fold the attention input stage into the decode attention kernel
  // (LaunchDecodeAttentionFromQkv, head dim 128, no q/k norms): one kernel fewer per layer.
  bool fuse_decode_kernels = true;
  // Sample the logits rows on the GPU (kernels/cuda/sampling.h; the CPU sampler's contract) in
  // SampleResident; when false they are copied back and sampled on the host.
  bool gpu_sampling = true;
};

struct CudaMemoryReport {
  int64_t weight_bytes = 0;
  int64_t kv_bytes = 0;
  int64_t activation_bytes = 0;  // activations, metadata, workspaces
  int64_t device_free_bytes = 0;
  int64_t device_total_bytes = 0;
  int kv_num_blocks = 0;
};

class CudaModelSlice : public ModelSlice, public ResidentSlice {
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

  // As ModelSlice::Forward: hidden_in/out fp32 host [tokens, hidden]; logits fp32 host.
  absl::StatusOr<std::vector<float>> Forward(const MicroBatch& batch,
                                             std::span<const float> hidden_in) override;
  // Last slice only: one token per logits row (rows as Forward's). Greedy rows are chosen on
  // the GPU (argmax); if any row samples, the logits are copied back and every row goes
  // through the CPU sampler (stage/sampling), so the seeded results are the same as there.
  // InvalidArgument if rows.size() differs from the logits row count.
  absl::StatusOr<std::vector<int32_t>> ForwardSample(const MicroBatch& batch,
                                                     std::span<const float> hidden_in,
                                                     std::span<const RowSampling> rows);

  // ResidentSlice (stage/model/resident_slice.h): device_hidden() is residual_; capacity
  // cuda_options().max_batch_tokens rows. SampleResident samples on the GPU (or on the host
  // with cuda_options().gpu_sampling false).
  float* device_hidden() override { return residual_.as<float>(); }
  GpuStream gpu_stream() override { return stream_; }
  int gpu_device() const override { return cuda_.device; }
  int max_batch_tokens() const override { return cuda_.max_batch_tokens; }
  absl::Status CopyHiddenIn(std::span<const float> hidden) override;
  absl::Status CopyHiddenOut(std::span<float> hidden) override;
  absl::Status PrepareResident(const MicroBatch& batch) override;
  absl::Status ForwardResident(const MicroBatch& batch) override;
  absl::StatusOr<SampledRows> SampleResident(const MicroBatch& batch,
                                             std::span<const RowSampling> rows) override;
  void BeginStepTiming() override { step_timer_.Begin(stream_); }
  void EndStepTiming() override { step_timer_.End(stream_); }
  int64_t TakeStepGpuMicros() override { return step_timer_.TakeCompletedMicros(); }

  CudaMemoryReport memory() const;
  const CudaSliceOptions& cuda_options() const { return cuda_; }
  // Number of decode graphs captured so far.
  int num_graphs() const { return static_cast<int>(graphs_.size()); }
  GemmRunner& gemm() { return *gemm_; }
  // Drops the captured graphs (e.g. after changing gemm() settings), and turns graphs on/off.
  void ResetGraphs();
  void set_use_cuda_graphs(bool use) { cuda_.use_cuda_graphs = use; }
  void set_fuse_decode_kernels(bool fuse) { cuda_.fuse_decode_kernels = fuse; }

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
    bf16* gate_up = nullptr;  // [2 * intermediate, hidden]
    bf16* down = nullptr;     // [hidden, intermediate]
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
  // `hidden_in` null = the input is resident in residual_ (ForwardResident).
  absl::Status Validate(const MicroBatch& batch, const std::span<const float>* hidden_in) const;
  absl::Status BuildPlan(const MicroBatch& batch, Plan* plan);
  // Runs the batch; leaves logits (last slice; tokens too when want_tokens) or the complete
  // residual in device buffers. The stream is not synchronized.
  struct PlanDeleter {
    void operator()(Plan* plan) const;
  };
  using PlanPtr = std::unique_ptr<Plan, PlanDeleter>;
  // Validates `batch`, builds its plan and enqueues the metadata upload (and the upload of a
  // host `hidden_in`; null = the input is resident in residual_).
  absl::Status Prepare(const MicroBatch& batch, const std::span<const float>* hidden_in,
                       Plan* plan);
  // Enqueues the forward pass of a prepared plan (a decode graph when it has one).
  absl::Status Launch(const Plan& plan, bool want_tokens);
  absl::Status Run(const MicroBatch& batch, const std::span<const float>* hidden_in,
                   bool want_tokens, Plan* plan);
  // The plan PrepareResident made for `batch`, or a fresh one.
  absl::StatusOr<PlanPtr> TakePreparedPlan(const MicroBatch& batch);
  // Samples the logits rows left by Run (on the host when any row samples).
  absl::StatusOr<SampledRows> SampleAfterRun(const MicroBatch& batch, const Plan& plan,
                                             std::span<const RowSampling> rows);
  absl::Status Enqueue(const Plan& plan, bool want_tokens);
  // Tunes the GEMM shapes of a decode step of plan.tokens rows (GemmRunner::Tune, on layer 0's
  // weights; writes only buffers the step itself writes before reading). Before a capture.
  absl::Status TuneGemms(const Plan& plan);
  // Whether RunLayer folds the norms and residual adds into its GEMVs (CudaSliceOptions::
  // fuse_decode_kernels); then no MLP output is left in proj_ after a layer.
  bool FusesNorms(const Plan& plan) const;
  // One decoder layer; without fused norms it leaves its MLP output in proj_ for the next
  // layer's (or the slice's final) add.
  absl::Status RunLayer(int layer, const Plan& plan);
  // The layer's input norm, q/k/v projection, q/k rotation and K/V store (into q_ and `cache`).
  absl::Status RunQkv(int layer, const Plan& plan, const KvCacheLayer& cache);
  // Where the attention input stage (bias, q/k rotation, K/V store) of layer `layer` runs when
  // it has no q/k norms: in the q/k/v GEMV (GEMV sizes with fused norms), in the decode
  // attention kernel (other all-decode steps, head dim 128 on tensor cores), else QKV prepare.
  bool GemvTakesQkvPrepare(int layer, const Plan& plan) const;
  bool AttentionTakesQkv(int layer, const Plan& plan) const;
  absl::Status RunAttention(int layer, const Plan& plan, const KvCacheLayer& cache);
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
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<GemmRunner> gemm_;
  int max_blocks_per_seq_ = 0;
  int num_sms_ = 132;           // of cuda_.device; sizes the decode attention split-K
  int prefill_tile_rows_ = 64;  // PrefillTileRows() of cuda_.device: the prefill kernel

  DeviceBuffer weight_buffer_;
  std::vector<LayerWeights> layers_;
  bf16* embedding_ = nullptr;
  bf16* final_norm_ = nullptr;
  bf16* lm_head_ = nullptr;
  DeviceBuffer inv_freq_;
  DeviceBuffer kv_buffer_;
  int64_t kv_layer_elems_ = 0;  // per layer, K (V the same)

  // Activations [max_batch_tokens, ...] and metadata.
  DeviceBuffer residual_, normed_, qkv_, q_, attn_, proj_, gate_up_, act_, gathered_, logits_,
      tokens_, meta_, decode_ws_, sample_params_, logprobs_;
  // Pinned staging for sampling: GpuRowSampling [rows] in, tokens and logprobs [rows] out.
  void* sample_host_ = nullptr;
  int32_t* meta_host_ = nullptr;  // pinned, same capacity as meta_
  // Recorded after each upload from meta_host_: the next plan waits for it before writing
  // meta_host_ again (a stage that is not last returns before its stream has run).
  cudaEvent_t meta_uploaded_ = nullptr;
  int64_t meta_capacity_ = 0;  // int32 elements
  int64_t activation_bytes_ = 0;

  std::map<std::pair<int, int>, Graph> graphs_;
  PlanPtr prepared_;  // PrepareResident's plan, for prepared_batch_
  GpuStepTimer step_timer_;
  const MicroBatch* prepared_batch_ = nullptr;
};

}  // namespace ringserve::cuda
