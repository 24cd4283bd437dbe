// `ringserve_predict_multigpu`: what rings of 2, 4 and 8 GPUs should serve, predicted by the ring
// simulator (coordinator/scheduler/ring_simulator.h: the real Scheduler in a discrete-event
// ring) fed with per-stage costs derived from what ONE H200 measured (bench/cuda/NOTES.md run 12,
// bench/ring/NOTES.md run 10). CPU only; prints markdown tables (bench/ring/MULTIGPU_PREDICTION.md
// says how to read them and what a real run must compare).
//
//   ringserve_predict_multigpu [--stage-overhead-ms X] [--turnaround-ms X | --calibrate]
//       [--duration-s S] [--sensitivity] [--quick]
//
// Cost model (all times in ms):
//   - Whole-model step time T(n) for a micro-batch of n tokens, measured with `stage_bench`
//     (one process, CUDA graphs, 128-token prompts): decode n = 1, 8, 32, 64 and prefill
//     n = 2048, 8192 (tok/s -> ms per step = n / tok/s).
//   - The head (final norm, lm_head, sampling) reads the 1.05 GB lm_head once a step: h = 1.05 GB
//     at 95% of the measured 4.28 TB/s copy bandwidth. One layer: l(n) = (T(n) - h) / 32,
//     interpolated linearly in n between the measured points (and extrapolated past them).
//   - A stage with k layers spends overhead + k * l(n) on a micro-batch of n tokens, plus h when
//     it is the last stage. `overhead` (default 0.05) is what a stage step costs beyond its
//     layers in a ring (graph start after the input's wait, metadata upload).
//   - A hop between stages: alpha + bytes / beta, bytes = n * 4096 * 4 (the residual stream goes
//     as fp32), on its own stream (overlaps the sender's next micro-batch). NVLink: alpha 0.015,
//     beta 350 GB/s. PCIe x4 (Gen5): alpha 0.025, beta 12 GB/s.
//   - The last stage back to the coordinator and the next plan to stage 0: one turnaround r,
//     calibrated so that the simulated 1-GPU ring at 1 stream serves what the real one served
//     (206.9 tok/s; bench/ring/NOTES.md run 10).
//   - Clients: closed loop, 128-token distinct prompts, 96 output tokens (ignore EOS), as
//     bench/ring/device_run.sh drives ringserve_loadgen; tok/s counted over [warm-up, end).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "coordinator/scheduler/ring_simulator.h"
#include "coordinator/scheduler/scheduler.h"
#include "fmt/format.h"

namespace ringserve {
namespace {

constexpr int kLayers = 32;         // Llama-3.1-8B
constexpr int kHidden = 4096;       // residual stream width
constexpr int kPromptTokens = 128;  // bench/ring/device_run.sh
constexpr int kOutputTokens = 96;

// One H200, `stage_bench` run 12 (bench/cuda/NOTES.md): tokens per micro-batch -> tok/s of the
// whole 32-layer model. Decode: the middle of the rows of nine device calls; prefill likewise.
struct Point {
  double tokens;
  double tok_per_s;
};
constexpr Point kMeasured[] = {
    {1, 236.0},       // 234.0-238.1
    {8, 1640.0},      // 1,588-1,666
    {32, 6356.0},     // 6,290-6,442, median 6,356
    {64, 11600.0},    // 11,544-11,763
    {2048, 41000.0},  // prefill 2k: 39,292-42,839
    {8192, 35900.0},  // prefill 8k: 34,983-37,013
};
constexpr double kHeadMs = 1.0507e9 / (0.95 * 4.28e12) * 1e3;  // lm_head bytes at 95% of copy bw
constexpr double kOneGpuRingTokPerS = 206.9;  // 1-stage ring, 1 stream (bench/ring run 10)
constexpr double kOneGpuRing32TokPerS = 4613.0;

// One layer's time (ms) for a micro-batch of n tokens: piecewise linear through the points.
double LayerMs(double n) {
  constexpr int kCount = sizeof(kMeasured) / sizeof(kMeasured[0]);
  auto layer_at = [](int i) {
    return (kMeasured[i].tokens / kMeasured[i].tok_per_s * 1e3 - kHeadMs) / kLayers;
  };
  int i = 0;
  while (i + 2 < kCount && n > kMeasured[i + 1].tokens) ++i;
  const double x0 = kMeasured[i].tokens, x1 = kMeasured[i + 1].tokens;
  const double y0 = layer_at(i), y1 = layer_at(i + 1);
  return std::max(0.0, y0 + (y1 - y0) * (n - x0) / (x1 - x0));
}

struct Link {
  const char* name;
  double alpha_ms;
  double bytes_per_ms;
};
constexpr Link kNvlink{"NVLink", 0.015, 350e9 / 1e3};
constexpr Link kPcieX4{"PCIe x4", 0.025, 12e9 / 1e3};

struct Setup {
  int gpus = 1;  // stages, one per GPU
  int streams = 1;
  DecodePacking packing = DecodePacking::kSpread;
  Link link = kNvlink;
  double overhead_ms = 0.05;
  double turnaround_ms = 0.5;            // per plan back at the coordinator
  double turnaround_per_token_ms = 0.0;  // and per token sampled in it
  std::vector<int> layers;               // per stage; empty: even (earlier stages take the rest)
  int extra_micro_batches = 0;           // in flight beyond one per GPU
  // The hop also occupies the receiving stage (the nccl channel as written receives straight
  // into the stage's one input buffer, so a transfer waits for the receiver's previous step).
  bool hop_blocks_receiver = false;
  // What-if: a layer's time proportional to the tokens (a compute-bound stage, e.g. a CPU),
  // l(n) = l(8) * n / 8, instead of the measured curve.
  bool proportional = false;
  double warm_ms = 500;
  double duration_ms = 3000;
};

struct Outcome {
  double tok_per_s = 0;
  double itl_p50_ms = 0;
  std::vector<double> busy;
  double hop_ms_decode = 0;  // one hop of a micro-batch of `streams / gpus` decodes
  size_t violations = 0;
};

std::vector<int32_t> Prompt(uint64_t seq_id) {
  std::vector<int32_t> prompt(kPromptTokens);
  uint64_t x = seq_id * 0x9E3779B97F4A7C15ull + 1;
  for (int32_t& t : prompt) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    t = static_cast<int32_t>(1000 + (x >> 33) % 120000);
  }
  return prompt;
}

SimRequest Request(uint64_t seq_id, double arrival) {
  SimRequest request;
  request.seq_id = seq_id;
  request.arrival_time = arrival;
  request.prompt = Prompt(seq_id);
  request.params.max_tokens = kOutputTokens;
  request.params.ignore_eos = true;
  return request;
}

double HopMs(const Link& link, int64_t tokens) {
  return link.alpha_ms + static_cast<double>(tokens) * kHidden * 4 / link.bytes_per_ms;
}

Outcome Simulate(const Setup& setup) {
  const int stages = setup.gpus;
  std::vector<int> layers = setup.layers;
  if (layers.empty()) {
    layers.assign(stages, kLayers / stages);
    for (int s = 0; s < kLayers % stages; ++s) ++layers[s];
  }

  SchedulerOptions options;
  options.num_stages = stages;
  // One per GPU (ring_config.h's default), unless asked for more (rings of several GPUs only:
  // the 1-GPU baseline stays as served).
  options.max_micro_batches_in_flight = stages + (stages > 1 ? setup.extra_micro_batches : 0);
  options.kv_num_blocks = 8192;
  options.max_running_sequences = 256;
  options.decode_packing = setup.packing;
  Scheduler scheduler(options);

  RingSimOptions sim;
  sim.num_stages = stages;
  sim.check_invariants = false;  // checked by the scheduler's own tests; slow here
  sim.stage_cost = [&](int stage, const MicroBatchPlan& plan) {
    const double n = static_cast<double>(plan.num_tokens());
    const double hop =
        setup.hop_blocks_receiver && stage > 0 ? HopMs(setup.link, plan.num_tokens()) : 0.0;
    const double layer = setup.proportional ? LayerMs(8) * n / 8 : LayerMs(n);
    return setup.overhead_ms + hop + layers[stage] * layer + (stage == stages - 1 ? kHeadMs : 0.0);
  };
  sim.hop_cost = [&](int stage, const MicroBatchPlan& plan) {
    if (stage + 1 < stages) return HopMs(setup.link, plan.num_tokens());
    return setup.turnaround_ms + setup.turnaround_per_token_ms * plan.num_sampled();
  };
  const double stop = setup.warm_ms + setup.duration_ms;
  uint64_t next_id = setup.streams + 1;
  sim.on_finish = [&](uint64_t, double time) {
    std::vector<SimRequest> more;
    if (time < stop) more.push_back(Request(next_id++, time));
    return more;
  };
  std::vector<SimRequest> requests;
  for (int i = 1; i <= setup.streams; ++i) requests.push_back(Request(i, 0.0));
  SimResult result = SimulateRing(scheduler, sim, std::move(requests), stop * 10);

  Outcome out;
  out.violations = result.violations.size();
  for (const std::string& v : result.violations) std::fprintf(stderr, "violation: %s\n", v.c_str());
  const double from = setup.warm_ms, to = stop;
  out.tok_per_s = result.TokensBetween(from, to) / (to - from) * 1e3;
  for (int s = 0; s < stages; ++s) out.busy.push_back(result.BusyTime(s, from, to) / (to - from));
  std::vector<double> gaps;
  for (const auto& [id, request] : result.requests) {
    for (size_t i = 1; i < request.token_times.size(); ++i) {
      if (request.token_times[i - 1] >= from && request.token_times[i] < to) {
        gaps.push_back(request.token_times[i] - request.token_times[i - 1]);
      }
    }
  }
  if (!gaps.empty()) {
    std::nth_element(gaps.begin(), gaps.begin() + gaps.size() / 2, gaps.end());
    out.itl_p50_ms = gaps[gaps.size() / 2];
  }
  out.hop_ms_decode = stages > 1 ? HopMs(setup.link, (setup.streams + stages - 1) / stages) : 0.0;
  return out;
}

// Sets the turnaround (per plan and per sampled token) so that the simulated 1-GPU ring serves
// what the real one served at 1 and at 32 streams.
void CalibrateTurnaround(Setup* base) {
  auto bisect = [&](int streams, double target, double* knob, double hi) {
    double lo = 0;
    for (int i = 0; i < 30; ++i) {
      Setup s = *base;
      s.gpus = 1;
      s.streams = streams;
      *knob = (lo + hi) / 2;
      s.turnaround_ms = base->turnaround_ms;
      s.turnaround_per_token_ms = base->turnaround_per_token_ms;
      (Simulate(s).tok_per_s > target ? lo : hi) = *knob;
    }
    *knob = (lo + hi) / 2;
  };
  base->turnaround_per_token_ms = 0;
  for (int round = 0; round < 3; ++round) {
    bisect(1, kOneGpuRingTokPerS, &base->turnaround_ms, 5.0);
    bisect(32, kOneGpuRing32TokPerS, &base->turnaround_per_token_ms, 0.2);
  }
}

// Layers per stage that even out the stages' times for a decode micro-batch of `tokens`: the
// last stage also runs the head, so it takes fewer layers. Least maximum stage time; among
// equals, the least sum of squared stage times (fewest stages at the maximum).
std::vector<int> BalancedLayers(int stages, int tokens, double overhead_ms) {
  std::vector<int> best;
  double best_max = 1e300, best_squares = 1e300;
  for (int last = 1; last <= kLayers / stages; ++last) {
    const int rest = kLayers - last;
    std::vector<int> layers(stages - 1, rest / (stages - 1));
    for (int s = 0; s < rest % (stages - 1); ++s) ++layers[s];
    layers.push_back(last);
    double max_cost = 0, squares = 0;
    for (int s = 0; s < stages; ++s) {
      const double cost =
          overhead_ms + layers[s] * LayerMs(tokens) + (s == stages - 1 ? kHeadMs : 0.0);
      max_cost = std::max(max_cost, cost);
      squares += cost * cost;
    }
    if (max_cost < best_max - 1e-9 || (max_cost < best_max + 1e-9 && squares < best_squares)) {
      best_max = max_cost;
      best_squares = squares;
      best = layers;
    }
  }
  return best;
}

std::string LayersText(const std::vector<int>& layers) {
  std::string text;
  for (int l : layers) text += fmt::format("{}{}", text.empty() ? "" : ",", l);
  return text;
}

std::string Busy(const std::vector<double>& busy) {
  std::string text;
  for (double b : busy) text += fmt::format("{}{:.2f}", text.empty() ? "" : " ", b);
  return text;
}

int Usage(const char* message) {
  std::fprintf(stderr,
               "ringserve_predict_multigpu: %s\nusage: ringserve_predict_multigpu "
               "[--stage-overhead-ms X] [--turnaround-ms X] [--duration-s S] [--sensitivity] "
               "[--quick]\n",
               message);
  return 2;
}

int Main(int argc, char** argv) {
  Setup base;
  bool fixed_turnaround = false;
  bool sensitivity = false;
  std::vector<int> streams = {1, 8, 32, 64};
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> double {
      if (i + 1 >= argc) return NAN;
      char* end = nullptr;
      const double v = std::strtod(argv[++i], &end);
      return (end != nullptr && *end == '\0' && v >= 0) ? v : NAN;
    };
    if (arg == "--stage-overhead-ms") {
      base.overhead_ms = value();
      if (std::isnan(base.overhead_ms)) return Usage("--stage-overhead-ms needs a number >= 0");
    } else if (arg == "--turnaround-ms") {
      base.turnaround_ms = value();
      fixed_turnaround = true;
      if (std::isnan(base.turnaround_ms)) return Usage("--turnaround-ms needs a number >= 0");
    } else if (arg == "--duration-s") {
      const double s = value();
      if (std::isnan(s) || s <= 0) return Usage("--duration-s needs a number > 0");
      base.duration_ms = s * 1e3;
    } else if (arg == "--sensitivity") {
      sensitivity = true;
    } else if (arg == "--quick") {
      base.duration_ms = 1000;
      base.warm_ms = 300;
    } else {
      return Usage(("unknown flag " + arg).c_str());
    }
  }
  if (!fixed_turnaround) CalibrateTurnaround(&base);

  std::printf("## Cost model\n\n| micro-batch tokens | one layer ms | 32 layers + head ms |\n");
  std::printf("| ---: | ---: | ---: |\n");
  for (int n : {1, 8, 16, 32, 64, 128, 192, 2048}) {
    std::printf("| %d | %.4f | %.3f |\n", n, LayerMs(n), kLayers * LayerMs(n) + kHeadMs);
  }
  std::printf(
      "\nhead (final norm + lm_head) %.3f ms; stage overhead %.3f ms a micro-batch; "
      "turnaround %.3f ms a plan + %.4f ms a sampled token (%s); hop of one decode token: NVLink "
      "%.4f ms, PCIe x4 %.4f ms\n",
      kHeadMs, base.overhead_ms, base.turnaround_ms, base.turnaround_per_token_ms,
      fixed_turnaround ? "given"
                       : "calibrated on the 1-GPU ring's 206.9 and 4,613.0 tok/s at 1 and 32 "
                         "streams",
      HopMs(kNvlink, 1), HopMs(kPcieX4, 1));
  {
    Setup check = base;
    for (int n : {1, 32}) {
      check.streams = n;
      std::printf("check: the 1-GPU ring at %d streams, simulated %.1f tok/s, measured %.1f\n", n,
                  Simulate(check).tok_per_s, n == 1 ? kOneGpuRingTokPerS : kOneGpuRing32TokPerS);
    }
  }

  std::vector<double> one_gpu(65, 0);
  size_t violations = 0;
  for (const Link& link : {kNvlink, kPcieX4}) {
    std::printf("\n## Llama-3.1-8B shape, one stage per GPU, hops over %s\n\n", link.name);
    std::printf(
        "| GPUs | streams | packing | tok/s | of 1 GPU | ITL p50 ms | decode hop ms | busy per "
        "stage |\n| ---: | ---: | --- | ---: | ---: | ---: | ---: | --- |\n");
    for (int gpus : {1, 2, 4, 8}) {
      const std::vector<int> balanced =
          gpus > 1 ? BalancedLayers(gpus, (64 + gpus - 1) / gpus, base.overhead_ms)
                   : std::vector<int>();
      for (int n : streams) {
        for (int variant = 0; variant < 3; ++variant) {
          if (gpus == 1 && variant > 0) continue;  // packed is the same with M = 1
          Setup s = base;
          s.gpus = gpus;
          s.streams = n;
          s.packing = variant == 1 ? DecodePacking::kPacked : DecodePacking::kSpread;
          if (variant == 2) s.layers = balanced;
          s.link = link;
          const Outcome o = Simulate(s);
          violations += o.violations;
          if (gpus == 1) one_gpu[n] = o.tok_per_s;
          const std::string name =
              gpus == 1
                  ? "-"
                  : (variant == 0
                         ? "spread"
                         : (variant == 1 ? "packed" : "spread, layers " + LayersText(balanced)));
          std::printf("| %d | %d | %s | %.1f | %.2fx | %.2f | %.3f | %s |\n", gpus, n, name.c_str(),
                      o.tok_per_s, o.tok_per_s / one_gpu[n], o.itl_p50_ms, o.hop_ms_decode,
                      Busy(o.busy).c_str());
        }
      }
    }
  }

  // balanced: each ring's layers from BalancedLayers (the last stage lighter); packed keeps the
  // even partition.
  // first_only: the spread / packed column alone (a what-if whose 1-GPU baseline changes too).
  auto targets = [&](const Setup& b, const std::string& label, bool balanced,
                     bool first_only = false) {
    auto layers = [&](int gpus) {
      return balanced ? BalancedLayers(gpus, (64 + gpus - 1) / gpus, b.overhead_ms)
                      : std::vector<int>();
    };
    Setup s = b;
    s.gpus = 8;
    s.streams = 8;
    s.layers = layers(8);
    const double spread = Simulate(s).tok_per_s;
    s.packing = DecodePacking::kPacked;
    s.layers.clear();
    const double packed = Simulate(s).tok_per_s;
    if (first_only) {
      std::printf("| %s | %.2fx | - | - | - |\n", label.c_str(), spread / packed);
      return;
    }
    s.packing = DecodePacking::kSpread;
    s.streams = 64;
    s.layers = layers(8);
    const Outcome busy64 = Simulate(s);
    s.gpus = 2;
    s.layers = layers(2);
    const double two = Simulate(s).tok_per_s;
    s.gpus = 1;
    s.layers.clear();
    const double one = Simulate(s).tok_per_s;
    s.gpus = 2;
    s.streams = 128;
    s.layers = layers(2);
    const double two128 = Simulate(s).tok_per_s;
    std::printf("| %s | %.2fx | %.2f | %.2fx | %.2fx |\n", label.c_str(), spread / packed,
                *std::min_element(busy64.busy.begin(), busy64.busy.end()), two / one, two128 / one);
  };
  std::printf(
      "\n## Targets of issue 25\n\n| setting | 8 GPUs, 8 streams: spread / packed (>= 1.9x) | "
      "8 GPUs, 64 streams: least busy stage (>= 0.85) | 2 GPUs / 1 GPU at 64 streams (>= 1.8x) "
      "| 2 GPUs at 128 / 1 GPU at 64 |\n| --- | ---: | ---: | ---: | ---: |\n");
  for (const Link& link : {kNvlink, kPcieX4}) {
    Setup s = base;
    s.link = link;
    targets(s, fmt::format("{}, even layers", link.name), false);
    targets(s,
            fmt::format("{}, balanced layers (8 GPUs: {}; 2: {})", link.name,
                        LayersText(BalancedLayers(8, 8, s.overhead_ms)),
                        LayersText(BalancedLayers(2, 32, s.overhead_ms))),
            true);
  }
  if (sensitivity) {
    for (double overhead : {0.0, 0.1, 0.2}) {
      Setup s = base;
      s.overhead_ms = overhead;
      targets(s, fmt::format("NVLink, even, stage overhead {:.2f} ms", overhead), false);
    }
    for (double scale : {0.0, 2.0}) {
      Setup s = base;
      s.turnaround_ms *= scale;
      s.turnaround_per_token_ms *= scale;
      targets(s, fmt::format("NVLink, even, turnaround x{:.0f}", scale), false);
    }
    {
      Setup s = base;
      s.link = Link{"NVLink x10 latency", 0.15, kNvlink.bytes_per_ms};
      targets(s, "NVLink, even, hop alpha 0.15 ms", false);
    }
    for (const Link& link : {kNvlink, kPcieX4}) {
      Setup s = base;
      s.link = link;
      s.hop_blocks_receiver = true;
      targets(s, fmt::format("{}, even, hop on the receiver's critical path", link.name), false);
    }
    {
      Setup s = base;
      s.proportional = true;
      targets(s, "NVLink, even, what-if: layer time proportional to tokens", false,
              /*first_only=*/true);
    }
    {
      Setup s = base;
      s.extra_micro_batches = 1;
      targets(s, "NVLink, balanced, one micro-batch more than GPUs in flight", true);
    }
  }
  if (violations > 0) {
    std::fprintf(stderr, "%zu simulator violations (see above)\n", violations);
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace ringserve

int main(int argc, char** argv) { return ringserve::Main(argc, argv); }
