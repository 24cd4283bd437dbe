#include "bench/loadgen/loadgen.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <random>
#include <thread>

#include "fmt/format.h"
#include "grpcpp/grpcpp.h"
#include "proto/generate.grpc.pb.h"

namespace ringserve::loadgen {
namespace {

namespace v1 = ringserve::v1;
using Clock = std::chrono::steady_clock;

constexpr double kStatsDeadlineS = 2.0;
constexpr size_t kMaxErrorSamples = 8;

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

std::chrono::system_clock::time_point DeadlineIn(double seconds) {
  return std::chrono::system_clock::now() +
         std::chrono::duration_cast<std::chrono::system_clock::duration>(
             std::chrono::duration<double>(seconds));
}

std::string CodeName(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK:
      return "OK";
    case grpc::StatusCode::CANCELLED:
      return "CANCELLED";
    case grpc::StatusCode::UNKNOWN:
      return "UNKNOWN";
    case grpc::StatusCode::INVALID_ARGUMENT:
      return "INVALID_ARGUMENT";
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return "DEADLINE_EXCEEDED";
    case grpc::StatusCode::NOT_FOUND:
      return "NOT_FOUND";
    case grpc::StatusCode::ALREADY_EXISTS:
      return "ALREADY_EXISTS";
    case grpc::StatusCode::PERMISSION_DENIED:
      return "PERMISSION_DENIED";
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return "RESOURCE_EXHAUSTED";
    case grpc::StatusCode::FAILED_PRECONDITION:
      return "FAILED_PRECONDITION";
    case grpc::StatusCode::ABORTED:
      return "ABORTED";
    case grpc::StatusCode::OUT_OF_RANGE:
      return "OUT_OF_RANGE";
    case grpc::StatusCode::UNIMPLEMENTED:
      return "UNIMPLEMENTED";
    case grpc::StatusCode::INTERNAL:
      return "INTERNAL";
    case grpc::StatusCode::UNAVAILABLE:
      return "UNAVAILABLE";
    case grpc::StatusCode::DATA_LOSS:
      return "DATA_LOSS";
    case grpc::StatusCode::UNAUTHENTICATED:
      return "UNAUTHENTICATED";
    default:
      return fmt::format("CODE_{}", static_cast<int>(code));
  }
}

std::string FinishName(v1::FinishReason reason) {
  switch (reason) {
    case v1::FINISH_REASON_STOP:
      return "stop";
    case v1::FINISH_REASON_LENGTH:
      return "length";
    case v1::FINISH_REASON_CANCELLED:
      return "cancelled";
    case v1::FINISH_REASON_ERROR:
      return "error";
    default:
      return "none";
  }
}

// What the run needs to know about the model and the prompt.
struct RunContext {
  const LoadgenOptions* options = nullptr;
  v1::Generate::Stub* stub = nullptr;
  int vocab_size = 0;
  std::vector<int32_t> eos_ids;
  bool duration_mode = false;
  Clock::time_point run_end;
  std::atomic<int64_t> next_index{0};
  std::atomic<int64_t> failures{0};
  std::atomic<bool> stop{false};  // too many failures: start no more requests
};

struct WorkerResult {
  std::vector<RequestRecord> records;
  std::vector<double> itl_ms;
  std::vector<double> tpot_ms;
};

// `count` random ids from (seed, key): uniform over the vocabulary without the EOS ids.
std::vector<int32_t> RandomIds(const RunContext& ctx, uint64_t seed, uint64_t key, int count) {
  std::seed_seq seq{seed & 0xffffffffu, seed >> 32, key & 0xffffffffu, key >> 32};
  std::mt19937_64 rng(seq);
  std::uniform_int_distribution<int32_t> uniform(0, ctx.vocab_size - 1);
  std::vector<int32_t> ids;
  ids.reserve(count);
  while (static_cast<int>(ids.size()) < count) {
    int32_t id = uniform(rng);
    if (std::find(ctx.eos_ids.begin(), ctx.eos_ids.end(), id) != ctx.eos_ids.end()) continue;
    ids.push_back(id);
  }
  return ids;
}

// The prompt of request `index`: the shared prefix (the same for the same prefix_seed), then
// its own ids (the same for the same (seed, index)).
std::vector<int32_t> RandomPrompt(const RunContext& ctx, int64_t index) {
  const LoadgenOptions& o = *ctx.options;
  // The prefix's key is one no request index reaches.
  std::vector<int32_t> ids = RandomIds(ctx, o.prefix_seed, UINT64_MAX, o.shared_prefix_tokens);
  const std::vector<int32_t> own =
      RandomIds(ctx, o.seed, static_cast<uint64_t>(index), o.prompt_tokens);
  ids.insert(ids.end(), own.begin(), own.end());
  return ids;
}

// One Generate call to its end (or its deadline).
void RunOne(RunContext& ctx, int64_t index, double timeout_s, bool deadline_is_run_end,
            WorkerResult* out) {
  const LoadgenOptions& options = *ctx.options;
  v1::GenerateRequest request;
  if (options.prompt_text.empty()) {
    std::vector<int32_t> ids = RandomPrompt(ctx, index);
    request.mutable_token_ids()->mutable_ids()->Add(ids.begin(), ids.end());
  } else {
    request.set_text(options.prompt_text);
    request.set_add_special_tokens(true);
  }
  v1::SamplingParams* sampling = request.mutable_sampling();
  sampling->set_max_tokens(options.max_tokens);
  sampling->set_ignore_eos(options.ignore_eos);
  sampling->set_temperature(options.temperature);
  if (options.temperature > 0) sampling->set_seed(options.seed + static_cast<uint64_t>(index));

  RequestRecord record;
  record.index = index;
  record.prompt_tokens =
      options.prompt_text.empty() ? options.shared_prefix_tokens + options.prompt_tokens : 0;
  grpc::ClientContext context;
  context.set_deadline(DeadlineIn(timeout_s));
  const Clock::time_point start = Clock::now();
  Clock::time_point first_token;
  Clock::time_point last_token;
  v1::FinishReason finish = v1::FINISH_REASON_UNSPECIFIED;
  std::string finish_error;
  bool finished = false;

  std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader =
      ctx.stub->Generate(&context, request);
  v1::GenerateResponse message;
  while (reader->Read(&message)) {
    const Clock::time_point now = Clock::now();
    const int k = message.token_ids_size();
    if (k > 0) {
      if (record.completion_tokens == 0) {
        first_token = now;
        record.ttft_ms = Ms(now - start);
        for (int i = 1; i < k; ++i) out->itl_ms.push_back(0.0);
      } else {
        const double gap_ms = Ms(now - last_token) / k;
        for (int i = 0; i < k; ++i) out->itl_ms.push_back(gap_ms);
      }
      last_token = now;
      record.completion_tokens += k;
    }
    if (message.finished()) {
      finished = true;
      finish = message.finish_reason();
      finish_error = message.error();
      if (message.has_usage()) {
        record.usage_completion_tokens = message.usage().completion_tokens();
        if (message.usage().prompt_tokens() > 0) {
          record.prompt_tokens = message.usage().prompt_tokens();
        }
      }
    }
  }
  const grpc::Status status = reader->Finish();
  const Clock::time_point end = Clock::now();
  record.e2e_ms = Ms(end - start);
  record.finish_reason = FinishName(finish);
  if (record.completion_tokens > 1) {
    out->tpot_ms.push_back(Ms(last_token - first_token) / (record.completion_tokens - 1));
  }

  if (status.ok() && finished &&
      (finish == v1::FINISH_REASON_STOP || finish == v1::FINISH_REASON_LENGTH)) {
    record.status = "ok";
  } else if (status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED && deadline_is_run_end) {
    record.status = "cut";
  } else if (!status.ok()) {
    record.status = CodeName(status.error_code());
    record.error = status.error_message();
  } else {
    record.status = finished ? "FINISH_" + record.finish_reason : "NO_FINAL_MESSAGE";
    record.error = finish_error.empty() ? "stream ended without a normal finish" : finish_error;
  }
  if (record.status != "ok" && record.status != "cut" &&
      ctx.failures.fetch_add(1) + 1 >= ctx.options->max_errors) {
    ctx.stop = true;
  }
  out->records.push_back(std::move(record));
}

void Worker(RunContext& ctx, WorkerResult* out) {
  const LoadgenOptions& options = *ctx.options;
  while (!ctx.stop) {
    double timeout_s = options.request_timeout_s;
    bool deadline_is_run_end = false;
    if (ctx.duration_mode) {
      const double left_s = std::chrono::duration<double>(ctx.run_end - Clock::now()).count();
      if (left_s <= 0) return;
      if (left_s < timeout_s) {
        timeout_s = left_s;
        deadline_is_run_end = true;
      }
    }
    const int64_t index = ctx.next_index.fetch_add(1);
    if (!ctx.duration_mode && index >= options.requests) return;
    RunOne(ctx, index, timeout_s, deadline_is_run_end, out);
  }
}

absl::Status FromGrpc(const std::string& what, const std::string& target,
                      const grpc::Status& status) {
  return absl::UnavailableError(fmt::format("{} on {}: {} ({})", what, target,
                                            status.error_message(), CodeName(status.error_code())));
}

// Stats snapshots: start, periodic samples, end.
class StatsSampler {
 public:
  StatsSampler(v1::Generate::Stub* stub, double interval_s)
      : stub_(stub), interval_s_(interval_s) {}

  grpc::Status Snapshot(v1::StatsResponse* out) {
    grpc::ClientContext context;
    context.set_deadline(DeadlineIn(kStatsDeadlineS));
    return stub_->Stats(&context, v1::StatsRequest(), out);
  }

  void Start() {
    thread_ = std::thread([this] {
      std::unique_lock<std::mutex> lock(mu_);
      while (!stop_) {
        if (cv_.wait_for(lock, std::chrono::duration<double>(interval_s_),
                         [this] { return stop_; })) {
          break;
        }
        lock.unlock();
        v1::StatsResponse stats;
        const grpc::Status status = Snapshot(&stats);
        lock.lock();
        if (status.ok()) samples_.push_back(std::move(stats));
      }
    });
  }

  // Stops the sampling thread; returns the samples taken.
  std::vector<v1::StatsResponse> Stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
    return std::move(samples_);
  }

 private:
  v1::Generate::Stub* stub_;
  double interval_s_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::vector<v1::StatsResponse> samples_;
  std::thread thread_;
};

void FillStageFigures(const v1::StatsResponse& start, const std::vector<v1::StatsResponse>& samples,
                      const v1::StatsResponse& end, double wall_s, LoadgenReport* report) {
  for (const v1::StageStatsProto& e : end.stages()) {
    StageFigures f;
    f.index = e.index();
    f.endpoint = e.endpoint();
    f.first_layer = e.first_layer();
    f.last_layer = e.last_layer();
    f.busy_fraction_end = e.busy_fraction();
    f.mean_step_ms_end = e.mean_step_ms();
    f.steps = e.steps();
    f.bytes_sent = e.bytes_sent();
    for (const v1::StageStatsProto& s : start.stages()) {
      if (s.index() != e.index()) continue;
      f.steps -= s.steps();
      f.bytes_sent -= s.bytes_sent();
    }
    std::vector<double> busy;
    for (const v1::StatsResponse& sample : samples) {
      for (const v1::StageStatsProto& s : sample.stages()) {
        if (s.index() == e.index()) busy.push_back(s.busy_fraction());
      }
    }
    busy.push_back(e.busy_fraction());  // the end snapshot is a sample too
    if (wall_s > 0) {
      f.busy_fraction_run =
          std::min(1.0, static_cast<double>(f.steps) * e.mean_step_ms() / (wall_s * 1000.0));
    }
    const Summary summary = Summarize(busy);
    f.samples = static_cast<int>(summary.count);
    f.busy_fraction_mean = summary.mean;
    f.busy_fraction_min = summary.min;
    f.busy_fraction_max = summary.max;
    report->stages.push_back(std::move(f));
  }
  ServerFigures& server = report->server;
  server.requests_finished = end.requests_finished() - start.requests_finished();
  server.requests_failed = end.requests_failed() - start.requests_failed();
  server.requests_cancelled = end.requests_cancelled() - start.requests_cancelled();
  server.generated_tokens = end.generated_tokens() - start.generated_tokens();
  server.prompt_tokens = end.prompt_tokens() - start.prompt_tokens();
  server.prefix_lookup_tokens = end.prefix_lookup_tokens() - start.prefix_lookup_tokens();
  server.prefix_hit_tokens = end.prefix_hit_tokens() - start.prefix_hit_tokens();
  server.mean_ttft_ms_end = end.mean_ttft_ms();
  server.mean_inter_token_ms_end = end.mean_inter_token_ms();
}

// Waits (bounded) for the channel and for Health to say serving.
absl::Status WaitUntilServing(const LoadgenOptions& options, grpc::Channel& channel,
                              v1::Generate::Stub& stub) {
  const auto deadline = DeadlineIn(options.connect_timeout_s);
  if (!channel.WaitForConnected(deadline)) {
    return absl::UnavailableError(
        fmt::format("cannot connect to {} within {} s", options.target, options.connect_timeout_s));
  }
  std::string last_message;
  while (true) {
    grpc::ClientContext context;
    context.set_deadline(std::min(deadline, DeadlineIn(kStatsDeadlineS)));
    v1::HealthResponse health;
    const grpc::Status status = stub.Health(&context, v1::HealthRequest(), &health);
    if (status.ok() && health.serving()) return absl::OkStatus();
    last_message = status.ok() ? health.message() : status.error_message();
    if (std::chrono::system_clock::now() >= deadline) {
      return absl::UnavailableError(fmt::format("{} is not serving after {} s: {}", options.target,
                                                options.connect_timeout_s, last_message));
    }
    // The server has no "became healthy" notification; poll at a modest rate.
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

}  // namespace

absl::Status ValidateOptions(const LoadgenOptions& o) {
  if (o.target.empty()) return absl::InvalidArgumentError("--target is empty");
  if (o.streams < 1 || o.streams > 4096) {
    return absl::InvalidArgumentError(fmt::format("--streams {}: expected 1..4096", o.streams));
  }
  if (o.prompt_text.empty() && o.prompt_tokens < 1) {
    return absl::InvalidArgumentError(
        fmt::format("--prompt_tokens {}: expected at least 1", o.prompt_tokens));
  }
  if (o.shared_prefix_tokens < 0 || (o.shared_prefix_tokens > 0 && !o.prompt_text.empty())) {
    return absl::InvalidArgumentError(
        fmt::format("--shared_prefix_tokens {}: expected 0 or more, with random prompts only",
                    o.shared_prefix_tokens));
  }
  if (o.max_tokens < 1) {
    return absl::InvalidArgumentError(
        fmt::format("--max_tokens {}: expected at least 1", o.max_tokens));
  }
  if (o.requests < 0) return absl::InvalidArgumentError("--requests: expected >= 0");
  if (o.requests == 0 && !(o.duration_s > 0)) {
    return absl::InvalidArgumentError("give --requests N or --duration_s S");
  }
  if (o.requests > 0 && o.duration_s > 0) {
    return absl::InvalidArgumentError("--requests and --duration_s exclude each other");
  }
  if (o.max_errors < 1) return absl::InvalidArgumentError("--max_errors: expected >= 1");
  if (!(o.temperature >= 0)) return absl::InvalidArgumentError("--temperature: expected >= 0");
  if (!(o.connect_timeout_s > 0) || !(o.request_timeout_s > 0) || !(o.stats_interval_s > 0)) {
    return absl::InvalidArgumentError("timeouts and the stats interval must be positive");
  }
  return absl::OkStatus();
}

absl::StatusOr<LoadgenReport> RunLoad(const LoadgenOptions& options) {
  if (absl::Status s = ValidateOptions(options); !s.ok()) return s;
  LoadgenReport report;
  report.options = options;

  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  std::shared_ptr<grpc::Channel> channel =
      grpc::CreateCustomChannel(options.target, grpc::InsecureChannelCredentials(), args);
  std::unique_ptr<v1::Generate::Stub> stub = v1::Generate::NewStub(channel);
  if (absl::Status s = WaitUntilServing(options, *channel, *stub); !s.ok()) return s;

  v1::ModelInfoResponse info;
  {
    grpc::ClientContext context;
    context.set_deadline(DeadlineIn(kStatsDeadlineS));
    grpc::Status status = stub->ModelInfo(&context, v1::ModelInfoRequest(), &info);
    if (!status.ok()) return FromGrpc("ModelInfo", options.target, status);
  }
  report.model_id = info.model_id();
  report.architecture = info.architecture();
  report.num_layers = info.num_layers();
  report.vocab_size = info.vocab_size();
  report.num_stages = info.num_stages();

  RunContext ctx;
  ctx.options = &options;
  ctx.stub = stub.get();
  ctx.vocab_size = info.vocab_size();
  ctx.eos_ids.assign(info.eos_token_ids().begin(), info.eos_token_ids().end());
  ctx.duration_mode = options.requests == 0;
  if (options.prompt_text.empty()) {
    if (ctx.vocab_size <= static_cast<int>(ctx.eos_ids.size())) {
      return absl::FailedPreconditionError(
          fmt::format("{}: vocab_size {} leaves no non-EOS token ids for random prompts",
                      options.target, ctx.vocab_size));
    }
    report.prompt_tokens = options.shared_prefix_tokens + options.prompt_tokens;
  } else {
    grpc::ClientContext context;
    context.set_deadline(DeadlineIn(kStatsDeadlineS));
    v1::TokenizeRequest request;
    request.set_text(options.prompt_text);
    request.set_add_special_tokens(true);
    v1::TokenizeResponse tokens;
    grpc::Status status = stub->Tokenize(&context, request, &tokens);
    if (!status.ok()) return FromGrpc("Tokenize --prompt_text", options.target, status);
    report.prompt_tokens = tokens.token_ids_size();
  }
  if (info.max_context() > 0 && report.prompt_tokens + options.max_tokens > info.max_context()) {
    return absl::InvalidArgumentError(
        fmt::format("prompt ({} tokens) + --max_tokens {} exceed the model's context of {}",
                    report.prompt_tokens, options.max_tokens, info.max_context()));
  }

  StatsSampler sampler(stub.get(), options.stats_interval_s);
  v1::StatsResponse stats_start;
  if (grpc::Status status = sampler.Snapshot(&stats_start); status.ok()) {
    report.stats_available = true;
    sampler.Start();
  } else {
    report.stats_error =
        fmt::format("Stats: {} ({})", status.error_message(), CodeName(status.error_code()));
  }

  const Clock::time_point start = Clock::now();
  ctx.run_end = start + std::chrono::duration_cast<Clock::duration>(
                            std::chrono::duration<double>(options.duration_s));
  const int num_workers =
      ctx.duration_mode ? options.streams : std::min(options.streams, options.requests);
  std::vector<WorkerResult> results(num_workers);
  std::vector<std::thread> workers;
  workers.reserve(num_workers);
  for (int i = 0; i < num_workers; ++i) {
    workers.emplace_back([&ctx, &results, i] { Worker(ctx, &results[i]); });
  }
  for (std::thread& t : workers) t.join();
  const Clock::time_point end = Clock::now();
  report.wall_s = std::chrono::duration<double>(end - start).count();
  report.stopped_early = ctx.stop;

  if (report.stats_available) {
    std::vector<v1::StatsResponse> samples = sampler.Stop();
    v1::StatsResponse stats_end;
    if (grpc::Status status = sampler.Snapshot(&stats_end); !status.ok()) {
      report.stats_error = fmt::format("Stats at the end: {} ({})", status.error_message(),
                                       CodeName(status.error_code()));
      if (samples.empty()) {
        report.stats_available = false;
      } else {  // the server went away: the last sample stands in for the end snapshot
        stats_end = std::move(samples.back());
        samples.pop_back();
      }
    }
    if (report.stats_available) {
      FillStageFigures(stats_start, samples, stats_end, report.wall_s, &report);
    }
  }

  std::vector<double> ttft;
  std::vector<double> e2e;
  std::vector<double> itl;
  std::vector<double> tpot;
  for (WorkerResult& r : results) {
    itl.insert(itl.end(), r.itl_ms.begin(), r.itl_ms.end());
    tpot.insert(tpot.end(), r.tpot_ms.begin(), r.tpot_ms.end());
    for (RequestRecord& record : r.records) report.records.push_back(std::move(record));
  }
  std::sort(report.records.begin(), report.records.end(),
            [](const RequestRecord& a, const RequestRecord& b) { return a.index < b.index; });
  for (const RequestRecord& record : report.records) {
    ++report.requests_started;
    report.output_tokens += record.completion_tokens;
    if (record.completion_tokens > 0) ttft.push_back(record.ttft_ms);
    if (record.status == "ok") {
      ++report.requests_completed;
      report.input_tokens += record.prompt_tokens;
      e2e.push_back(record.e2e_ms);
      if (record.completion_tokens < options.max_tokens) ++report.requests_short;
    } else if (record.status == "cut") {
      ++report.requests_cut;
    } else {
      ++report.requests_failed;
      ++report.errors_by_code[record.status];
      if (report.error_samples.size() < kMaxErrorSamples) {
        report.error_samples.push_back(
            fmt::format("request {}: {}: {}", record.index, record.status, record.error));
      }
    }
  }
  report.ttft_ms = Summarize(std::move(ttft));
  report.itl_ms = Summarize(std::move(itl));
  report.e2e_ms = Summarize(std::move(e2e));
  report.tpot_ms = Summarize(std::move(tpot));
  if (report.wall_s > 0) {
    report.output_tokens_per_s = static_cast<double>(report.output_tokens) / report.wall_s;
    report.requests_per_s = static_cast<double>(report.requests_completed) / report.wall_s;
  }
  return report;
}

}  // namespace ringserve::loadgen
