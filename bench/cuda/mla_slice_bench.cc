// mla_slice_bench: one pipeline stage of DeepSeek-V3 shape (layers 3-6 by default: all MoE, bf16,
// random weights made on the GPU) in the CUDA slice, decoding as a middle stage does (random
// hidden rows in, the residual out; CUDA graphs): step time at each (streams, context) against
// the bandwidth bound of the bytes the step really reads (attention and shared-expert weights,
// the router, the routed experts the step's tokens touched, and the compressed KV cache:
// streams x context x 1,152 bytes per layer). The bound uses the device-to-device copy
// bandwidth measured at start (and the datasheet figure beside it). Contexts are reached
// without prefill: each stream decodes at position context - 1 over blocks the pool holds
// (zero latents), which reads the same bytes as a filled cache. With --quant the routed experts
// are held quantized (random codes; fp8 with --quant_group 128 is DeepSeek-V3's own checkpoint
// format) and counted at their device bytes (codes and scales); attention and the shared expert
// stay bf16, as a quantized DeepSeek checkpoint loads.
//
//   mla_slice_bench [--first_layer 3 --layers 4] [--streams 1,32] [--contexts 128,32768]
//                   [--steps 20] [--datasheet_tbps 4.8] [--quant fp8 --quant_group 128]
//                   [--mla_kernel wgmma|mma]
#include <algorithm>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "bench/cuda/event_timer.h"
#include "bench/model/random_model.h"
#include "common/flags.h"
#include "common/status_macros.h"
#include "fmt/format.h"
#include "ring/model_config.h"
#include "stage/cuda/cuda_model_slice.h"

ABSL_FLAG(int, first_layer, 3, "first layer of the stage");
ABSL_FLAG(int, layers, 4, "layers of the stage (fewer are tried when they do not fit)");
ABSL_FLAG(std::vector<std::string>, streams, std::vector<std::string>({"1", "32"}),
          "decode streams per step");
ABSL_FLAG(std::vector<std::string>, contexts, std::vector<std::string>({"128", "32768"}),
          "context of every stream");
ABSL_FLAG(int, steps, 20, "timed decode steps per row");
ABSL_FLAG(double, datasheet_tbps, 4.8, "the device's datasheet HBM bandwidth, TB/s");
ABSL_FLAG(std::string, mla_kernel, "wgmma",
          "latent attention kernel: wgmma (compute capability 9.0 with sm_90a code; elsewhere "
          "mma.sync runs anyway) or mma");
ABSL_FLAG(std::string, quant, "", "int4, int8, fp8 or fp4: routed experts held so");
ABSL_FLAG(int, quant_group, 128, "columns per scale with --quant");

namespace ringserve::cuda {
namespace {

constexpr int kBlockSize = 16;

// Bytes a decode step reads per layer besides the routed experts and the cache.
double FixedLayerBytes(const ModelConfig& c) {
  const MlaConfig& m = *c.mla;
  const double h = c.hidden_size, heads = c.num_heads;
  double attn = m.latent_cache_dim() * h + m.kv_lora_rank +
                heads * (m.qk_nope_head_dim + m.v_head_dim) * m.kv_lora_rank +
                h * heads * m.v_head_dim;
  attn += m.q_lora_rank > 0 ? m.q_lora_rank * (h + 1 + heads * m.qk_head_dim())
                            : heads * m.qk_head_dim() * h;
  const double router = 4.0 * c.moe.router.num_experts * h;  // fp32 at decode sizes
  const double shared = 2.0 * 3 * h * c.moe.shared_intermediate_size;
  return 2 * attn + router + shared;
}

// One routed expert's bytes: bf16, or the quantized stacks' share (codes and scales).
double ExpertBytes(const ModelConfig& c, const CudaMemoryReport& mem, int moe_layers) {
  if (mem.quantized_expert_bytes > 0) {
    return static_cast<double>(mem.quantized_expert_bytes) /
           (static_cast<double>(moe_layers) * c.moe.router.num_experts);
  }
  return 2.0 * 3 * c.hidden_size * c.moe.expert_intermediate_size;
}

absl::StatusOr<double> CopyBandwidth() {
  const size_t n = size_t{1} << 30;
  DeviceBuffer a, b;
  RS_RETURN_IF_ERROR(a.Allocate(n));
  RS_RETURN_IF_ERROR(b.Allocate(n));
  const double ms =
      TimeMs([&] { return cudaMemcpyAsync(b.get(), a.get(), n, cudaMemcpyDeviceToDevice); }, 2, 10);
  return 2.0 * n / (ms * 1e-3);
}

absl::Status Run() {
  const int first = absl::GetFlag(FLAGS_first_layer);
  std::vector<int> streams, contexts;
  for (const std::string& s : absl::GetFlag(FLAGS_streams)) streams.push_back(std::stoi(s));
  for (const std::string& s : absl::GetFlag(FLAGS_contexts)) contexts.push_back(std::stoi(s));
  const int max_streams = *std::max_element(streams.begin(), streams.end());
  const int max_context = *std::max_element(contexts.begin(), contexts.end());
  const int blocks_per_seq = (max_context + kBlockSize - 1) / kBlockSize;
  RS_ASSIGN_OR_RETURN(const ModelShape shape, FindShape("deepseek-v3"));
  RS_ASSIGN_OR_RETURN(const ModelConfig config,
                      ParseModelConfig(ConfigJson(shape, DType::kBF16), "deepseek-v3"));
  RS_ASSIGN_OR_RETURN(const double copy_bw, CopyBandwidth());
  cudaDeviceProp prop{};
  RS_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, 0));
  fmt::print("device {}, {} SMs; d2d copy {:.2f} TB/s (read + write), datasheet {:.2f} TB/s\n",
             prop.name, prop.multiProcessorCount, copy_bw / 1e12,
             absl::GetFlag(FLAGS_datasheet_tbps));
  std::unique_ptr<CudaModelSlice> slice;
  int layers = absl::GetFlag(FLAGS_layers);
  for (; layers >= 1; --layers) {
    CudaSliceOptions cuda{.max_batch_tokens = std::max(64, max_streams),
                          .max_seqs = std::max(64, max_streams),
                          .max_model_len = max_context,
                          .random_quant = absl::GetFlag(FLAGS_quant),
                          .random_quant_group = absl::GetFlag(FLAGS_quant_group)};
    cuda.kernels.mla_decode_sm90 = absl::GetFlag(FLAGS_mla_kernel) == "wgmma";
    auto made = CudaModelSlice::CreateRandom(config,
                                             {.model_dir = "",
                                              .layers = {first, first + layers},
                                              .kv_block_size = kBlockSize,
                                              .kv_num_blocks = max_streams * blocks_per_seq + 1},
                                             cuda, /*seed=*/7);
    if (made.ok()) {
      slice = *std::move(made);
      break;
    }
    fmt::print("layers [{}, {}): {}\n", first, first + layers, made.status().ToString());
    if (made.status().code() != absl::StatusCode::kResourceExhausted &&
        made.status().message().find("out of memory") == std::string::npos) {
      return made.status();
    }
  }
  if (slice == nullptr) return absl::ResourceExhaustedError("not even one layer fits");
  fmt::print("latent attention kernel: {}\n",
             slice->kernel_plan().mla_decode == ringserve::cuda::MlaDecodeKernel::kWgmmaSm90
                 ? "wgmma"
                 : "mma.sync");
  const CudaMemoryReport mem = slice->memory();
  int moe_layers = 0;
  for (int l = first; l < first + layers; ++l) moe_layers += config.moe.IsMoeLayer(l) ? 1 : 0;
  const double expert_bytes = ExpertBytes(config, mem, std::max(1, moe_layers));
  fmt::print(
      "layers [{}, {}): weights {:.1f} GB (routed experts {}: {:.1f} GB), KV pool {:.2f} GB ({} "
      "bytes per token and layer)\n",
      first, first + layers, mem.weight_bytes / 1e9,
      absl::GetFlag(FLAGS_quant).empty() ? "bf16" : absl::GetFlag(FLAGS_quant),
      expert_bytes * moe_layers * config.moe.router.num_experts / 1e9, mem.kv_bytes / 1e9,
      config.kv_values_per_token_layer() * 2);
  const int h = config.hidden_size;
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> hidden(static_cast<size_t>(max_streams) * h);
  for (float& x : hidden) x = normal(rng);
  fmt::print("{:>8} {:>8} {:>10} {:>10} {:>9} {:>9} {:>11} {:>8} {:>8}\n", "streams", "context",
             "step ms", "tok/s", "GB read", "experts", "bound ms", "%copy", "%sheet");
  for (const int context : contexts) {
    for (const int s : streams) {
      MicroBatch batch;
      for (int i = 0; i < s; ++i) {
        std::vector<int32_t> table(blocks_per_seq);
        for (int b = 0; b < blocks_per_seq; ++b) table[b] = i * blocks_per_seq + b;
        batch.chunks.push_back({.seq_id = static_cast<uint64_t>(i + 1),
                                .start_position = context - 1,
                                .num_tokens = 1,
                                .block_table = std::move(table),
                                .logits = LogitsMode::kNone});
      }
      const std::span<const float> rows(hidden.data(), static_cast<size_t>(s) * h);
      double touched = 0;
      int64_t micros = 0;
      const int warmup = 3, steps = absl::GetFlag(FLAGS_steps);
      for (int step = 0; step < warmup + steps; ++step) {
        RS_RETURN_IF_ERROR(slice->Prepare(batch));
        RS_RETURN_IF_ERROR(slice->activations().CopyFromHost(rows));
        slice->BeginStepTiming();
        RS_RETURN_IF_ERROR(slice->Run(batch));
        slice->EndStepTiming();
        RS_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
        const int64_t us = slice->TakeStepMicros();
        if (step < warmup) continue;
        micros += us;
        const CudaMoeWorkspace* ws = slice->moe_workspace();
        if (ws != nullptr) {
          std::vector<int32_t> t(ws->num_layers());
          RS_CUDA_RETURN_IF_ERROR(
              cudaMemcpy(t.data(), ws->experts_touched(), t.size() * 4, cudaMemcpyDeviceToHost));
          for (int l = 0; l < layers; ++l) touched += config.moe.IsMoeLayer(first + l) ? t[l] : 0;
        }
      }
      const double step_s = micros * 1e-6 / steps;
      const double experts = touched / steps;  // over the stage's layers
      const double kv = static_cast<double>(s) * context * config.kv_values_per_token_layer() * 2;
      const double bytes = layers * (FixedLayerBytes(config) + kv) + experts * expert_bytes;
      const double bound_copy = bytes / copy_bw;
      const double bound_sheet = bytes / (absl::GetFlag(FLAGS_datasheet_tbps) * 1e12);
      fmt::print(
          "{:>8} {:>8} {:>10.3f} {:>10.1f} {:>9.2f} {:>9.1f} {:>11.3f} {:>7.1f}% {:>7.1f}%\n", s,
          context, step_s * 1e3, s / step_s, bytes / 1e9, experts / layers, bound_copy * 1e3,
          100 * bound_copy / step_s, 100 * bound_sheet / step_s);
    }
  }
  fmt::print("graphs captured: {}\n", slice->num_graphs());
  return absl::OkStatus();
}

}  // namespace
}  // namespace ringserve::cuda

int main(int argc, char** argv) {
  ringserve::ParseCommandLineFlags(argc, argv,
                                   "DeepSeek-V3 stage decode on one GPU against its bound.");
  const absl::Status status = ringserve::cuda::Run();
  if (!status.ok()) {
    std::fprintf(stderr, "mla_slice_bench: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
