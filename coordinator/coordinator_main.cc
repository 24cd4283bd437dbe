// `coordinator`: the ring's coordinator process.
//
//   coordinator --stages hosts.yaml [--listen HOST:PORT]
//       Reads and validates hosts.yaml (coordinator/hosts/ring_config.h), connects to every
//       stage (bounded wait), configures them, and serves the gRPC Generate API.
//   coordinator [--model DIR] [--num_stages N | --partition 8x4|auto] [--device cpu|cuda:N]
//               [--channel tcp|cuda_ipc] [--listen HOST:PORT]
//       The embedded default: starts local `stage` processes (the binary next to this one),
//       all on one device (several CUDA stages may share one GPU over cuda_ipc), and serves;
//       the stages exit with the coordinator. `--partition auto` first times each layer on the
//       device (`stage --probe_layers`) and splits the layers over --num_stages stages so that
//       the slowest stage's measured decode step is shortest while each stage's layers fit
//       its share of the device's memory, and prints the split and why
//       (coordinator/measured_partition.h).
//
// Other flags (--help lists them all with their defaults): --http_listen HOST:PORT (the OpenAI
// HTTP API, /metrics and the dashboard; overrides hosts.yaml's api.http), --kv_cache_dtype
// auto|fp8_e4m3 (every stage's KV cache; overrides hosts.yaml's), --connect_timeout
// SECONDS (default 10), --stall_timeout SECONDS (default 10: a ring with work that makes no
// progress that long fails and is formed again; 0 = no watchdog), --stage_binary PATH, --packing
// spread|packed, --plan_ahead=false (plan each step only once the previous one's tokens are back),
// --prefix_caching=false (every prompt computed in full), --ready_fd N (writes the bound API
// address and a newline once serving). The HTTP front starts before the ring and shows each stage's
// load progress on /dashboard (503 until the ring is up). Exits 0 on SIGINT/SIGTERM; exits 3 when
// the ring becomes unhealthy (a stage failed), so that a supervisor restarts it; 1 when start-up
// fails.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_join.h"
#include "common/flags.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "coordinator/generate_service.h"
#include "coordinator/grpc_ring_engine.h"
#include "coordinator/hosts/ring_config.h"
#include "coordinator/http/http_api.h"
#include "coordinator/http/starting_engine.h"
#include "coordinator/local_stages.h"
#include "coordinator/measured_partition.h"
#include "fmt/format.h"
#include "grpcpp/grpcpp.h"
#include "ring/defaults.h"
#include "ring/model_config.h"

#ifndef RINGSERVE_DEFAULT_MODEL_DIR
#define RINGSERVE_DEFAULT_MODEL_DIR "models/ringserve-tiny"
#endif

ABSL_FLAG(std::string, stages, "",
          "hosts.yaml describing the ring (coordinator/hosts/ring_config.h); empty: start local "
          "stages (the embedded default)");
ABSL_FLAG(std::string, listen, "", "gRPC Generate API address HOST:PORT (default: hosts.yaml's)");
ABSL_FLAG(std::string, http_listen, "",
          "OpenAI HTTP API, /metrics and dashboard address HOST:PORT (overrides hosts.yaml's "
          "api.http; empty: none)");
ABSL_FLAG(std::string, api_key_file, "",
          "file holding the Bearer key for /v1/* and gRPC (empty: no key)");
ABSL_FLAG(bool, protect_metrics, false, "/metrics and /dashboard/data need the API key too");
ABSL_FLAG(std::string, model, RINGSERVE_DEFAULT_MODEL_DIR,
          "model directory for the embedded default ring");
ABSL_FLAG(int, num_stages, 2, "local stages, layers split evenly (embedded default)");
ABSL_FLAG(std::string, partition, "",
          "layers per local stage, e.g. 8x4 or 10,10,12 (instead of --num_stages), or auto: "
          "--num_stages stages balancing layer weight parameters (MoE layers count every expert)");
ABSL_FLAG(std::string, device, "cpu", "device of the local stages: cpu or cuda:N");
ABSL_FLAG(std::string, channel, "tcp",
          "activation channel between local stages: tcp, cuda_ipc, nccl");
ABSL_FLAG(std::string, kv_cache_dtype, "",
          "every stage's KV cache: auto (the model's type) or fp8_e4m3 (empty: hosts.yaml's, "
          "else auto)");
ABSL_FLAG(int, max_batch_tokens, 0, "scheduler tokens per micro-batch (0: the default)");
ABSL_FLAG(int, micro_batches, 0, "scheduler micro-batches in flight (0: the default)");
ABSL_FLAG(double, connect_timeout, ringserve::kDefaultConnectTimeoutSeconds,
          "seconds to wait for each stage at start-up");
ABSL_FLAG(double, ring_down_timeout, ringserve::kDefaultRingDownTimeoutSeconds,
          "seconds a failed ring may take to form again before the coordinator gives up");
ABSL_FLAG(double, stall_timeout, ringserve::kDefaultStallTimeoutSeconds,
          "seconds a ring with work may make no progress (no stage finishing a step, computing "
          "or moving activation bytes) before it fails and is formed again (0: never)");
ABSL_FLAG(std::string, stage_binary, "",
          "stage binary for local stages (default: `stage` next to this binary)");
ABSL_FLAG(std::string, packing, "spread", "scheduler packing: spread or packed");
ABSL_FLAG(bool, plan_ahead, true,
          "plan each micro-batch's next step while it runs; stage 0 gets the sampled tokens "
          "from the last stage (coordinator/plan_ahead.h)");
ABSL_FLAG(bool, prefix_caching, true,
          "reuse the KV blocks of prompt prefixes computed before (false: A/B runs)");
ABSL_FLAG(std::string, speculative_model, "",
          "speculative decoding: a draft model directory (same tokenizer), run on the last stage");
ABSL_FLAG(bool, speculative_mtp, false,
          "speculative decoding with a DeepSeek checkpoint's MTP layer (CPU or CUDA last stage, 1 "
          "draft)");
ABSL_FLAG(int, num_speculative_tokens, 4, "speculative decoding: drafts per step at most (1-16)");
ABSL_FLAG(int, speculative_max_sequences, 16,
          "speculative decoding backs off while more sequences than this decode at once");
ABSL_FLAG(bool, speculative_payoff, true,
          "speculative decoding only where it measures faster than plain decoding "
          "(coordinator/scheduler/speculation_payoff.h); false: whenever drafts are asked for");
ABSL_FLAG(int, ready_fd, -1,
          "file descriptor to write the bound API address and a newline to once serving");

namespace ringserve {
namespace {

constexpr char kUsage[] =
    "The ring's coordinator: connects and configures the stages, serves the Generate API.\n"
    "usage: coordinator --stages=hosts.yaml [--listen=HOST:PORT] [--connect_timeout=S]\n"
    "                   [--ring_down_timeout=S]\n"
    "       coordinator [--model=DIR] [--num_stages=N | --partition=SPEC|auto] "
    "[--device=cpu|cuda:N]\n"
    "                   [--channel=tcp|cuda_ipc|nccl] [--max_batch_tokens=N] "
    "[--micro_batches=M] [--listen=HOST:PORT]";

struct Flags {
  std::string stages_file;
  std::string listen;
  std::string http_listen;
  std::string api_key_file;      // empty: the HTTP API needs no key
  bool protect_metrics = false;  // --protect_metrics: /metrics needs the API key too
  std::string model_dir;
  int num_stages = 2;
  std::vector<int> partition;   // --partition; empty = --num_stages even split
  bool partition_auto = false;  // --partition auto: balance layer parameters over --num_stages
  Device device;
  ChannelKind channel = ChannelKind::kTcp;
  std::optional<KvCacheDtype> kv_cache_dtype;  // --kv_cache_dtype; unset = hosts.yaml's / auto
  int max_batch_tokens = 0;  // --max_batch_tokens: scheduler max_tokens_per_micro_batch
  int micro_batches = 0;     // --micro_batches: scheduler micro_batches_in_flight
  double connect_timeout_s = kDefaultConnectTimeoutSeconds;
  double ring_down_timeout_s = kDefaultRingDownTimeoutSeconds;
  double stall_timeout_s = kDefaultStallTimeoutSeconds;
  std::string stage_binary;
  std::string packing = "spread";
  bool plan_ahead = true;
  bool prefix_caching = true;
  SpeculationBringUp speculation;
  int speculative_max_sequences = 16;
  bool speculative_payoff = true;
  int ready_fd = -1;
};

// The flags' values, checked (the flags themselves are parsed by ParseCommandLineFlags).
absl::StatusOr<Flags> ReadFlags() {
  Flags flags;
  flags.stages_file = absl::GetFlag(FLAGS_stages);
  flags.listen = absl::GetFlag(FLAGS_listen);
  flags.http_listen = absl::GetFlag(FLAGS_http_listen);
  flags.api_key_file = absl::GetFlag(FLAGS_api_key_file);
  flags.protect_metrics = absl::GetFlag(FLAGS_protect_metrics);
  flags.model_dir = absl::GetFlag(FLAGS_model);
  flags.num_stages = absl::GetFlag(FLAGS_num_stages);
  if (const std::string spec = absl::GetFlag(FLAGS_partition); spec == "auto") {
    flags.partition_auto = true;
  } else if (!spec.empty()) {
    auto partition = ParsePartition(spec);
    if (!partition.ok()) {
      return absl::InvalidArgumentError(
          fmt::format("--partition: {}", std::string(partition.status().message())));
    }
    flags.partition = *partition;
  }
  if (const std::string spec = absl::GetFlag(FLAGS_device); !spec.empty()) {
    auto device = ParseDevice(spec);
    if (!device.ok()) {
      return absl::InvalidArgumentError(
          fmt::format("--device: {}", std::string(device.status().message())));
    }
    flags.device = *device;
  }
  const std::string channel_name = absl::GetFlag(FLAGS_channel);
  std::optional<ChannelKind> channel = ParseChannelKind(channel_name);
  if (!channel) {
    return absl::InvalidArgumentError(
        fmt::format("--channel: '{}' is not one of tcp, cuda_ipc, nccl", channel_name));
  }
  flags.channel = *channel;
  if (const std::string dtype = absl::GetFlag(FLAGS_kv_cache_dtype); !dtype.empty()) {
    RS_ASSIGN_OR_RETURN(flags.kv_cache_dtype, ParseKvCacheDtype(dtype, "--kv_cache_dtype"));
  }
  flags.max_batch_tokens = absl::GetFlag(FLAGS_max_batch_tokens);
  flags.micro_batches = absl::GetFlag(FLAGS_micro_batches);
  flags.connect_timeout_s = absl::GetFlag(FLAGS_connect_timeout);
  flags.ring_down_timeout_s = absl::GetFlag(FLAGS_ring_down_timeout);
  flags.stall_timeout_s = absl::GetFlag(FLAGS_stall_timeout);
  // The stages report their activity every quarter of the timeout (50 ms apart at least): under
  // a second, a report or two delayed on a busy host would fail a healthy ring.
  if (!(flags.stall_timeout_s == 0 ||
        (flags.stall_timeout_s >= 1 && flags.stall_timeout_s <= 86400))) {
    return absl::InvalidArgumentError(fmt::format(
        "--stall_timeout: {} is not 0 (never) or in [1, 86400] seconds", flags.stall_timeout_s));
  }
  flags.stage_binary = absl::GetFlag(FLAGS_stage_binary);
  flags.speculation.draft_model_dir = absl::GetFlag(FLAGS_speculative_model);
  flags.speculation.mtp = absl::GetFlag(FLAGS_speculative_mtp);
  flags.speculation.num_tokens = absl::GetFlag(FLAGS_num_speculative_tokens);
  flags.speculative_max_sequences = absl::GetFlag(FLAGS_speculative_max_sequences);
  flags.speculative_payoff = absl::GetFlag(FLAGS_speculative_payoff);
  if (flags.speculation.enabled() &&
      (flags.speculation.num_tokens < 1 || flags.speculation.num_tokens > 16)) {
    return absl::InvalidArgumentError(fmt::format("--num_speculative_tokens: {} is not in [1, 16]",
                                                  flags.speculation.num_tokens));
  }
  if (!flags.speculation.draft_model_dir.empty() && flags.speculation.mtp) {
    return absl::InvalidArgumentError(
        "--speculative_model and --speculative_mtp: choose one way to draft");
  }
  flags.packing = absl::GetFlag(FLAGS_packing);
  if (flags.packing != "spread" && flags.packing != "packed") {
    return absl::InvalidArgumentError("--packing: expected spread or packed");
  }
  flags.plan_ahead = absl::GetFlag(FLAGS_plan_ahead);
  flags.prefix_caching = absl::GetFlag(FLAGS_prefix_caching);
  flags.ready_fd = absl::GetFlag(FLAGS_ready_fd);
  return flags;
}

int Run(int argc, char** argv) {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGPIPE, SIG_IGN);
  InitLogging("coordinator");

  ParseCommandLineFlags(argc, argv, kUsage);
  auto flags = ReadFlags();
  if (!flags.ok()) {
    std::fprintf(stderr, "coordinator: %s (see --help)\n",
                 std::string(flags.status().message()).c_str());
    return 2;
  }
  auto fail = [](const absl::Status& status) {
    std::fprintf(stderr, "coordinator: %s\n", std::string(status.message()).c_str());
    return 1;
  };

  // The ring's description: the hosts file, or the embedded default with local stages.
  absl::StatusOr<RingConfig> ring;
  std::optional<LocalStages> local;
  auto layer_count = [](const std::string& dir) -> absl::StatusOr<int> {
    auto config = LoadModelConfig(dir);
    if (!config.ok()) return config.status();
    return config->num_layers;
  };
  if (!flags->stages_file.empty()) {
    ring = LoadRingConfig(flags->stages_file, layer_count);
    if (!ring.ok()) return fail(ring.status());
    if (!flags->listen.empty()) ring->grpc_listen = flags->listen;
    if (flags->kv_cache_dtype) {
      for (StageConfig& stage : ring->stages) stage.kv_cache_dtype = *flags->kv_cache_dtype;
    }
  } else {
    auto num_layers = layer_count(flags->model_dir);
    if (!num_layers.ok()) return fail(num_layers.status());
    DefaultRingOptions options;
    options.model_dir = flags->model_dir;
    options.num_layers = *num_layers;
    options.num_stages = flags->num_stages;
    options.partition = flags->partition;
    std::string binary = flags->stage_binary;
    if (binary.empty()) {
      auto found = FindStageBinary(argv[0]);
      if (!found.ok()) return fail(found.status());
      binary = *found;
    }
    if (flags->partition_auto) {
      std::fprintf(stderr, "coordinator: --partition auto: timing each layer on %s ...\n",
                   flags->device.ToString().c_str());
      auto measured = ProposeMeasuredPartition({.stage_binary = binary,
                                                .model_dir = flags->model_dir,
                                                .device = flags->device.ToString(),
                                                .num_stages = flags->num_stages});
      if (!measured.ok()) return fail(measured.status());
      std::fprintf(stderr, "coordinator: --partition auto: %s\n", measured->why.c_str());
      options.partition = measured->counts;
    }
    options.device = flags->device;
    options.channel = flags->channel;
    options.kv_cache_dtype = flags->kv_cache_dtype.value_or(KvCacheDtype::kAuto);
    options.max_tokens_per_micro_batch = flags->max_batch_tokens;
    options.micro_batches_in_flight = flags->micro_batches;
    if (!flags->listen.empty()) options.grpc_listen = flags->listen;
    ring = DefaultRingConfig(options);
    if (!ring.ok()) return fail(ring.status());
    std::fprintf(stderr, "coordinator: starting %d local stage(s) of %s on %s\n",
                 ring->num_stages(), binary.c_str(), ring->model_dir.c_str());
    // The stages may load the model and the draft model: the deepest directory holding both.
    std::string model_root;
    if (!flags->speculation.draft_model_dir.empty()) {
      std::filesystem::path root = std::filesystem::absolute(ring->model_dir).lexically_normal();
      const std::filesystem::path draft =
          std::filesystem::absolute(flags->speculation.draft_model_dir).lexically_normal();
      while (root.has_relative_path() &&
             std::mismatch(root.begin(), root.end(), draft.begin(), draft.end()).first !=
                 root.end()) {
        root = root.parent_path();
      }
      model_root = root.string();
    }
    auto launched = LocalStages::Launch(binary, *ring, absl::Seconds(30), model_root);
    if (!launched.ok()) return fail(launched.status());
    local.emplace(std::move(*launched));
    ring->ring_secret_file = local->secret_file();
  }

  // The HTTP front (dashboard, /health, /metrics) starts before the ring does, on a stand-in
  // engine that shows each stage's load progress and answers 503 until the ring is up.
  std::vector<http::StartingEngine::StageLayout> layout;
  for (const StageConfig& stage : ring->stages) {
    layout.push_back({stage.endpoint(), stage.first_layer, stage.last_layer});
  }
  std::string model_id = std::filesystem::path(ring->model_dir).filename().string();
  if (model_id.empty()) model_id = ring->model_dir;
  http::StartingEngine front(model_id, std::move(layout));
  // One set of request metrics for both client APIs (HTTP and gRPC), served on /metrics.
  http::ServingMetrics serving_metrics;
  std::unique_ptr<http::HttpServer> http_server;
  const std::string http_listen =
      flags->http_listen.empty() ? ring->http_listen : flags->http_listen;
  std::string api_key;
  if (!flags->api_key_file.empty()) {
    auto key = http::ReadApiKeyFile(flags->api_key_file);
    if (!key.ok()) {
      if (local) local->TerminateAll();
      return fail(key.status());
    }
    api_key = *std::move(key);
  }
  if (!http_listen.empty()) {
    auto started = http::StartHttpApi(front, ring->model_dir,
                                      {.listen = http_listen,
                                       .api_key = api_key,
                                       .metrics = &serving_metrics,
                                       .protect_metrics = flags->protect_metrics});
    if (!started.ok()) {
      if (local) local->TerminateAll();
      return fail(started.status());
    }
    http_server = std::move(*started);
    std::fprintf(stderr,
                 "coordinator: serving the OpenAI HTTP API, /metrics and /dashboard on %s "
                 "(port %d)\n",
                 http_listen.c_str(), http_server->port());
  }
  auto stop_http = [&] {
    if (http_server) http_server->Stop();
  };

  BringUpOptions bring_up{.ring = *ring,
                          .connect_timeout = absl::Seconds(flags->connect_timeout_s),
                          .stall_timeout = absl::Seconds(flags->stall_timeout_s)};
  bring_up.speculation = flags->speculation;
  bring_up.on_progress = [&front](const StageProgress& p) {
    if (p.stage < 0) {
      std::fprintf(stderr, "coordinator: %s\n", p.message.c_str());
      return;
    }
    std::fprintf(stderr, "coordinator: stage %d (%s): %s\n", p.stage, p.endpoint.c_str(),
                 p.message.c_str());
    front.SetStageStatus(p.stage, p.ready ? "ready" : p.message);
  };
  // A failed ring is formed again: local stages that died are started again first; stages of
  // a hosts file come back under their supervisor (systemd Restart=on-failure).
  auto engine = StartGrpcRingEngine(
      {.bring_up = bring_up,
       .packing = flags->packing == "packed" ? DecodePacking::kPacked : DecodePacking::kSpread,
       .plan_ahead = flags->plan_ahead,
       .prefix_caching = flags->prefix_caching,
       .speculation_max_sequences = flags->speculative_max_sequences,
       .speculation_payoff = flags->speculative_payoff,
       .local_stages = local ? &*local : nullptr,
       .ring_down_timeout = absl::Seconds(flags->ring_down_timeout_s)});
  if (!engine.ok()) {
    front.Fail(engine.status());
    stop_http();
    return fail(engine.status());
  }

  RingEngine* e = engine->get();
  GenerateService service(
      e, {.num_stages = ring->num_stages(),
          .health = [e] { return std::make_pair(e->healthy(), e->health_message()); },
          .metrics = &serving_metrics,
          .api_key = api_key});  // the HTTP API's key protects gRPC too
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(ring->grpc_listen, grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    stop_http();
    (*engine)->Shutdown(/*stop_stages=*/local.has_value());
    return fail(absl::UnavailableError(
        fmt::format("api.grpc: cannot listen on {} (in use?)", ring->grpc_listen)));
  }
  front.Attach(e);
  std::string bound =
      ring->grpc_listen.substr(0, ring->grpc_listen.rfind(':')) + ":" + std::to_string(port);
  std::fprintf(stderr, "coordinator: serving ringserve.v1.Generate on %s (%d stage(s), %s)\n",
               bound.c_str(), ring->num_stages(), ring->model_dir.c_str());
  if (flags->ready_fd >= 0) {
    std::string line = bound + "\n";
    (void)!write(flags->ready_fd, line.data(), line.size());
    close(flags->ready_fd);
  }

  // Serve until signalled. A failed ring re-forms by itself (the engine keeps the APIs up);
  // only an engine that can never serve again ends the process, non-zero, for the supervisor.
  int exit_code = 0;
  while (true) {
    const timespec poll = {.tv_sec = 1, .tv_nsec = 0};
    int sig = sigtimedwait(&signals, nullptr, &poll);
    if (sig > 0) {
      std::fprintf(stderr, "coordinator: signal %d, shutting down\n", sig);
      break;
    }
    if (e->stopped()) {
      std::fprintf(stderr, "coordinator: the engine stopped (%s), exiting\n",
                   e->health_message().c_str());
      exit_code = 3;
      break;
    }
  }
  stop_http();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  (*engine)->Shutdown(/*stop_stages=*/local.has_value());
  engine->reset();
  if (local) local->TerminateAll();
  return exit_code;
}

}  // namespace
}  // namespace ringserve

int main(int argc, char** argv) { return ringserve::Run(argc, argv); }
