// `coordinator`: the ring's coordinator process.
//
//   coordinator --stages hosts.yaml [--listen HOST:PORT]
//       Reads and validates hosts.yaml (coordinator/hosts/ring_config.h), connects to every
//       stage (bounded wait), configures them, and serves the gRPC Generate API.
//   coordinator [--model DIR] [--num-stages N] [--listen HOST:PORT]
//       The embedded default: starts N local `stage` processes (the binary next to this one)
//       on a small model and serves; the stages exit with the coordinator.
//
// Other flags: --http-listen HOST:PORT (the OpenAI HTTP API, /metrics and the dashboard;
// overrides hosts.yaml's api.http), --connect-timeout SECONDS (default 10), --stage-binary PATH,
// --packing spread|packed, --ready-fd N (writes the bound API address and a newline once
// serving). Exits on SIGINT/SIGTERM.
#include <signal.h>
#include <unistd.h>

#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "absl/strings/numbers.h"
#include "common/logging.h"
#include "coordinator/generate_service.h"
#include "coordinator/hosts/ring_config.h"
#include "coordinator/http/http_api.h"
#include "coordinator/local_stages.h"
#include "coordinator/ring_engine.h"
#include "fmt/format.h"
#include "grpcpp/grpcpp.h"
#include "stage/model/model_config.h"

#ifndef RINGSERVE_DEFAULT_MODEL_DIR
#define RINGSERVE_DEFAULT_MODEL_DIR "tests/fixtures/models/llama"
#endif

namespace ringserve {
namespace {

constexpr char kUsage[] =
    "usage: coordinator --stages hosts.yaml [--listen HOST:PORT] [--connect-timeout S]\n"
    "       coordinator [--model DIR] [--num-stages N] [--listen HOST:PORT]\n"
    "other flags: --http-listen HOST:PORT, --stage-binary PATH, --packing spread|packed,\n"
    "             --ready-fd N\n";

struct Flags {
  std::string stages_file;
  std::string listen;
  std::string http_listen;
  std::string model_dir = RINGSERVE_DEFAULT_MODEL_DIR;
  int num_stages = 2;
  double connect_timeout_s = 10;
  std::string stage_binary;
  std::string packing = "spread";
  int ready_fd = -1;
};

absl::StatusOr<Flags> ParseFlags(int argc, char** argv) {
  Flags flags;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    std::string value;
    size_t eq = arg.find('=');
    if (arg.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
    } else if (arg != "--help" && arg != "-h") {
      if (i + 1 >= argc) return absl::InvalidArgumentError(fmt::format("{} needs a value", arg));
      value = argv[++i];
    }
    auto number = [&](double* out) {
      if (!absl::SimpleAtod(value, out)) {
        return absl::InvalidArgumentError(fmt::format("{}: '{}' is not a number", arg, value));
      }
      return absl::OkStatus();
    };
    if (arg == "--stages") {
      flags.stages_file = value;
    } else if (arg == "--listen") {
      flags.listen = value;
    } else if (arg == "--http-listen") {
      flags.http_listen = value;
    } else if (arg == "--model") {
      flags.model_dir = value;
    } else if (arg == "--num-stages") {
      double n = 0;
      if (absl::Status s = number(&n); !s.ok()) return s;
      flags.num_stages = static_cast<int>(n);
    } else if (arg == "--connect-timeout") {
      if (absl::Status s = number(&flags.connect_timeout_s); !s.ok()) return s;
    } else if (arg == "--stage-binary") {
      flags.stage_binary = value;
    } else if (arg == "--packing") {
      if (value != "spread" && value != "packed") {
        return absl::InvalidArgumentError("--packing: expected spread or packed");
      }
      flags.packing = value;
    } else if (arg == "--ready-fd") {
      double n = 0;
      if (absl::Status s = number(&n); !s.ok()) return s;
      flags.ready_fd = static_cast<int>(n);
    } else if (arg == "--help" || arg == "-h") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    } else {
      return absl::InvalidArgumentError(fmt::format("unknown flag '{}'", arg));
    }
  }
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

  auto flags = ParseFlags(argc, argv);
  if (!flags.ok()) {
    std::fprintf(stderr, "coordinator: %s\n%s", std::string(flags.status().message()).c_str(),
                 kUsage);
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
  } else {
    auto num_layers = layer_count(flags->model_dir);
    if (!num_layers.ok()) return fail(num_layers.status());
    DefaultRingOptions options;
    options.model_dir = flags->model_dir;
    options.num_layers = *num_layers;
    options.num_stages = flags->num_stages;
    if (!flags->listen.empty()) options.grpc_listen = flags->listen;
    ring = DefaultRingConfig(options);
    if (!ring.ok()) return fail(ring.status());
    std::string binary = flags->stage_binary;
    if (binary.empty()) {
      auto found = FindStageBinary(argv[0]);
      if (!found.ok()) return fail(found.status());
      binary = *found;
    }
    std::fprintf(stderr, "coordinator: starting %d local stage(s) of %s on %s\n",
                 ring->num_stages(), binary.c_str(), ring->model_dir.c_str());
    auto launched = LocalStages::Launch(binary, *ring, absl::Seconds(30));
    if (!launched.ok()) return fail(launched.status());
    local.emplace(std::move(*launched));
  }

  RingEngineOptions engine_options;
  engine_options.ring = *ring;
  engine_options.connect_timeout = absl::Seconds(flags->connect_timeout_s);
  engine_options.decode_packing =
      flags->packing == "packed" ? DecodePacking::kPacked : DecodePacking::kSpread;
  engine_options.on_progress = [](const std::string& line) {
    std::fprintf(stderr, "coordinator: %s\n", line.c_str());
  };
  auto engine = RingEngine::Start(engine_options);
  if (!engine.ok()) return fail(engine.status());

  RingEngine* e = engine->get();
  GenerateService service(e, {.num_stages = ring->num_stages(), .health = [e] {
                                return std::make_pair(e->healthy(), e->health_message());
                              }});
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(ring->grpc_listen, grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    (*engine)->Shutdown(/*stop_stages=*/local.has_value());
    return fail(absl::UnavailableError(
        fmt::format("api.grpc: cannot listen on {} (in use?)", ring->grpc_listen)));
  }
  std::unique_ptr<http::HttpServer> http_server;
  const std::string http_listen =
      flags->http_listen.empty() ? ring->http_listen : flags->http_listen;
  if (!http_listen.empty()) {
    auto started = http::StartHttpApi(*e, ring->model_dir, {.listen = http_listen});
    if (!started.ok()) {
      server->Shutdown(std::chrono::system_clock::now());
      (*engine)->Shutdown(/*stop_stages=*/local.has_value());
      return fail(started.status());
    }
    http_server = std::move(*started);
    std::fprintf(stderr,
                 "coordinator: serving the OpenAI HTTP API, /metrics and /dashboard on %s "
                 "(port %d)\n",
                 http_listen.c_str(), http_server->port());
  }
  std::string bound =
      ring->grpc_listen.substr(0, ring->grpc_listen.rfind(':')) + ":" + std::to_string(port);
  std::fprintf(stderr, "coordinator: serving ringserve.v1.Generate on %s (%d stage(s), %s)\n",
               bound.c_str(), ring->num_stages(), ring->model_dir.c_str());
  if (flags->ready_fd >= 0) {
    std::string line = bound + "\n";
    (void)!write(flags->ready_fd, line.data(), line.size());
    close(flags->ready_fd);
  }

  int sig = 0;
  sigwait(&signals, &sig);
  std::fprintf(stderr, "coordinator: signal %d, shutting down\n", sig);
  if (http_server) http_server->Stop();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  (*engine)->Shutdown(/*stop_stages=*/local.has_value());
  engine->reset();
  if (local) local->TerminateAll();
  return 0;
}

}  // namespace
}  // namespace ringserve

int main(int argc, char** argv) { return ringserve::Run(argc, argv); }
