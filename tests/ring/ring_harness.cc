#include "tests/ring/ring_harness.h"

#include <stdlib.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "common/status_macros.h"
#include "fmt/format.h"
#include "grpcpp/grpcpp.h"

namespace ringserve::testing {

std::string SourceDir() {
  const char* dir = std::getenv("RINGSERVE_SOURCE_DIR");
  return dir ? dir : ".";
}

std::string BinaryDir() {
  const char* dir = std::getenv("RINGSERVE_BINARY_DIR");
  return dir ? dir : "build";
}

std::string FixtureModel(const std::string& arch) {
  return SourceDir() + "/tests/fixtures/models/" + arch;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

ringserve::v1::GenerateRequest IdsRequest(const std::vector<int32_t>& prompt, int max_tokens) {
  ringserve::v1::GenerateRequest request;
  request.mutable_token_ids()->mutable_ids()->Add(prompt.begin(), prompt.end());
  request.mutable_sampling()->set_max_tokens(max_tokens);
  request.mutable_sampling()->set_ignore_eos(true);
  return request;
}

ringserve::v1::GenerateRequest GreedyTextRequest(const std::string& text, int max_tokens) {
  ringserve::v1::GenerateRequest request;
  request.set_text(text);
  request.set_add_special_tokens(true);
  request.mutable_sampling()->set_temperature(0.0f);
  request.mutable_sampling()->set_max_tokens(max_tokens);
  request.mutable_sampling()->set_ignore_eos(true);
  return request;
}

std::vector<Generation> GenerateConcurrently(
    Ring& ring, const std::vector<ringserve::v1::GenerateRequest>& requests) {
  std::vector<Generation> out(requests.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < requests.size(); ++i) {
    threads.emplace_back([&, i] { out[i] = ring.Generate(requests[i]); });
  }
  for (std::thread& t : threads) t.join();
  return out;
}

absl::StatusOr<std::unique_ptr<Ring>> Ring::Start(const RingOptions& options) {
  std::unique_ptr<Ring> ring(new Ring());
  if (ring->dir_.path().empty()) return absl::InternalError("mkdtemp failed");
  const std::string stage_binary = BinaryDir() + "/stage/stage";
  const std::string coordinator_binary = BinaryDir() + "/coordinator/coordinator";
  const std::string stage_log = ring->dir_.path() + "/stages.log";

  std::vector<std::string> endpoints;
  for (size_t i = 0; i < options.partition.size(); ++i) {
    SubprocessOptions spawn;
    spawn.argv = {stage_binary, "--listen", "127.0.0.1:0", "--ready_fd", "3"};
    if (options.stage_step_delay_ms > 0) {
      spawn.argv.push_back("--debug_step_delay_ms");
      spawn.argv.push_back(std::to_string(options.stage_step_delay_ms));
    }
    if (i < options.stage_args.size()) {
      spawn.argv.insert(spawn.argv.end(), options.stage_args[i].begin(),
                        options.stage_args[i].end());
    }
    spawn.ready_fd = true;
    spawn.stderr_path = stage_log;
    spawn.stdout_path = stage_log;
    RS_ASSIGN_OR_RETURN(Subprocess process, Subprocess::Spawn(spawn));
    ring->stages_.push_back(std::move(process));
    ring->stage_spawns_.push_back(spawn);
  }
  for (Subprocess& stage : ring->stages_) {
    RS_ASSIGN_OR_RETURN(std::string endpoint, stage.ReadReadyLine(absl::Seconds(20)));
    endpoints.push_back(endpoint);
  }
  ring->stage_endpoints_ = endpoints;

  std::string yaml = fmt::format("model: {}\nchannel: {}\n", options.model_dir, options.channel);
  std::string sched;
  if (options.micro_batches_in_flight > 0) {
    sched += fmt::format("  micro_batches_in_flight: {}\n", options.micro_batches_in_flight);
  }
  if (options.max_tokens_per_micro_batch > 0) {
    sched += fmt::format("  max_tokens_per_micro_batch: {}\n", options.max_tokens_per_micro_batch);
  }
  if (options.kv_blocks > 0) sched += fmt::format("  kv_blocks: {}\n", options.kv_blocks);
  if (!options.kv_budget.empty()) sched += fmt::format("  kv_budget: {}\n", options.kv_budget);
  if (!sched.empty()) yaml += "scheduler:\n" + sched;
  yaml += "stages:\n";
  for (size_t i = 0; i < endpoints.size(); ++i) {
    size_t colon = endpoints[i].rfind(':');
    yaml += fmt::format("  - {{host: {}, port: {}, device: '{}', layers: {}}}\n",
                        endpoints[i].substr(0, colon), endpoints[i].substr(colon + 1),
                        options.device, options.partition[i]);
  }
  const std::string hosts = ring->dir_.path() + "/hosts.yaml";
  std::ofstream(hosts) << yaml;

  SubprocessOptions spawn;
  spawn.argv = {
      coordinator_binary,  "--stages", hosts, "--listen", "127.0.0.1:0", "--ready_fd", "3",
      "--connect_timeout", "10"};
  spawn.argv.insert(spawn.argv.end(), options.coordinator_args.begin(),
                    options.coordinator_args.end());
  spawn.ready_fd = true;
  // Its progress lines (stderr) and its log (stdout), as the operator sees them.
  spawn.stderr_path = ring->dir_.path() + "/coordinator.log";
  spawn.stdout_path = spawn.stderr_path;
  RS_ASSIGN_OR_RETURN(Subprocess coordinator, Subprocess::Spawn(spawn));
  ring->coordinator_ = std::make_unique<Subprocess>(std::move(coordinator));
  auto address = ring->coordinator_->ReadReadyLine(absl::Seconds(30));
  if (!address.ok()) {
    return absl::Status(address.status().code(),
                        fmt::format("{}\ncoordinator log:\n{}\nstage log:\n{}",
                                    std::string(address.status().message()), ring->CoordinatorLog(),
                                    ReadFile(stage_log)));
  }
  ring->address_ = *address;
  ring->stub_ = ringserve::v1::Generate::NewStub(
      grpc::CreateChannel(ring->address_, grpc::InsecureChannelCredentials()));
  return ring;
}

Ring::~Ring() {
  // Coordinator first (it closes the ring), then the stages.
  if (coordinator_) coordinator_->Terminate(absl::Seconds(10));
  for (Subprocess& stage : stages_) stage.Terminate(absl::Seconds(5));
}

absl::Status Ring::RestartStage(int i) {
  if (i < 0 || i >= num_stages()) return absl::InvalidArgumentError("no such stage");
  RS_RETURN_IF_ERROR(stages_[i].Wait(absl::Seconds(10)).status());
  SubprocessOptions spawn = stage_spawns_[i];
  spawn.argv[2] = stage_endpoints_[i];  // --listen: the same port again
  // The killed process's port may linger for a moment; retry briefly.
  absl::Status last;
  for (int attempt = 0; attempt < 20; ++attempt) {
    RS_ASSIGN_OR_RETURN(Subprocess process, Subprocess::Spawn(spawn));
    absl::StatusOr<std::string> ready = process.ReadReadyLine(absl::Seconds(20));
    if (ready.ok()) {
      stages_[i] = std::move(process);
      return absl::OkStatus();
    }
    last = ready.status();
    (void)process.Wait(absl::Seconds(5));
    absl::SleepFor(absl::Milliseconds(100));
  }
  return last;
}

std::string Ring::CoordinatorLog() const { return ReadFile(dir_.path() + "/coordinator.log"); }

std::string Ring::StagesLog() const { return ReadFile(dir_.path() + "/stages.log"); }

Generation Ring::Generate(const ringserve::v1::GenerateRequest& request) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  auto reader = stub_->Generate(&context, request);
  Generation out;
  ringserve::v1::GenerateResponse response;
  while (reader->Read(&response)) {
    out.events++;
    out.tokens.insert(out.tokens.end(), response.token_ids().begin(), response.token_ids().end());
    out.text += response.text();
    out.prompt_logprobs.insert(out.prompt_logprobs.end(), response.prompt_logprobs().begin(),
                               response.prompt_logprobs().end());
    out.logprobs.insert(out.logprobs.end(), response.logprobs().begin(), response.logprobs().end());
    if (response.index() >= 0 && response.index() < 64) {
      if (out.choices.size() <= static_cast<size_t>(response.index())) {
        out.choices.resize(response.index() + 1);
      }
      out.choices[response.index()].insert(out.choices[response.index()].end(),
                                           response.token_ids().begin(),
                                           response.token_ids().end());
    }
    if (response.finished()) out.completion_tokens += response.usage().completion_tokens();
    if (response.finished()) out.finish_reason = response.finish_reason();
  }
  out.status = reader->Finish();
  return out;
}

absl::StatusOr<ringserve::v1::StatsResponse> Ring::Stats() {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  ringserve::v1::StatsResponse stats;
  grpc::Status status = stub_->Stats(&context, ringserve::v1::StatsRequest(), &stats);
  if (!status.ok()) return absl::UnavailableError(status.error_message());
  return stats;
}

absl::StatusOr<ringserve::v1::StatsResponse> Ring::SettledStats(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    absl::StatusOr<ringserve::v1::StatsResponse> stats = Stats();
    if (!stats.ok()) return stats;
    bool settled = true;
    for (const auto& stage : stats->stages()) {
      settled = settled && stage.micro_batches_in_flight() == 0;
    }
    if (settled || absl::Now() >= deadline) return stats;
    absl::SleepFor(absl::Milliseconds(10));
  }
}

absl::StatusOr<ExitResult> RunCoordinatorToExit(const std::vector<std::string>& args,
                                                absl::Duration timeout) {
  TempDir dir;
  SubprocessOptions spawn;
  spawn.argv = {BinaryDir() + "/coordinator/coordinator"};
  spawn.argv.insert(spawn.argv.end(), args.begin(), args.end());
  spawn.stderr_path = dir.path() + "/stderr.log";
  absl::Time start = absl::Now();
  RS_ASSIGN_OR_RETURN(Subprocess process, Subprocess::Spawn(spawn));
  ExitResult result;
  auto code = process.Wait(timeout);
  result.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  result.stderr_text = ReadFile(spawn.stderr_path);
  if (!code.ok()) {
    return absl::DeadlineExceededError(
        fmt::format("{}\nstderr:\n{}", std::string(code.status().message()), result.stderr_text));
  }
  result.exit_code = *code;
  return result;
}

}  // namespace ringserve::testing
