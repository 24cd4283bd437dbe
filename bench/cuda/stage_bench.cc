// One stage on one GPU, whole model (Llama-3.1-8B or Qwen3-8B shape, bf16, random weights made
// on the GPU, or a model directory), each step run as the last stage serves it (Prepare, Run,
// Sample with greedy rows): decode tok/s at several stream counts (128-token prompts),
// decode at a long context, prefill tok/s, each against its physical bound, and a per-shape GEMM
// table (our GEMV vs cuBLASLt). Prints a table last.
//
//   stage_bench [--model DIR] [--shape llama8b|qwen3_8b] [--quick] [--kernels_only]
//               [--prefill_only] [--decode_only] [--gemm_only] [--bandwidth_tbps 4.28]
//               [--peak_tflops 785] [--prefill_key_tile 64|128]
//               [--decode_at 1@384,32@384,64@384 [--decode_at_only]]
//               [--kv_cache_dtype auto|fp8_e4m3] [--decode_skip_prefill]  (--help lists them all)
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "bench/cuda/event_timer.h"
#include "bench/cuda/prefill_table.h"
#include "common/flags.h"
#include "common/logging.h"
#include "fmt/format.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/device_info.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/kernel_options.h"
#include "kernels/cuda/rope.h"
#include "kernels/cuda/sampling.h"
#include "ring/kv_cache_dtype.h"
#include "ring/model_config.h"
#include "stage/cuda/cuda_model_slice.h"

ABSL_FLAG(std::string, model, "",
          "model directory (config.json + safetensors); empty: random weights of --shape");
ABSL_FLAG(std::string, shape, "llama8b", "model shape with random weights: llama8b or qwen3_8b");
ABSL_FLAG(std::string, quant, "",
          "random weights only: linear layers held quantized (int4, int8, fp8, fp4); empty: bf16");
ABSL_FLAG(int, quant_group, 128, "columns per scale of --quant");
ABSL_FLAG(bool, fp8_gemm_wgmma, false,
          "--quant fp8 prefill through the wgmma FP8 GEMM (KernelOptions::fp8_gemm_sm90)");
ABSL_FLAG(
    bool, merge_splits_in_attention, false,
    "split decode attention merged by its last CTA (KernelOptions::merge_splits_in_attention)");
ABSL_FLAG(bool, quick, false, "fewer steps and repetitions, 4k instead of 32k long context");
ABSL_FLAG(bool, kernels_only, false, "just the small-kernel table at 32 tokens (for profilers)");
ABSL_FLAG(bool, prefill_only, false, "just the prefill breakdown and the prefill rows");
ABSL_FLAG(bool, decode_only, false, "just decode at 1 and 32 streams (for timeline profilers)");
ABSL_FLAG(bool, gemm_only, false, "just the per-shape GEMM table (for kernel profilers)");
ABSL_FLAG(bool, graphs, true, "decode steps replay CUDA graphs (--nographs: eager launches)");
ABSL_FLAG(double, bandwidth_tbps, 4.28, "memory bandwidth bound, TB/s (H200: 4.28 measured)");
ABSL_FLAG(double, peak_tflops, 785, "dense bf16 compute bound, TFLOP/s");
ABSL_FLAG(std::string, decode_at, "",
          "extra decode rows STREAMS@MEAN_CONTEXT,... (a served run's batch sizes and mean "
          "contexts, so that served and kernel tok/s compare like for like)");
ABSL_FLAG(bool, decode_at_only, false, "just the --decode_at rows");
ABSL_FLAG(std::string, kv_cache_dtype, "auto",
          "the KV cache's element type: auto (bf16) or fp8_e4m3 (ring/kv_cache_dtype.h)");
ABSL_FLAG(bool, decode_skip_prefill, false,
          "decode rows attend to the KV pool as it is (zeroed) instead of prefilling the prompts "
          "first: long contexts at many streams in seconds (the bytes read are the same; blocks "
          "past the pool's end wrap around and are shared)");
ABSL_FLAG(int, prefill_key_tile, 64,
          "keys per K/V tile of the sm_90 prefill attention (KernelOptions): 64 or 128");

namespace ringserve::cuda {
namespace {

using Clock = std::chrono::steady_clock;

struct Flags {
  std::string model_dir;
  std::string shape = "llama8b";
  bool quick = false;
  bool kernels_only = false;  // just the small-kernel table at 32 tokens (for profilers)
  bool prefill_only = false;  // just the prefill breakdown and the prefill rows
  bool decode_only = false;   // just decode at 1 and 32 streams (for timeline profilers)
  bool gemm_only = false;     // just the per-shape GEMM table (for kernel profilers)
  bool graphs = true;
  double bandwidth = 4.28e12;
  double peak = 785e12;
  std::vector<std::pair<int, int>> decode_at;  // --decode_at: (streams, mean context)
  bool decode_at_only = false;
  KvCacheDtype kv_cache_dtype = KvCacheDtype::kAuto;
  bool decode_skip_prefill = false;
};

// "1@384,32@384" -> {(1, 384), (32, 384)}; nullopt when malformed.
std::optional<std::vector<std::pair<int, int>>> ParseDecodeAt(const std::string& spec) {
  std::vector<std::pair<int, int>> out;
  size_t begin = 0;
  while (begin < spec.size()) {
    size_t end = spec.find(',', begin);
    if (end == std::string::npos) end = spec.size();
    int streams = 0, context = 0;
    char tail = 0;
    if (std::sscanf(spec.substr(begin, end - begin).c_str(), "%d@%d%c", &streams, &context,
                    &tail) != 2 ||
        streams < 1 || context < 2) {
      return std::nullopt;
    }
    out.emplace_back(streams, context);
    begin = end + 1;
  }
  return out;
}

ModelConfig ShapeConfig(const std::string& shape) {
  ModelConfig c;
  c.hidden_size = 4096;
  c.num_heads = 32;
  c.num_kv_heads = 8;
  c.head_dim = 128;
  c.num_layers = 36;
  c.max_position_embeddings = 40960;
  c.rms_norm_eps = 1e-6f;
  if (shape == "qwen3_8b") {
    c.architecture = Architecture::kQwen3;
    c.model_type = "qwen3";
    c.intermediate_size = 12288;
    c.vocab_size = 151936;
    c.rope.theta = 1000000.0;
    c.qk_norm = true;
    return c;
  }
  c.architecture = Architecture::kLlama;
  c.model_type = "llama";
  c.num_layers = 32;
  c.intermediate_size = 14336;
  c.vocab_size = 128256;
  c.max_position_embeddings = 131072;
  c.rms_norm_eps = 1e-5f;
  c.rope.type = RopeType::kLlama3;
  c.rope.theta = 500000.0;
  c.rope.factor = 8.0;
  c.rope.low_freq_factor = 1.0;
  c.rope.high_freq_factor = 4.0;
  c.rope.original_max_position_embeddings = 8192;
  return c;
}

// Bytes of weights read per forward (everything but the embedding table).
double WeightBytes(const ModelConfig& c) {
  const double h = c.hidden_size, d = c.head_dim, inter = c.intermediate_size;
  const double layer =
      h * (c.num_heads + 2 * c.num_kv_heads) * d + c.num_heads * d * h + 3 * h * inter + 2 * h;
  return 2 * (layer * c.num_layers + h * c.vocab_size + h);
}
double KvBytesPerPosition(const ModelConfig& c, KvCacheDtype dtype) {
  return 2.0 * KvCacheElementBytes(dtype, 2) * c.num_kv_heads * c.head_dim * c.num_layers;
}
// Matrix FLOPs of a prompt of n tokens (causal attention counted once), logits for one row.
double PrefillFlops(const ModelConfig& c, double n) {
  const double h = c.hidden_size, d = c.head_dim, inter = c.intermediate_size;
  const double layer_params =
      h * (c.num_heads + 2 * c.num_kv_heads) * d + c.num_heads * d * h + 3 * h * inter;
  const double linear = 2 * layer_params * n * c.num_layers + 2 * h * c.vocab_size;
  const double attention = 2.0 * n * n * d * c.num_heads * c.num_layers;  // QK^T + PV, causal
  return linear + attention;
}

struct Row {
  std::string name;
  double value;  // tok/s
  double fraction;
  std::string bound;
  std::string note;
};

class Bench {
 public:
  Bench(CudaModelSlice& slice, const Flags& flags) : slice_(slice), flags_(flags) {}

  // Gives each sequence `positions` worth of fresh blocks.
  std::vector<int32_t> Blocks(int positions) {
    const int bs = slice_.options().kv_block_size;
    const int n = (positions + bs - 1) / bs;
    std::vector<int32_t> t(n);
    for (int i = 0; i < n; ++i) t[i] = next_block_++ % slice_.options().kv_num_blocks;
    return t;
  }
  void ResetBlocks() { next_block_ = 0; }

  // One step the way the last stage serves it (StepExecutor): Prepare, Run and Sample through
  // the production sampler (greedy rows: SamplingConfig's temperature 0).
  absl::StatusOr<std::vector<int32_t>> Step(const MicroBatch& batch, int rows) {
    const std::vector<RowSampling> sampling(rows, RowSampling{.config = {.temperature = 0.0f}});
    absl::Status status = slice_.Prepare(batch);
    if (status.ok()) status = slice_.Run(batch);
    if (!status.ok()) return status;
    absl::StatusOr<SampledRows> sampled = slice_.Sample(batch, sampling);
    if (!sampled.ok()) return sampled.status();
    return std::move(sampled->tokens);
  }

  // Prefill `streams` prompts of `prompt` tokens (in micro-batches of <= max_batch_tokens),
  // then time `steps` decode steps. Returns tok/s and the mean context.
  absl::StatusOr<std::pair<double, double>> Decode(int streams, int prompt, int steps, int warmup) {
    ResetBlocks();
    const int max_tokens = slice_.cuda_options().max_batch_tokens;
    std::vector<std::vector<int32_t>> tables;
    for (int s = 0; s < streams; ++s) tables.push_back(Blocks(prompt + steps + warmup + 1));
    std::vector<int32_t> next(streams, 1);
    // Prefill, chunked by the token budget.
    int s = flags_.decode_skip_prefill ? streams : 0;
    while (s < streams) {
      MicroBatch batch;
      int budget = max_tokens;
      std::vector<int> members;
      while (s < streams && budget > 0) {
        SequenceChunk chunk;
        chunk.seq_id = s;
        chunk.block_table = tables[s];
        // Long prompts are chunked within the sequence.
        const int done = prefilled_.size() > static_cast<size_t>(s) ? prefilled_[s] : 0;
        const int take = std::min(budget, prompt - done);
        chunk.start_position = done;
        chunk.num_tokens = take;
        chunk.logits = done + take == prompt ? LogitsMode::kLastToken : LogitsMode::kNone;
        for (int i = 0; i < take; ++i) batch.token_ids.push_back((s * 7919 + done + i) % 50000);
        batch.chunks.push_back(chunk);
        if (prefilled_.size() <= static_cast<size_t>(s)) prefilled_.resize(s + 1, 0);
        prefilled_[s] = done + take;
        budget -= take;
        if (done + take == prompt) {
          members.push_back(s);
          ++s;
        }
      }
      auto tokens = Step(batch, static_cast<int>(members.size()));
      if (!tokens.ok()) return tokens.status();
      for (size_t i = 0; i < members.size(); ++i) next[members[i]] = (*tokens)[i];
    }
    prefilled_.clear();
    int pos = prompt;
    double seconds = 0;
    for (int step = 0; step < warmup + steps; ++step) {
      MicroBatch batch;
      for (int q = 0; q < streams; ++q) {
        batch.chunks.push_back({.seq_id = static_cast<uint64_t>(q),
                                .start_position = pos,
                                .num_tokens = 1,
                                .block_table = tables[q],
                                .logits = LogitsMode::kLastToken});
        batch.token_ids.push_back(next[q]);
      }
      const auto t0 = Clock::now();
      auto tokens = Step(batch, streams);
      const auto t1 = Clock::now();
      if (!tokens.ok()) return tokens.status();
      if (step >= warmup) seconds += std::chrono::duration<double>(t1 - t0).count();
      next = *tokens;
      ++pos;
    }
    const double mean_ctx = prompt + warmup + steps / 2.0;
    return std::make_pair(streams * steps / seconds, mean_ctx);
  }

  // Prefills one prompt of `length` tokens in chunks of `chunk` tokens (0: the slice's
  // max_batch_tokens), as a coordinator with that token budget would. Returns tok/s.
  absl::StatusOr<double> Prefill(int length, int reps, int chunk = 0) {
    ResetBlocks();
    const auto table = Blocks(length);
    const int max_tokens = chunk > 0 ? chunk : slice_.cuda_options().max_batch_tokens;
    double seconds = 0;
    for (int r = 0; r < reps + 1; ++r) {
      const auto t0 = Clock::now();
      for (int start = 0; start < length; start += max_tokens) {
        MicroBatch batch;
        const int take = std::min(max_tokens, length - start);
        batch.chunks.push_back(
            {.seq_id = 0,
             .start_position = start,
             .num_tokens = take,
             .block_table = table,
             .logits = start + take == length ? LogitsMode::kLastToken : LogitsMode::kNone});
        for (int i = 0; i < take; ++i) batch.token_ids.push_back((start + i) * 31 % 50000);
        auto tokens = Step(batch, start + take == length ? 1 : 0);
        if (!tokens.ok()) return tokens.status();
      }
      const auto t1 = Clock::now();
      if (r > 0) seconds += std::chrono::duration<double>(t1 - t0).count();
    }
    return length * reps / seconds;
  }

 private:
  CudaModelSlice& slice_;
  const Flags& flags_;
  int next_block_ = 0;
  std::vector<int> prefilled_;
};

// Times y = x W^T for the model's shapes at m = 1 to 64, each call with the weights evicted from
// L2 first: our GEMV, cuBLASLt's heuristic choice, the skinny GEMM's best grid, the tuned plan.
// Launched as the slice's plan launches (dependent launch where it has it).
void GemmTable(const ModelConfig& c, const KernelPlan& plan, GemmRunner& gemm, double bandwidth,
               std::string* out) {
  const LaunchStream stream(nullptr, plan.dependent_launch);
  const int h = c.hidden_size, d = c.head_dim, inter = c.intermediate_size;
  struct Shape {
    const char* name;
    int n, k;
  };
  const Shape shapes[] = {{"qkv", (c.num_heads + 2 * c.num_kv_heads) * d, h},
                          {"o", h, c.num_heads * d},
                          {"gate_up", 2 * inter, h},
                          {"down", h, inter},
                          {"lm_head", c.vocab_size, h}};
  DeviceBuffer w, x, y;
  const int64_t max_w = int64_t{c.vocab_size} * h;
  if (!w.Allocate(max_w * 2).ok() || !x.Allocate(int64_t{64} * inter * 2).ok() ||
      !y.Allocate(int64_t{64} * c.vocab_size * 4).ok()) {
    *out += "gemm table: allocation failed\n";
    return;
  }
  (void)LaunchFillRandom(w.as<bf16>(), max_w, 7, 0, 0.03f, stream);
  (void)LaunchFillRandom(x.as<bf16>(), int64_t{64} * inter, 8, 0, 1, stream);
  // The skinny GEMM's best grid, timed here over 1 to kSkinnyBlocksPerSm blocks per
  // multiprocessor (the tuned column shows it only where it wins).
  DeviceBuffer skinny_buffer;
  SkinnyWorkspace skinny_ws;
  int device = 0, sms = 0;
  // Every figure with the weights evicted from L2 first, as a decode step meets them.
  absl::StatusOr<std::unique_ptr<ColdCacheTimer>> timer = ColdCacheTimer::Create();
  if (!timer.ok() ||
      !AllocateSkinnyWorkspace(GemmOptions{}.skinny_workspace_bytes, &skinny_buffer, &skinny_ws)
           .ok() ||
      cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
    *out += "gemm table: skinny GEMM workspace failed\n";
    return;
  }
  auto best_skinny = [&](int m, int n, int k, int* best_per_sm) {
    double best = 0;
    for (int per_sm = 1; per_sm <= kSkinnyBlocksPerSm; ++per_sm) {
      const int blocks = per_sm * sms;
      if (SkinnyPartialFloats(m, n, k, blocks) > skinny_ws.partial_floats) break;
      const double us = (*timer)->MedianUs(
          [&] {
            return LaunchSkinnyGemm(x.as<bf16>(), w.as<bf16>(), y.get(), OutType::kBF16, m, n, k,
                                    blocks, skinny_ws, stream);
          },
          stream);
      if (us > 0 && (best == 0 || us < best)) {
        best = us;
        *best_per_sm = per_sm;
      }
    }
    return best;
  };
  *out += fmt::format("{:<8} {:>3} {:>8} {:>6} {:>9} {:>6} {:>10} {:>6} {:>8} {:>6}  {}\n", "gemm",
                      "m", "gemv_us", "bw%", "cublas_us", "bw%", "skinny_us", "bw%", "tuned_us",
                      "bw%", "tuned plan");
  for (const Shape& s : shapes) {
    for (int m : {1, 4, 8, 32, 64}) {
      double us[3] = {0, 0, 0};
      // GEMV, cuBLASLt's heuristic choice, then the tuned plan (the runner is the slice's: its
      // decode steps of these sizes use the plans tuned here).
      for (int path = 0; path < 3; ++path) {
        if (path == 0 && m > kGemvMaxRows) continue;
        if (path == 2) {
          (void)gemm.Tune(x.as<bf16>(), w.as<bf16>(), y.get(), OutType::kBF16, m, s.n, s.k, stream);
        }
        auto run = [&] {
          switch (path) {
            case 0:
              return LaunchGemv(x.as<bf16>(), w.as<bf16>(), y.get(), OutType::kBF16, m, s.n, s.k,
                                stream);
            case 1:
              return gemm.LinearCublas(x.as<bf16>(), w.as<bf16>(), y.get(), OutType::kBF16, m, s.n,
                                       s.k, stream);
            default:
              return gemm.Linear(x.as<bf16>(), w.as<bf16>(), y.get(), OutType::kBF16, m, s.n, s.k,
                                 stream);
          }
        };
        us[path] = (*timer)->MedianUs(run, stream);
      }
      int per_sm = 0;
      const double skinny_us = best_skinny(m, s.n, s.k, &per_sm);
      const double bytes = 2.0 * s.n * s.k;
      auto frac = [&](double t) { return t > 0 ? 100 * bytes / bandwidth / (t * 1e-6) : 0; };
      *out += fmt::format(
          "{:<8} {:>3} {:>8.1f} {:>6.1f} {:>9.1f} {:>6.1f} {:>6.1f} x{:<2} {:>6.1f} {:>8.1f} "
          "{:>6.1f}  {}\n",
          s.name, m, us[0], frac(us[0]), us[1], frac(us[1]), skinny_us, per_sm, frac(skinny_us),
          us[2], frac(us[2]), gemm.PlanSummary(m, s.n, s.k, OutType::kBF16));
    }
  }
}

// One decode row (m = 1): each projection with its neighbouring norm or residual add as separate
// kernels, against the fused GEMV that replaces them (gemv.h). Back-to-back launches, so a
// kernel's launch gap is in its time as it is in a graph without early launch.
void FusedGemvTable(const ModelConfig& c, const KernelPlan& plan, double bandwidth,
                    std::string* out) {
  const LaunchStream stream(nullptr, plan.dependent_launch);
  const int h = c.hidden_size, inter = c.intermediate_size;
  const int qkv_w = (c.num_heads + 2 * c.num_kv_heads) * c.head_dim,
            attn_w = c.num_heads * c.head_dim;
  const float eps = 1e-5f;
  DeviceBuffer w, res, wnorm, x, y;
  if (!w.Allocate(int64_t{2} * inter * h * 2).ok() || !res.Allocate(int64_t{h} * 4).ok() ||
      !wnorm.Allocate(h * 2).ok() || !x.Allocate(int64_t{inter} * 2).ok() ||
      !y.Allocate(int64_t{2} * inter * 2).ok()) {
    *out += "fused gemv table: allocation failed\n";
    return;
  }
  (void)LaunchFillRandom(w.as<bf16>(), w.bytes() / 2, 7, 0, 0.03f, stream);
  (void)LaunchFillRandom(wnorm.as<bf16>(), h, 8, 1, 0.1f, stream);
  (void)LaunchFillRandom(x.as<bf16>(), inter, 9, 0, 1, stream);
  cudaMemset(res.get(), 0, res.bytes());
  const RmsNormedInput normed{res.as<float>(), wnorm.as<bf16>(), eps};
  const auto norm = [&] {
    return LaunchAddRmsNorm(res.as<float>(), nullptr, nullptr, wnorm.as<bf16>(), x.as<bf16>(), 1, h,
                            eps, stream);
  };
  // Runs `first`, then `second` if the first launch succeeded.
  const auto both = [](auto&& first, auto&& second) {
    const absl::Status s = first();
    return s.ok() ? second() : s;
  };
  const auto row = [&](const std::string& name, double bytes, auto&& separate, auto&& fused) {
    const double us_separate = 1000 * TimeMs(separate, 3, 50);
    const double us_fused = 1000 * TimeMs(fused, 3, 50);
    *out += fmt::format("{:<34} {:>9.1f} {:>8.1f} {:>6.1f}\n", name, us_separate, us_fused,
                        100 * bytes / bandwidth / (us_fused * 1e-6));
  };
  *out +=
      fmt::format("{:<34} {:>9} {:>8} {:>6}\n", "fused gemv, m = 1", "separate", "fused", "bw%");
  row(
      "qkv: rmsnorm + gemv", 2.0 * qkv_w * h,
      [&] {
        return both(norm, [&] {
          return LaunchGemv(x.as<bf16>(), w.as<bf16>(), y.get(), OutType::kBF16, 1, qkv_w, h,
                            stream);
        });
      },
      [&] { return LaunchGemvNormed(normed, w.as<bf16>(), y.as<bf16>(), 1, qkv_w, h, stream); });
  row(
      "gate_up: rmsnorm + gemv silu", 4.0 * inter * h,
      [&] {
        return both(norm, [&] {
          return LaunchGemvGateUpSilu(x.as<bf16>(), w.as<bf16>(), y.as<bf16>(), 1, inter, h,
                                      stream);
        });
      },
      [&] {
        return LaunchGemvGateUpSiluNormed(normed, w.as<bf16>(), y.as<bf16>(), 1, inter, h, stream);
      });
  for (const auto& [name, k] : {std::pair{"o: gemv + residual add", attn_w},
                                std::pair{"down: gemv + residual add", inter}}) {
    row(
        name, 2.0 * h * k,
        [&] {
          return both(
              [&] {
                return LaunchGemv(x.as<bf16>(), w.as<bf16>(), y.get(), OutType::kBF16, 1, h, k,
                                  stream);
              },
              [&] {
                return LaunchAddRmsNorm(res.as<float>(), y.as<bf16>(), nullptr, nullptr, nullptr, 1,
                                        h, eps, stream);
              });
        },
        [&] {
          return LaunchGemvAddResidual(x.as<bf16>(), w.as<bf16>(), nullptr, res.as<float>(), 1, h,
                                       k, stream);
        });
  }
}

// Times the decode step's small kernels alone (what the graph spends besides GEMMs) at `rows`
// tokens = sequences of context `ctx` each, with events over 50 back-to-back launches each;
// one sequence also at 2k and 32k context.
void KernelTable(const ModelConfig& c, const KernelPlan& plan, int rows, int ctx,
                 std::string* out) {
  const LaunchStream stream(nullptr, plan.dependent_launch);
  const int h = c.hidden_size, d = c.head_dim, inter = c.intermediate_size;
  const int qkv_w = (c.num_heads + 2 * c.num_kv_heads) * d;
  const int blocks = 4096, bs = 16;
  const int64_t kv_elems = int64_t{blocks} * c.num_kv_heads * bs * d;
  DeviceBuffer res, normed, wnorm, qkv, q, attn, gu, act, k, v, meta, ws, logits, tok, inv;
  bool ok = res.Allocate(int64_t{rows} * h * 4).ok() &&
            normed.Allocate(int64_t{rows} * h * 2).ok() && wnorm.Allocate(h * 2).ok() &&
            qkv.Allocate(int64_t{rows} * qkv_w * 2).ok() &&
            q.Allocate(int64_t{rows} * c.num_heads * d * 2).ok() &&
            attn.Allocate(int64_t{rows} * c.num_heads * d * 2).ok() &&
            gu.Allocate(int64_t{rows} * 2 * inter * 2).ok() &&
            act.Allocate(int64_t{rows} * inter * 2).ok() && k.Allocate(kv_elems * 2).ok() &&
            v.Allocate(kv_elems * 2).ok() && meta.Allocate((blocks + 1024) * 4).ok() &&
            ws.Allocate(int64_t{64} << 20).ok() &&
            logits.Allocate(int64_t{rows} * c.vocab_size * 4).ok() && tok.Allocate(rows * 4).ok() &&
            inv.Allocate(d * 2).ok();
  if (!ok) {
    *out += "kernel table: allocation failed\n";
    return;
  }
  for (DeviceBuffer* b : {&normed, &wnorm, &qkv, &q, &gu, &k, &v}) {
    (void)LaunchFillRandom(b->as<bf16>(), b->bytes() / 2, 99, 0, 0.5f, stream);
  }
  cudaMemset(res.get(), 0, res.bytes());
  cudaMemset(inv.get(), 0, d * 2);
  cudaMemset(logits.get(), 0, logits.bytes());
  // meta: q rows at 0, contexts at 64, table rows at 128, positions at 192, slots at 256 (64
  // entries each), block tables from 512 (one row of `stride` blocks per sequence).
  constexpr int kQ = 0, kCtx = 64, kRows = 128, kPos = 192, kSlot = 256, kTables = 512;
  std::vector<int32_t> m(blocks + 1024, 0);
  auto fill = [&](int seqs, int context) {
    const int stride = blocks / seqs;
    for (int s = 0; s < seqs; ++s) {
      m[kQ + s] = s;
      m[kCtx + s] = context;
      m[kRows + s] = s;
      m[kPos + s] = context - 1;
      m[kSlot + s] = s * stride * bs + context - 1;
      for (int i = 0; i < stride; ++i) m[kTables + s * stride + i] = s * stride + i;
    }
    cudaMemcpy(meta.get(), m.data(), m.size() * 4, cudaMemcpyHostToDevice);
    return stride;
  };
  auto time = [&](const std::string& name, auto&& fn) {
    *out += fmt::format("{:<40} {:>8.1f} us\n", name, 1000 * TimeMs(fn, 3, 50));
  };
  const int32_t* md = meta.as<int32_t>();
  time(fmt::format("add_rmsnorm {}x{}", rows, h), [&] {
    return LaunchAddRmsNorm(res.as<float>(), normed.as<bf16>(), nullptr, wnorm.as<bf16>(),
                            normed.as<bf16>() + 0, rows, h, 1e-5f, stream);
  });
  fill(rows, ctx);
  const KvCacheLayer cache{k.as<bf16>(), v.as<bf16>(), c.num_kv_heads, bs, d};
  time(fmt::format("qkv_prepare {} tokens", rows), [&] {
    return LaunchQkvPrepare({.qkv = qkv.as<bf16>(),
                             .positions = md + kPos,
                             .inv_freq = inv.as<float>(),
                             .slots = md + kSlot,
                             .q_out = q.as<bf16>(),
                             .cache = cache,
                             .num_tokens = rows,
                             .num_heads = c.num_heads},
                            stream);
  });
  auto attention = [&](int seqs, int context) {
    const int stride = fill(seqs, context);
    // As the slice plans a graph step: the context rounded up to a power of two.
    int planned = 32;
    while (planned < context) planned *= 2;
    const DecodeSplitPlan split = PlanDecodeSplits(plan, seqs, c.num_kv_heads, planned);
    const AttentionShape shape{.num_heads = c.num_heads, .scale = 0.088f, .cache = cache};
    const DecodeBatch batch{.q_rows = md + kQ,
                            .context_lens = md + kCtx,
                            .table_rows = md + kRows,
                            .block_tables = md + kTables,
                            .max_blocks = stride,
                            .num_entries = seqs,
                            .num_splits = split.splits,
                            .workspace = ws.as<float>(),
                            .partition = split.partition,
                            .kernel = plan.decode_attention};
    time(
        fmt::format("decode_attention {} seq ctx {} ({} splits)", seqs, context, split.splits),
        [&] { return LaunchDecodeAttention(shape, q.as<bf16>(), attn.as<bf16>(), batch, stream); });
  };
  attention(rows, ctx);
  if (rows == 1) {
    attention(1, 2048);
    attention(1, 32768);
  }
  time(fmt::format("silu_mul {}x{}", rows, inter),
       [&] { return LaunchSiluMul(gu.as<bf16>(), act.as<bf16>(), rows, inter, stream); });
  time(fmt::format("argmax {} x vocab", rows), [&] {
    return LaunchArgmax(logits.as<float>(), rows, c.vocab_size, tok.as<int32_t>(), stream);
  });
}

// The decode rows: 1/8/32/64 streams with 128-token prompts, one stream at a long context, and
// A/B rows whose kernels differ from `base` (the slice's options) in one KernelOptions field
// each: chosen again for the row (ReselectKernels: graphs recaptured; GEMM plans retuned when
// the GEMM options differ), then back to `base`.
void DecodeRows(const ModelConfig& config, const Flags& flags, const KernelOptions& base,
                int long_ctx, CudaModelSlice& slice, Bench& bench, std::vector<Row>* rows_out) {
  std::vector<Row>& rows = *rows_out;
  const int steps = flags.quick ? 16 : 64;
  auto decode_row = [&](const std::string& name, int streams, int prompt, int n_steps,
                        const std::string& note) {
    auto r = bench.Decode(streams, prompt, n_steps, 3);
    if (!r.ok()) {
      rows.push_back({name, 0, 0, "error", std::string(r.status().message())});
      return;
    }
    const double step_s = streams / r->first;
    const double bytes = WeightBytes(config) +
                         streams * r->second * KvBytesPerPosition(config, flags.kv_cache_dtype);
    rows.push_back({name, r->first, bytes / flags.bandwidth / step_s, "bandwidth", note});
    std::printf("%s: %.1f tok/s\n", name.c_str(), r->first);
    std::fflush(stdout);
  };
  // Runs `rows_fn` with the slice's kernels chosen for `options`; an error row if refused.
  const auto with_kernels = [&](const KernelOptions& options, const std::string& what,
                                auto&& rows_fn) {
    const absl::Status status = slice.ReselectKernels(options);
    if (!status.ok()) {
      rows.push_back({what, 0, 0, "error", std::string(status.message())});
      return;
    }
    rows_fn();
  };
  const auto variant = [&](auto&& change) {
    KernelOptions options = base;
    change(options);
    return options;
  };
  // A served run's batch sizes at its mean contexts: the prompt is sized so that the timed
  // steps' mean context (Decode: prompt + warm-up + steps / 2) is the run's.
  for (const auto& [streams, context] : flags.decode_at) {
    decode_row(fmt::format("decode {} @ ctx {}", streams, context), streams,
               std::max(1, context - 3 - steps / 2), steps, "a served run's batch and context");
  }
  if (flags.decode_at_only) return;
  for (int streams : {1, 8, 32, 64}) {
    if (flags.decode_only && streams != 1 && streams != 32) continue;
    decode_row(fmt::format("decode {} streams", streams), streams, 128, steps,
               "graphs, tuned GEMMs");
  }
  // Without moving the edges out of cuBLASLt kernels to launch completion (graph_edges.h).
  with_kernels(variant([](KernelOptions& o) { o.early_graph_launch = false; }), "decode late", [&] {
    for (int streams : {1, 32}) {
      decode_row(fmt::format("decode {} late", streams), streams, 128, steps,
                 "graphs, dependents after GEMMs launch at their end");
    }
  });
  // Without the decode fusions (KernelOptions::fuse_decode_kernels: at 1 stream the norms,
  // residual adds and QKV prepare folded into the GEMVs, at 32 the QKV prepare into the decode
  // attention), then with them again: an A/B inside one process.
  for (const bool fuse : {false, true}) {
    with_kernels(
        variant([&](KernelOptions& o) { o.fuse_decode_kernels = fuse; }), "decode fuse", [&] {
          for (int streams : {1, 32}) {
            decode_row(fmt::format("decode {} {}", streams, fuse ? "again" : "unfused"), streams,
                       128, steps, fuse ? "graphs, tuned GEMMs" : "graphs, no decode fusions");
          }
        });
  }
  // Split attention merged by a kernel, then by the attention kernel's last CTA: an A/B inside
  // one process.
  for (const bool merge : {false, true}) {
    with_kernels(
        variant([&](KernelOptions& o) { o.merge_splits_in_attention = merge; }), "decode merge",
        [&] {
          for (int streams : {1, 32}) {
            decode_row(
                fmt::format("decode {} {}", streams, merge ? "merged-in-cta" : "merge-kernel"),
                streams, 128, steps, merge ? "splits merged by the last CTA" : "a merge kernel");
          }
        });
  }
  // cuBLASLt against the skinny tensor-core GEMM at batch sizes above the GEMV's (tuning picks
  // per shape; off by default, skinny_max_rows 0 leaves it out), then with it asked for.
  for (const int skinny_rows : {0, kSkinnyMaxRows}) {
    with_kernels(
        variant([&](KernelOptions& o) { o.skinny_max_rows = skinny_rows; }), "decode skinny", [&] {
          for (int streams : {8, 32, 64}) {
            if (flags.decode_only && streams != 32) continue;
            decode_row(
                fmt::format("decode {} {}", streams, skinny_rows > 0 ? "skinny" : "no-skinny"),
                streams, 128, steps,
                skinny_rows > 0 ? "graphs, tuned with skinny GEMM" : "graphs, tuned without");
          }
        });
  }
  // GEMM tuning that times with the weights left in L2 by the call before (as back-to-back timing
  // does) against cold-cache tuning, alternating twice.
  for (const bool cold : {false, true, false, true}) {
    with_kernels(
        variant([&](KernelOptions& o) { o.tune_cold_cache = cold; }), "decode tuning", [&] {
          decode_row(fmt::format("decode 32 {}-tuned", cold ? "cold" : "warm"), 32, 128, steps,
                     cold ? "graphs, tuned with L2 evicted" : "graphs, tuned with L2 warm");
        });
  }
  if (!slice.ReselectKernels(base).ok()) return;
  if (flags.decode_only) return;
  decode_row("decode 1 @ 32k ctx", 1, long_ctx, flags.quick ? 8 : 32, "graphs, split-K");
  // Variants for the report: untuned GEMMs (cuBLASLt's heuristic choice, GEMV at m = 1), and
  // no graphs.
  with_kernels(variant([](KernelOptions& o) { o.tune_gemms = false; }), "decode untuned", [&] {
    for (int streams : {1, 8, 32}) {
      decode_row(fmt::format("decode {} untuned", streams), streams, 128, steps / 2,
                 "graphs, heuristic GEMMs");
    }
  });
  if (!slice.ReselectKernels(base).ok()) return;
  slice.set_use_cuda_graphs(false);
  decode_row("decode 1 eager", 1, 128, steps / 2, "no graphs");
  decode_row("decode 32 eager", 32, 128, steps / 2, "no graphs");
  slice.set_use_cuda_graphs(flags.graphs);
  // Without programmatic dependent launch (graphs captured again without it).
  with_kernels(variant([](KernelOptions& o) { o.dependent_launch = false; }), "decode no-pdl", [&] {
    for (int streams : {1, 8, 32, 64}) {
      decode_row(fmt::format("decode {} no-pdl", streams), streams, 128, steps / 2,
                 "graphs, no dependent launch");
    }
  });
  (void)slice.ReselectKernels(base);
}

int Main(int argc, char** argv) {
  ParseCommandLineFlags(
      argc, argv,
      "One stage on one GPU: decode and prefill throughput against the bandwidth and "
      "compute bounds, per-shape GEMM and kernel tables.\nUsage: stage_bench [flags]");
  Flags flags;
  flags.model_dir = absl::GetFlag(FLAGS_model);
  flags.shape = absl::GetFlag(FLAGS_shape);
  flags.quick = absl::GetFlag(FLAGS_quick);
  flags.kernels_only = absl::GetFlag(FLAGS_kernels_only);
  flags.prefill_only = absl::GetFlag(FLAGS_prefill_only);
  flags.decode_only = absl::GetFlag(FLAGS_decode_only);
  flags.gemm_only = absl::GetFlag(FLAGS_gemm_only);
  flags.decode_at_only = absl::GetFlag(FLAGS_decode_at_only);
  if (const auto decode_at = ParseDecodeAt(absl::GetFlag(FLAGS_decode_at))) {
    flags.decode_at = *decode_at;
  } else {
    std::fprintf(stderr, "--decode_at: expected STREAMS@CONTEXT,... (e.g. 1@384,32@384)\n");
    return 2;
  }
  flags.graphs = absl::GetFlag(FLAGS_graphs);
  flags.decode_skip_prefill = absl::GetFlag(FLAGS_decode_skip_prefill);
  if (auto dtype = ParseKvCacheDtype(absl::GetFlag(FLAGS_kv_cache_dtype), "--kv_cache_dtype");
      dtype.ok()) {
    flags.kv_cache_dtype = *dtype;
  } else {
    std::fprintf(stderr, "%s\n", std::string(dtype.status().message()).c_str());
    return 2;
  }
  flags.bandwidth = absl::GetFlag(FLAGS_bandwidth_tbps) * 1e12;
  flags.peak = absl::GetFlag(FLAGS_peak_tflops) * 1e12;
  // The slice's kernels: the defaults but for the flags' overrides.
  KernelOptions kernels;
  kernels.prefill_key_tile_sm90 = absl::GetFlag(FLAGS_prefill_key_tile);
  kernels.fp8_gemm_sm90 = absl::GetFlag(FLAGS_fp8_gemm_wgmma);
  kernels.merge_splits_in_attention = absl::GetFlag(FLAGS_merge_splits_in_attention);
  if (const absl::Status valid = ValidateKernelOptions(kernels); !valid.ok()) {
    std::fprintf(stderr, "%s\n", std::string(valid.message()).c_str());
    return 2;
  }
  InitLogging("bench");
  ModelConfig config = ShapeConfig(flags.shape);
  if (flags.kernels_only) {
    const absl::StatusOr<KernelPlan> plan =
        SelectKernelsForDevice(0,
                               {.head_dim = config.head_dim,
                                .num_heads = config.num_heads,
                                .num_kv_heads = config.num_kv_heads},
                               kernels);
    if (!plan.ok()) {
      std::fprintf(stderr, "%s\n", plan.status().ToString().c_str());
      return 1;
    }
    std::string table;
    KernelTable(config, *plan, 32, 160, &table);
    std::fputs(table.c_str(), stdout);
    return 0;
  }
  const int long_ctx = flags.quick ? 4096 : 32768;
  CudaSliceOptions cuda{.kv_from_free_memory = true,
                        .memory_utilization = 0.90,
                        .max_batch_tokens = 8192,
                        .max_seqs = 256,
                        .max_model_len = std::max(long_ctx, 8192) + 1024,
                        .use_cuda_graphs = flags.graphs,
                        .kernels = kernels,
                        .random_quant = absl::GetFlag(FLAGS_quant),
                        .random_quant_group = absl::GetFlag(FLAGS_quant_group)};
  SliceOptions options{.model_dir = flags.model_dir,
                       .layers = {0, config.num_layers},
                       .kv_block_size = 16,
                       .kv_cache_dtype = flags.kv_cache_dtype};
  const auto t_load = Clock::now();
  absl::StatusOr<std::unique_ptr<CudaModelSlice>> slice_or =
      flags.model_dir.empty() ? CudaModelSlice::CreateRandom(config, options, cuda, 1234)
                              : CudaModelSlice::Load(options, cuda);
  if (!slice_or.ok()) {
    std::fprintf(stderr, "load failed: %s\n", slice_or.status().ToString().c_str());
    return 1;
  }
  CudaModelSlice& slice = **slice_or;
  config = slice.config();
  const double load_s = std::chrono::duration<double>(Clock::now() - t_load).count();
  const CudaMemoryReport mem = slice.memory();
  std::string header = fmt::format(
      "model {} ({}), {} layers, weights {:.2f} GB ({}), load {:.1f} s; KV {} {:.1f} GB = {} "
      "blocks x 16 = {} tokens, {:.0f} bytes per token; activations {:.2f} GB; device free {:.1f} "
      "/ {:.1f} GB\n",
      flags.model_dir.empty() ? "random" : flags.model_dir, flags.shape, config.num_layers,
      mem.weight_bytes / 1e9, flags.model_dir.empty() ? "random on GPU" : "loaded", load_s,
      KvCacheDtypeName(flags.kv_cache_dtype), mem.kv_bytes / 1e9, mem.kv_num_blocks,
      int64_t{mem.kv_num_blocks} * 16, KvBytesPerPosition(config, flags.kv_cache_dtype),
      mem.activation_bytes / 1e9, mem.device_free_bytes / 1e9, mem.device_total_bytes / 1e9);
  std::fputs(header.c_str(), stdout);
  std::fflush(stdout);

  Bench bench(slice, flags);
  std::vector<Row> rows;
  std::string gemm_table, kernel_table;
  std::string fused_table;
  std::printf("kernels: %s\n", slice.kernel_plan().Summary().c_str());
  FusedGemvTable(config, slice.kernel_plan(), flags.bandwidth, &fused_table);
  std::fputs(fused_table.c_str(), stdout);
  std::fflush(stdout);
  if (flags.decode_only || flags.decode_at_only) {
    DecodeRows(config, flags, kernels, long_ctx, slice, bench, &rows);
    for (const Row& r : rows) std::printf("%-24s %12.1f\n", r.name.c_str(), r.value);
    return 0;
  }
  if (!flags.prefill_only) {
    GemmTable(config, slice.kernel_plan(), slice.gemm(), flags.bandwidth, &gemm_table);
    std::fputs(gemm_table.c_str(), stdout);
    std::fflush(stdout);
    if (flags.gemm_only) return 0;

    KernelTable(config, slice.kernel_plan(), 1, 256, &kernel_table);
    KernelTable(config, slice.kernel_plan(), 32, 160, &kernel_table);
    std::fputs(kernel_table.c_str(), stdout);
    std::fflush(stdout);

    DecodeRows(config, flags, kernels, long_ctx, slice, bench, &rows);
  }

  // The prefill breakdown (its own GEMM runner: the rows below keep the slice's untuned
  // prefill plans, as a serving stage runs them).
  std::string prefill_table;
  PrefillTable(config, slice.kernel_plan(), {2048, 8192}, &prefill_table);
  std::fputs(prefill_table.c_str(), stdout);
  std::fflush(stdout);
  // Whole prompts in one chunk, and an 8k prompt in 4k and 2k chunks (a coordinator token
  // budget of 4096 or 2048: each chunk attends to the cached chunks before it); on sm_90 the
  // whole prompts again with the attention's 64-key tiles.
  const auto prefill_row = [&](int length, int chunk, const std::string& note, bool name_key_tile) {
    auto r = bench.Prefill(length, flags.quick ? 1 : 3, chunk);
    std::string name = chunk > 0 ? fmt::format("prefill {} in {}s", length, chunk)
                                 : fmt::format("prefill {}", length);
    if (name_key_tile) name += fmt::format(" k{}", slice.kernel_plan().prefill_key_tile);
    if (!r.ok()) {
      rows.push_back({name, 0, 0, "error", std::string(r.status().message())});
      return;
    }
    const double seconds = length / *r;
    rows.push_back(
        {name, *r, PrefillFlops(config, length) / flags.peak / seconds, "compute", note});
    std::printf("%s: %.1f tok/s\n", name.c_str(), *r);
    std::fflush(stdout);
  };
  for (const auto& [length, chunk] :
       {std::pair{2048, 0}, std::pair{8192, 0}, std::pair{8192, 4096}, std::pair{8192, 2048}}) {
    prefill_row(length, chunk, chunk > 0 ? "chunked prefill" : "one chunk", false);
  }
  if (slice.kernel_plan().prefill_attention == PrefillAttentionKernel::kWgmmaSm90) {
    KernelOptions other = kernels;
    other.prefill_key_tile_sm90 = kernels.prefill_key_tile_sm90 == 128 ? 64 : 128;
    if (slice.ReselectKernels(other).ok()) {
      for (int length : {2048, 8192}) prefill_row(length, 0, "one chunk, other key tile", true);
      (void)slice.ReselectKernels(kernels);
    }
  }

  std::string table = header + gemm_table + kernel_table + prefill_table;
  table +=
      fmt::format("{:<24} {:>12} {:>9} {:>10}  {}\n", "case", "tok/s", "of bound", "bound", "note");
  for (const Row& r : rows) {
    table += fmt::format("{:<24} {:>12.1f} {:>8.1f}% {:>10}  {}\n", r.name, r.value,
                         100 * r.fraction, r.bound, r.note);
  }
  std::fputs("\n", stdout);
  std::fputs(table.c_str(), stdout);
  return 0;
}

}  // namespace
}  // namespace ringserve::cuda

int main(int argc, char** argv) { return ringserve::cuda::Main(argc, argv); }
