// `stage --listen HOST:PORT [--ready_fd N]`: a stage process. Starts empty and waits for the
// coordinator to configure it (stage/stage_service.h). Exits on SIGTERM/SIGINT or a Shutdown
// RPC. Under systemd (Type=notify) it reports READY=1 once its weights are loaded.
//
// --ring_secret PATH: the ring secret (a file only its owner may read; common/ring_secret.h).
//   Every control call and activation connection must then prove knowledge of it. Without
//   one the stage listens on loopback addresses only, unless --insecure says otherwise.
// --model_root DIR: Configure loads models only from under DIR.
// --kv_cache_dtype auto|fp8_e4m3: the KV cache's element type when the coordinator's Configure
//   names none (ring/kv_cache_dtype.h).
// --insecure: allows listening beyond loopback without a ring secret (trusted networks only).
// --debug_step_delay_ms N: testing aid, every step takes N ms longer (a slow stage).
// --debug_stall_after_steps N: testing aid, after N steps the stage stops taking its input (a
//   wedged stage that no longer reads) until its ring is closed.
// --probe_layers MODEL_DIR [--probe_device cpu|cuda:N] [--probe_rows R] [--probe_context C]:
//   instead of serving, times each decoder layer of the model alone on the device
//   (stage/layer_cost_probe.h), writes the profile to --probe_out PATH (default stdout) and
//   exits (0, or 2 on an error);
//   what `coordinator --partition auto` runs.
// --ready_fd N: once serving, writes the bound control address ("host:port\n") to file
// descriptor N and closes it; how a parent that asked for port 0 learns the port.
#include <arpa/inet.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <thread>

#include "absl/flags/flag.h"
#include "common/flags.h"
#include "common/logging.h"
#include "fmt/format.h"
#include "grpcpp/grpcpp.h"
#include "stage/channels/tcp_channel.h"
#include "stage/layer_cost_probe.h"
#include "stage/notify/notify.h"
#include "stage/stage_service.h"

ABSL_FLAG(std::string, listen, "", "control address HOST:PORT to serve on (port 0: any); required");
ABSL_FLAG(int, ready_fd, -1,
          "once serving, write the bound control address and a newline to this descriptor");
ABSL_FLAG(int, debug_step_delay_ms, 0, "testing aid: every step takes this many ms longer");
ABSL_FLAG(int, debug_stall_after_steps, 0,
          "testing aid: after this many steps the stage stops taking its input until its ring "
          "is closed (0: never)");
ABSL_FLAG(std::string, ring_secret, "",
          "the ring secret file (owner-only); every control call and activation connection "
          "must prove knowledge of it");
ABSL_FLAG(std::string, model_root, "", "Configure loads models only from under this directory");
ABSL_FLAG(std::string, kv_cache_dtype, "auto",
          "the KV cache's element type when the coordinator names none: auto (the model's type) "
          "or fp8_e4m3");
ABSL_FLAG(bool, insecure, false,
          "allow listening beyond loopback without a ring secret (trusted networks only)");
ABSL_FLAG(std::string, probe_layers, "",
          "time each decoder layer of this model directory, print the profile and exit");
ABSL_FLAG(std::string, probe_device, "cpu", "--probe_layers: cpu or cuda:N");
ABSL_FLAG(int, probe_rows, 32, "--probe_layers: decode sequences per timed step");
ABSL_FLAG(int, probe_context, 256, "--probe_layers: context tokens of each sequence");
ABSL_FLAG(std::string, probe_out, "",
          "--probe_layers: write the profile to this file (default: stdout, among the logs)");

namespace {

constexpr char kUsage[] =
    "A stage process: waits for the coordinator to configure it, then runs its layers.\n"
    "usage: stage --listen=HOST:PORT [--ring_secret=PATH] [--model_root=DIR] [--insecure]\n"
    "             [--kv_cache_dtype=auto|fp8_e4m3]\n"
    "             [--ready_fd=N] [--debug_step_delay_ms=N] [--debug_stall_after_steps=N]\n"
    "       stage --probe_layers=MODEL_DIR [--probe_device=cpu|cuda:N] [--probe_rows=R]\n"
    "             [--probe_context=C] [--probe_out=PATH]";

int Fail(const std::string& message) {
  std::fprintf(stderr, "stage: %s\n", message.c_str());
  return 2;
}

// Whether `host` names only this machine (a loopback address or "localhost").
bool IsLoopbackHost(const std::string& host) {
  if (host == "localhost" || host == "::1" || host == "[::1]") return true;
  in_addr addr{};
  return inet_pton(AF_INET, host.c_str(), &addr) == 1 && (ntohl(addr.s_addr) >> 24) == 127;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace ringserve;
  ParseCommandLineFlags(argc, argv, kUsage);
  if (const std::string probe = absl::GetFlag(FLAGS_probe_layers); !probe.empty()) {
    InitLogging("stage");
    absl::StatusOr<LayerCostProfile> profile =
        ProbeLayerCosts({.model_dir = probe,
                         .device = absl::GetFlag(FLAGS_probe_device),
                         .rows = absl::GetFlag(FLAGS_probe_rows),
                         .context = absl::GetFlag(FLAGS_probe_context)});
    if (!profile.ok()) return Fail(std::string(profile.status().message()));
    const std::string text = FormatLayerCostProfile(*profile);
    const std::string out_path = absl::GetFlag(FLAGS_probe_out);
    if (out_path.empty()) {
      std::fputs(text.c_str(), stdout);
      return 0;
    }
    std::FILE* out = std::fopen(out_path.c_str(), "w");
    if (out == nullptr || std::fputs(text.c_str(), out) < 0 || std::fclose(out) != 0) {
      return Fail(fmt::format("--probe_out {}: cannot write it", out_path));
    }
    return 0;
  }
  const std::string listen = absl::GetFlag(FLAGS_listen);
  const int ready_fd = absl::GetFlag(FLAGS_ready_fd);
  const int debug_step_delay_ms = absl::GetFlag(FLAGS_debug_step_delay_ms);
  if (listen.empty()) return Fail("--listen is required (see --help)");
  const std::string secret_path = absl::GetFlag(FLAGS_ring_secret);
  const std::string model_root = absl::GetFlag(FLAGS_model_root);
  const bool insecure = absl::GetFlag(FLAGS_insecure);
  absl::StatusOr<KvCacheDtype> kv_cache_dtype =
      ParseKvCacheDtype(absl::GetFlag(FLAGS_kv_cache_dtype), "--kv_cache_dtype");
  if (!kv_cache_dtype.ok()) return Fail(std::string(kv_cache_dtype.status().message()));
  std::string host;
  int port = 0;
  if (absl::Status s = SplitHostPort(listen, "--listen", &host, &port); !s.ok()) {
    return Fail(std::string(s.message()));
  }

  std::optional<RingSecret> secret;
  if (!secret_path.empty()) {
    absl::StatusOr<RingSecret> loaded = RingSecret::Load(secret_path);
    if (!loaded.ok()) return Fail(std::string(loaded.status().message()));
    secret = std::move(*loaded);
  } else if (!IsLoopbackHost(host) && !insecure) {
    return Fail(fmt::format(
        "refusing to listen on {} without a ring secret: anyone who can reach it could drive "
        "this stage. Pass --ring_secret PATH (the file hosts.yaml names as ring_secret), listen "
        "on 127.0.0.1, or pass --insecure on a network you trust.",
        host));
  }
  if (!secret.has_value() && insecure) {
    std::fprintf(stderr, "stage: --insecure: control and activations are unauthenticated\n");
  }

  // Signals go to a dedicated thread (sigwait); every other thread blocks them.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  InitLogging("stage");
  std::mutex mu;
  std::condition_variable cv;
  bool stop = false;
  auto request_stop = [&] {
    std::lock_guard<std::mutex> lock(mu);
    stop = true;
    cv.notify_all();
  };

  StageServiceOptions options;
  options.bind_host = host;
  options.on_status = [](const std::string& status) { (void)NotifyStatus(status); };
  options.on_ready = [](const std::string& status) { (void)NotifyReady(status); };
  options.on_shutdown = request_stop;
  options.debug_step_delay = absl::Milliseconds(debug_step_delay_ms);
  options.debug_stall_after_steps = absl::GetFlag(FLAGS_debug_stall_after_steps);
  options.secret = std::move(secret);
  options.model_root = model_root;
  options.kv_cache_dtype = *kv_cache_dtype;
  StageService service(options);

  grpc::ServerBuilder builder;
  int selected_port = 0;
  builder.AddListeningPort(listen, grpc::InsecureServerCredentials(), &selected_port);
  builder.RegisterService(&service);
  builder.SetMaxReceiveMessageSize(256 << 20);
  builder.SetMaxSendMessageSize(256 << 20);
  // The coordinator pings every second to notice a dead stage quickly (stage_client.cc).
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 500);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || selected_port == 0) {
    return Fail(fmt::format("cannot listen on {} (address in use or not local?)", listen));
  }
  std::string bound = fmt::format("{}:{}", host, selected_port);
  RS_LOG_INFO("stage listening on {}, waiting to be configured", bound);
  (void)NotifyStatus("waiting to be configured on " + bound);
  if (ready_fd >= 0) {
    std::string line = bound + "\n";
    if (write(ready_fd, line.data(), line.size()) != static_cast<ssize_t>(line.size())) {
      RS_LOG_WARN("could not write the address to --ready_fd {}", ready_fd);
    }
    close(ready_fd);
  }

  // Under systemd with WatchdogSec=, ping the watchdog while the stage serves, including while
  // it is idle (waiting to be configured); pings stop once shutdown has begun or while a step
  // has been stuck longer than any step may take (a wedged executor: systemd restarts it). The
  // check runs on the pinger thread: atomic loads, cheap and thread-safe as the pinger requires.
  std::atomic<bool> serving{true};
  std::optional<WatchdogPinger> watchdog;
  watchdog.emplace([&serving, &service] { return serving.load() && service.ExecutorAlive(); });
  if (watchdog->active()) RS_LOG_INFO("pinging the systemd watchdog while serving");

  std::thread signal_thread([&] {
    int sig = 0;
    sigwait(&signals, &sig);
    if (sig != 0) request_stop();
  });
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return stop; });
  }
  RS_LOG_INFO("stage shutting down");
  serving = false;
  watchdog.reset();
  (void)NotifyStopping();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  // Wake the signal thread if the stop came from the Shutdown RPC.
  pthread_kill(signal_thread.native_handle(), SIGTERM);
  signal_thread.join();
  return 0;
}
