// One mixture-of-experts stage on one GPU (Qwen3-30B-A3B's shape by default: bf16 random weights
// made on the GPU, every layer): decode tok/s at 1, 32 and 64 streams and prefill tok/s of one
// 8k prompt, each against its bound. Each step runs as the last stage serves it (Prepare, Run,
// Sample with greedy rows; decode steps replay CUDA graphs).
//   decode bound: bytes read per step / bandwidth, where the bytes are the non-expert weights
//     (attention, routers, lm_head), the experts the step's tokens touched (counted on the GPU by
//     the router kernels, per layer) and the KV cache read.
//   prefill bound: active matrix FLOPs (attention projections, router, top_k experts per token,
//     causal attention counted once, one logits row) / peak bf16 tensor throughput.
//
// With --quant int4|int8|fp8|fp4 the attention matrices and the routed experts are held
// quantized (random codes, scales per row and --quant_group columns; cuda_moe_layer.h), and the
// decode bound counts their codes and scales instead of bf16.
//
//   moe_bench [--shape qwen3-30b-a3b] [--layers N] [--bandwidth_tbps 4.28] [--peak_tflops 790]
//             [--prefill_tokens 8192] [--streams 1,32,64] [--steps 16] [--quant fp8]
//             [--quant_group 128]
#include <algorithm>
#include <chrono>
#include <numeric>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "bench/model/random_model.h"
#include "common/flags.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "fmt/format.h"
#include "ring/model_config.h"
#include "stage/cuda/cuda_model_slice.h"

ABSL_FLAG(std::string, shape, "qwen3-30b-a3b", "make_random_model shape (a MoE one)");
ABSL_FLAG(int, layers, 0, "layer count (0: the shape's)");
ABSL_FLAG(double, bandwidth_tbps, 4.28, "memory bandwidth bound, TB/s (H200: 4.28 measured)");
ABSL_FLAG(double, peak_tflops, 790, "dense bf16 tensor-core bound, TFLOP/s");
ABSL_FLAG(int, prefill_tokens, 8192, "prompt length of the prefill row (0: no prefill row)");
ABSL_FLAG(std::string, streams, "1,32,64", "decode stream counts");
ABSL_FLAG(int, prompt, 128, "prompt tokens of each decode stream");
ABSL_FLAG(int, steps, 16, "timed decode steps");
ABSL_FLAG(std::string, quant, "", "int4, int8, fp8 or fp4: attention and routed experts held so");
ABSL_FLAG(int, quant_group, 128, "columns per scale with --quant");
ABSL_FLAG(std::string, moe_gemm, "wgmma",
          "grouped expert GEMM of prefill: wgmma (compute capability 9.0 with sm_90a code; "
          "elsewhere wmma runs anyway) or wmma");

namespace ringserve::cuda {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int kBlockSize = 16;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Bytes per value of a linear weight held as `quant` ("": bf16) with scales per `group` columns
// (fp32 scales, and fp32 zero points for integer formats).
double BytesPerValue(const std::string& quant, int group) {
  if (quant.empty()) return 2.0;
  const bool integer = quant == "int4" || quant == "int8";
  const double bits = quant == "int4" || quant == "fp4" ? 4 : 8;
  return bits / 8 + (integer ? 8.0 : 4.0) / group;
}
// Bytes of an expert (gate, up, down), and of everything else a decode step reads once, with the
// quantizable matrices (attention, routed experts) at `bpv` bytes per value.
double ExpertBytes(const ModelConfig& c, double bpv) {
  return bpv * 3 * c.moe.expert_intermediate_size * c.hidden_size;
}
double NonExpertBytes(const ModelConfig& c, double bpv) {
  const double h = c.hidden_size, d = c.head_dim;
  double total = 2 * h * c.vocab_size;  // lm_head
  for (int l = 0; l < c.num_layers; ++l) {
    total += bpv * (h * (c.num_heads + 2 * c.num_kv_heads) * d + c.num_heads * d * h) + 4 * h;
    if (c.moe.IsMoeLayer(l)) {
      total += 4.0 * c.moe.router.num_experts * h + 2.0 * 3 * c.moe.shared_intermediate_size * h;
    } else {
      total += bpv * 3 * c.intermediate_size * h;
    }
  }
  return total;
}
double ActiveFlopsPerToken(const ModelConfig& c) {
  const double h = c.hidden_size, d = c.head_dim;
  double params = 0;
  for (int l = 0; l < c.num_layers; ++l) {
    params += h * (c.num_heads + 2 * c.num_kv_heads) * d + c.num_heads * d * h;
    if (c.moe.IsMoeLayer(l)) {
      params +=
          c.moe.router.num_experts * h + 3.0 * h *
                                             (c.moe.router.top_k * c.moe.expert_intermediate_size +
                                              c.moe.shared_intermediate_size);
    } else {
      params += 3.0 * h * c.intermediate_size;
    }
  }
  return 2 * params;
}

class MoeBench {
 public:
  MoeBench(CudaModelSlice& slice, double bandwidth, double peak, double bytes_per_value)
      : slice_(slice),
        c_(slice.config()),
        bandwidth_(bandwidth),
        peak_(peak),
        bpv_(bytes_per_value) {}

  absl::StatusOr<std::vector<int32_t>> Step(const MicroBatch& batch, int rows) {
    const std::vector<RowSampling> sampling(rows, RowSampling{.config = {.temperature = 0.0f}});
    RS_RETURN_IF_ERROR(slice_.Prepare(batch));
    RS_RETURN_IF_ERROR(slice_.Run(batch));
    RS_ASSIGN_OR_RETURN(SampledRows sampled, slice_.Sample(batch, sampling));
    return std::move(sampled.tokens);
  }

  // Experts touched by the last step, summed over the layers.
  absl::StatusOr<int64_t> TouchedExperts() {
    const CudaMoeWorkspace* ws = slice_.moe_workspace();
    if (ws == nullptr) return 0;
    std::vector<int32_t> touched(ws->num_layers());
    RS_CUDA_RETURN_IF_ERROR(cudaMemcpy(touched.data(), ws->experts_touched(),
                                       touched.size() * sizeof(int32_t), cudaMemcpyDeviceToHost));
    int64_t sum = 0;
    for (int l = 0; l < ws->num_layers(); ++l) sum += c_.moe.IsMoeLayer(l) ? touched[l] : 0;
    return sum;
  }

  std::vector<int32_t> Table(int seq, int positions) const {
    const int per_seq = (positions + kBlockSize - 1) / kBlockSize;
    std::vector<int32_t> t(per_seq);
    for (int i = 0; i < per_seq; ++i) t[i] = seq * per_seq + i;
    return t;
  }

  absl::Status Decode(int streams, int prompt, int steps) {
    const int warmup = 3;
    const int positions = prompt + warmup + 2 * steps + 1;
    std::vector<int32_t> next(streams);
    // Prefill every stream (micro-batches within the token budget).
    for (int s0 = 0; s0 < streams;) {
      MicroBatch batch;
      int rows = 0;
      for (; s0 < streams && (rows + 1) * prompt <= slice_.cuda_options().max_batch_tokens;
           ++s0, ++rows) {
        batch.chunks.push_back({.seq_id = static_cast<uint64_t>(s0),
                                .start_position = 0,
                                .num_tokens = prompt,
                                .block_table = Table(s0, positions),
                                .logits = LogitsMode::kLastToken});
        for (int i = 0; i < prompt; ++i) batch.token_ids.push_back((s0 * 7919 + i * 31) % 50000);
      }
      RS_ASSIGN_OR_RETURN(std::vector<int32_t> tokens, Step(batch, rows));
      std::copy(tokens.begin(), tokens.end(), next.begin() + (s0 - rows));
    }
    int pos = prompt;
    auto step = [&]() -> absl::Status {
      MicroBatch batch;
      for (int s = 0; s < streams; ++s) {
        batch.chunks.push_back({.seq_id = static_cast<uint64_t>(s),
                                .start_position = pos,
                                .num_tokens = 1,
                                .block_table = Table(s, positions),
                                .logits = LogitsMode::kLastToken});
        batch.token_ids.push_back(next[s]);
      }
      RS_ASSIGN_OR_RETURN(next, Step(batch, streams));
      ++pos;
      return absl::OkStatus();
    };
    for (int i = 0; i < warmup; ++i) RS_RETURN_IF_ERROR(step());
    const auto start = Clock::now();
    for (int i = 0; i < steps; ++i) RS_RETURN_IF_ERROR(step());
    const double step_s = Seconds(start, Clock::now()) / steps;
    // Experts touched, from as many further steps (read after each).
    int64_t touched = 0;
    for (int i = 0; i < steps; ++i) {
      RS_RETURN_IF_ERROR(step());
      RS_ASSIGN_OR_RETURN(const int64_t t, TouchedExperts());
      touched += t;
    }
    const double mean_touched = static_cast<double>(touched) / steps;
    const double context = prompt + warmup + steps;  // mean over the timed steps, roughly
    const double kv = 2.0 * 2 * c_.num_kv_heads * c_.head_dim * c_.num_layers * context * streams;
    const double bytes = NonExpertBytes(c_, bpv_) + mean_touched * ExpertBytes(c_, bpv_) + kv;
    const double bound_s = bytes / bandwidth_;
    int moe_layers = 0;
    for (int l = 0; l < c_.num_layers; ++l) moe_layers += c_.moe.IsMoeLayer(l);
    fmt::print(
        "decode {:>3} streams: {:>9.1f} tok/s  step {:7.3f} ms  bound {:7.3f} ms ({:.2f} GB: "
        "{:.1f} experts/layer of {}, KV {:.2f} GB) -> {:5.1f}% of bound\n",
        streams, streams / step_s, step_s * 1e3, bound_s * 1e3, bytes / 1e9,
        mean_touched / std::max(1, moe_layers), c_.moe.router.num_experts, kv / 1e9,
        100 * bound_s / step_s);
    return absl::OkStatus();
  }

  absl::Status Prefill(int tokens) {
    MicroBatch batch;
    batch.chunks.push_back({.seq_id = 1000,
                            .start_position = 0,
                            .num_tokens = tokens,
                            .block_table = Table(0, tokens),
                            .logits = LogitsMode::kLastToken});
    for (int i = 0; i < tokens; ++i) batch.token_ids.push_back((i * 7919 + 13) % 50000);
    RS_RETURN_IF_ERROR(Step(batch, 1).status());  // warm-up (cuBLAS plans, first launches)
    double best = 1e30;
    for (int r = 0; r < 3; ++r) {
      const auto start = Clock::now();
      RS_RETURN_IF_ERROR(Step(batch, 1).status());
      best = std::min(best, Seconds(start, Clock::now()));
    }
    const double n = tokens;
    const double attention = 2.0 * n * n * c_.head_dim * c_.num_heads * c_.num_layers;
    const double flops =
        ActiveFlopsPerToken(c_) * n + attention + 2.0 * c_.hidden_size * c_.vocab_size;
    fmt::print(
        "prefill {} tokens: {:>9.0f} tok/s  {:8.2f} ms  {:.1f} active TFLOP -> {:6.1f} TFLOP/s, "
        "{:5.1f}% of {:.0f} TFLOP/s\n",
        tokens, n / best, best * 1e3, flops / 1e12, flops / best / 1e12, 100 * flops / best / peak_,
        peak_ / 1e12);
    return absl::OkStatus();
  }

 private:
  CudaModelSlice& slice_;
  const ModelConfig& c_;
  double bandwidth_, peak_;
  double bpv_;  // bytes per value of the quantizable matrices
};

absl::Status Main() {
  RS_ASSIGN_OR_RETURN(ModelShape shape, FindShape(absl::GetFlag(FLAGS_shape)));
  if (absl::GetFlag(FLAGS_layers) > 0) shape.num_layers = absl::GetFlag(FLAGS_layers);
  RS_ASSIGN_OR_RETURN(ModelConfig config, ParseModelConfig(ConfigJson(shape, DType::kBF16)));
  if (!config.moe.enabled()) return absl::InvalidArgumentError("--shape has no experts");
  std::vector<int> streams;
  for (absl::string_view s : absl::StrSplit(absl::GetFlag(FLAGS_streams), ',')) {
    int n = 0;
    if (!absl::SimpleAtoi(s, &n) || n < 1) return absl::InvalidArgumentError("bad --streams");
    streams.push_back(n);
  }
  const int prompt = absl::GetFlag(FLAGS_prompt), steps = absl::GetFlag(FLAGS_steps);
  const int prefill = absl::GetFlag(FLAGS_prefill_tokens);
  const int max_streams = *std::max_element(streams.begin(), streams.end());
  const int per_seq = (prompt + 2 * steps + 8 + kBlockSize - 1) / kBlockSize;
  const int blocks = std::max(max_streams * per_seq, (prefill + kBlockSize - 1) / kBlockSize) + 16;
  if (prefill < 0) return absl::InvalidArgumentError("--prefill_tokens must be >= 0");
  const auto start = Clock::now();
  CudaSliceOptions cuda{.max_batch_tokens = std::max(prefill, max_streams * prompt),
                        .max_seqs = std::max(256, max_streams),
                        .max_model_len = std::max(prefill, prompt + 2 * steps + 8),
                        .random_quant = absl::GetFlag(FLAGS_quant),
                        .random_quant_group = absl::GetFlag(FLAGS_quant_group)};
  cuda.kernels.moe_gemm_sm90 = absl::GetFlag(FLAGS_moe_gemm) == "wgmma";
  RS_ASSIGN_OR_RETURN(std::unique_ptr<CudaModelSlice> slice,
                      CudaModelSlice::CreateRandom(config,
                                                   {.model_dir = "",
                                                    .layers = {0, config.num_layers},
                                                    .kv_block_size = kBlockSize,
                                                    .kv_num_blocks = blocks},
                                                   cuda, /*seed=*/1));
  const CudaMemoryReport m = slice->memory();
  fmt::print(
      "{}: {} layers, {} experts top-{}, weights {} {:.1f} GiB, activations {:.2f} GiB, "
      "made in {:.1f} s; kernels: {}\n",
      shape.name, config.num_layers, config.moe.router.num_experts, config.moe.router.top_k,
      absl::GetFlag(FLAGS_quant).empty() ? "bf16" : absl::GetFlag(FLAGS_quant),
      m.weight_bytes / 1073741824.0, m.activation_bytes / 1073741824.0,
      Seconds(start, Clock::now()),
      slice->kernel_plan().Summary() +
          (slice->kernel_plan().moe_gemm == ringserve::cuda::MoeGemmKernel::kWgmmaSm90
               ? ", moe gemm wgmma"
               : ", moe gemm wmma"));
  MoeBench bench(*slice, absl::GetFlag(FLAGS_bandwidth_tbps) * 1e12,
                 absl::GetFlag(FLAGS_peak_tflops) * 1e12,
                 BytesPerValue(absl::GetFlag(FLAGS_quant), absl::GetFlag(FLAGS_quant_group)));
  for (int s : streams) RS_RETURN_IF_ERROR(bench.Decode(s, prompt, steps));
  return prefill > 0 ? bench.Prefill(prefill) : absl::OkStatus();
}

}  // namespace
}  // namespace ringserve::cuda

int main(int argc, char** argv) {
  ringserve::ParseCommandLineFlags(
      argc, argv,
      "moe_bench: a mixture-of-experts stage on one GPU (random weights), decode and prefill "
      "against their bounds.\nUsage: moe_bench [--shape qwen3-30b-a3b] [--layers N] ...");
  const absl::Status status = ringserve::cuda::Main();
  if (!status.ok()) {
    fmt::print(stderr, "moe_bench: {}\n", status.ToString());
    return 1;
  }
  return 0;
}
