#include "coordinator/stage_client.h"

#include <chrono>

#include "fmt/format.h"
#include "proto/grpc_status.h"

namespace ringserve {
namespace {

std::chrono::system_clock::time_point Deadline(absl::Duration timeout) {
  return std::chrono::system_clock::now() + absl::ToChronoMilliseconds(timeout);
}

}  // namespace

StageClient::StageClient(int index, std::string endpoint, std::shared_ptr<grpc::Channel> channel)
    : index_(index),
      endpoint_(std::move(endpoint)),
      channel_(std::move(channel)),
      stub_(v1::StageControl::NewStub(channel_)) {}

std::string StageClient::Name() const { return fmt::format("stage {} ({})", index_, endpoint_); }

absl::StatusOr<std::unique_ptr<StageClient>> StageClient::Connect(int index,
                                                                  const std::string& endpoint,
                                                                  absl::Duration wait,
                                                                  const ControlCredentials& creds) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(256 << 20);
  args.SetMaxSendMessageSize(256 << 20);
  // Retry quickly while the stage is still starting within the bounded wait.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 500);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  // A stage whose process or host vanished is noticed within seconds, not at the next step's
  // timeout: HTTP/2 pings every second, unanswered for 2 s closes the channel (and its Steps
  // stream). The stage's server permits pings this often (stage_main.cc).
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 1000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 2000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  auto channel = grpc::CreateCustomChannel(endpoint, grpc::InsecureChannelCredentials(), args);
  if (!channel->WaitForConnected(Deadline(wait))) {
    return absl::UnavailableError(
        fmt::format("stage {} at {}: not reachable within {} (is `stage --listen {}` running "
                    "there?)",
                    index, endpoint, absl::FormatDuration(wait), endpoint));
  }
  std::unique_ptr<StageClient> client(new StageClient(index, endpoint, std::move(channel)));
  client->creds_ = creds;
  grpc::ClientContext context;
  context.set_deadline(Deadline(wait));
  v1::ChallengeResponse challenge;
  grpc::Status status = client->stub_->Challenge(&context, v1::ChallengeRequest(), &challenge);
  if (!status.ok()) {
    return absl::UnavailableError(
        fmt::format("stage {} at {}: challenge: {}", index, endpoint, status.error_message()));
  }
  if (challenge.secret_required() && !creds.secret.has_value()) {
    return absl::UnauthenticatedError(
        fmt::format("stage {} at {} requires the ring secret; name its file in hosts.yaml as "
                    "ring_secret",
                    index, endpoint));
  }
  client->nonce_ = challenge.nonce();
  return client;
}

void StageClient::Authorize(grpc::ClientContext* context) const {
  AddControlProof(creds_, nonce_, context);
}

StageClient::~StageClient() { CloseSteps(absl::Seconds(2)); }

absl::StatusOr<std::string> StageClient::Configure(
    const v1::ConfigureRequest& request, absl::Duration timeout,
    const std::function<void(const v1::LoadProgress&)>& on_progress) {
  grpc::ClientContext context;
  context.set_deadline(Deadline(timeout));
  Authorize(&context);
  auto reader = stub_->Configure(&context, request);
  v1::LoadProgress progress;
  std::string data_endpoint;
  bool ready = false;
  while (reader->Read(&progress)) {
    if (!progress.data_endpoint().empty()) data_endpoint = progress.data_endpoint();
    ready = ready || progress.ready();
    if (on_progress) on_progress(progress);
  }
  grpc::Status status = reader->Finish();
  if (!status.ok()) {
    absl::Status s = FromGrpcStatus(status);
    return absl::Status(s.code(),
                        fmt::format("{}: configure: {}", Name(), std::string(s.message())));
  }
  if (!ready) return absl::InternalError(Name() + ": configure ended without ready");
  return data_endpoint;
}

absl::Status StageClient::ConnectPeers(const v1::ConnectPeersRequest& request,
                                       absl::Duration timeout) {
  grpc::ClientContext context;
  context.set_deadline(Deadline(timeout));
  Authorize(&context);
  v1::ConnectPeersResponse response;
  grpc::Status status = stub_->ConnectPeers(&context, request, &response);
  if (!status.ok()) {
    absl::Status s = FromGrpcStatus(status);
    return absl::Status(s.code(),
                        fmt::format("{}: connect peers: {}", Name(), std::string(s.message())));
  }
  return absl::OkStatus();
}

absl::Status StageClient::StartSteps(std::function<void(v1::StepResult)> on_result,
                                     std::function<void(absl::Status)> on_closed) {
  steps_context_ = std::make_unique<grpc::ClientContext>();
  Authorize(steps_context_.get());
  steps_ = stub_->Steps(steps_context_.get());
  if (steps_ == nullptr) return absl::InternalError(Name() + ": cannot open the Steps stream");
  writer_ = std::thread([this] { WriterLoop(); });
  reader_ = std::thread([this, on_result = std::move(on_result), on_closed = std::move(on_closed)] {
    v1::StepResult result;
    while (steps_->Read(&result)) on_result(std::move(result));
    // The writer may still be blocked; stop it before Finish.
    {
      std::lock_guard<std::mutex> lock(mu_);
      reader_done_ = true;
      cv_.notify_all();
    }
    bool closing;
    {
      std::lock_guard<std::mutex> lock(mu_);
      closing = closing_;
    }
    if (writer_.joinable() && std::this_thread::get_id() != writer_.get_id()) writer_.join();
    grpc::Status status = steps_->Finish();
    absl::Status s = FromGrpcStatus(status);
    if (s.ok() && !closing) {
      s = absl::UnavailableError(Name() + ": the Steps stream ended unexpectedly");
    } else if (!s.ok()) {
      s = absl::Status(s.code(), fmt::format("{}: {}", Name(), std::string(s.message())));
    }
    on_closed(s);
  });
  return absl::OkStatus();
}

void StageClient::WriterLoop() {
  while (true) {
    v1::StepPlan plan;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return !outbox_.empty() || closing_ || reader_done_; });
      if (reader_done_) return;
      if (outbox_.empty()) {
        lock.unlock();
        steps_->WritesDone();
        return;
      }
      plan = std::move(outbox_.front());
      outbox_.pop_front();
    }
    if (!steps_->Write(plan)) {
      std::lock_guard<std::mutex> lock(mu_);
      write_failed_ = true;
      return;  // the reader sees the stream end and reports it
    }
  }
}

void StageClient::SendPlan(v1::StepPlan plan) {
  std::lock_guard<std::mutex> lock(mu_);
  outbox_.push_back(std::move(plan));
  cv_.notify_all();
}

void StageClient::CloseSteps(absl::Duration timeout) {
  if (!reader_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    closing_ = true;
    cv_.notify_all();
  }
  // Bounded: cancel the stream if the stage does not finish in time.
  std::thread canceller;
  std::mutex done_mu;
  std::condition_variable done_cv;
  bool done = false;
  canceller = std::thread([&] {
    std::unique_lock<std::mutex> lock(done_mu);
    if (!done_cv.wait_for(lock, absl::ToChronoMilliseconds(timeout), [&] { return done; })) {
      steps_context_->TryCancel();
    }
  });
  reader_.join();
  {
    std::lock_guard<std::mutex> lock(done_mu);
    done = true;
    done_cv.notify_all();
  }
  canceller.join();
  if (writer_.joinable()) writer_.join();
}

absl::StatusOr<v1::StageStatsResponse> StageClient::Stats(absl::Duration timeout) {
  grpc::ClientContext context;
  context.set_deadline(Deadline(timeout));
  Authorize(&context);
  v1::StageStatsResponse response;
  grpc::Status status = stub_->Stats(&context, v1::StageStatsRequest(), &response);
  if (!status.ok()) return FromGrpcStatus(status);
  return response;
}

absl::StatusOr<v1::StageHealthResponse> StageClient::Health(absl::Duration timeout) {
  grpc::ClientContext context;
  context.set_deadline(Deadline(timeout));
  Authorize(&context);
  v1::StageHealthResponse response;
  grpc::Status status = stub_->Health(&context, v1::StageHealthRequest(), &response);
  if (!status.ok()) return FromGrpcStatus(status);
  return response;
}

absl::Status StageClient::Shutdown(absl::Duration timeout) {
  grpc::ClientContext context;
  context.set_deadline(Deadline(timeout));
  Authorize(&context);
  v1::ShutdownResponse response;
  return FromGrpcStatus(stub_->Shutdown(&context, v1::ShutdownRequest(), &response));
}

}  // namespace ringserve
