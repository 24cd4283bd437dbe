// The gRPC Generate service over a scripted engine (http/fake_engine.h) and a real gRPC server
// on loopback: the same validation as the HTTP API, the API key, and request ids that no client
// can take from another.
#include "coordinator/generate_service.h"

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "coordinator/http/fake_engine.h"
#include "fmt/format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ringserve {
namespace {

using ::testing::HasSubstr;

class GenerateServiceTest : public ::testing::Test {
 protected:
  void Start(GenerateServiceOptions options, http::FakeEngine::Script script = {}) {
    engine_ = std::make_unique<http::FakeEngine>(std::move(script));
    service_ = std::make_unique<GenerateService>(engine_.get(), std::move(options));
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    stub_ = v1::Generate::NewStub(
        grpc::CreateChannel(fmt::format("127.0.0.1:{}", port), grpc::InsecureChannelCredentials()));
  }
  void TearDown() override {
    if (server_) server_->Shutdown();
  }
  // Runs a Generate call to its end; returns its status and the generated token count.
  grpc::Status Generate(const v1::GenerateRequest& request, int* tokens,
                        const std::string& api_key = "") {
    grpc::ClientContext context;
    if (!api_key.empty()) context.AddMetadata("authorization", "Bearer " + api_key);
    auto reader = stub_->Generate(&context, request);
    v1::GenerateResponse response;
    *tokens = 0;
    while (reader->Read(&response)) *tokens += response.token_ids_size();
    return reader->Finish();
  }
  static v1::GenerateRequest Request(const std::string& text, int max_tokens) {
    v1::GenerateRequest request;
    request.set_text(text);
    request.mutable_sampling()->set_max_tokens(max_tokens);
    return request;
  }
  // A call left running, its first response read.
  struct RunningCall {
    grpc::ClientContext context;
    std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader;
    v1::GenerateResponse last;
    int tokens = 0;
  };
  void Begin(RunningCall& call, const std::string& request_id, int max_tokens) {
    v1::GenerateRequest request = Request("hi", max_tokens);
    request.set_request_id(request_id);
    call.reader = stub_->Generate(&call.context, request);
    ASSERT_TRUE(call.reader->Read(&call.last));
    call.tokens = call.last.token_ids_size();
  }
  // Reads `call` to its end: all max_tokens tokens, finished by length, never cancelled.
  void ExpectRunsToLength(RunningCall& call, const std::string& request_id, int max_tokens) {
    while (call.reader->Read(&call.last)) call.tokens += call.last.token_ids_size();
    EXPECT_TRUE(call.reader->Finish().ok());
    EXPECT_EQ(call.last.finish_reason(), v1::FINISH_REASON_LENGTH);
    EXPECT_EQ(call.tokens, max_tokens);
    EXPECT_EQ(engine_->cancelled().count(request_id), 0u);
  }

  std::unique_ptr<http::FakeEngine> engine_;
  std::unique_ptr<GenerateService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::Generate::Stub> stub_;
};

TEST_F(GenerateServiceTest, MaxTokensBeyondTheContextIsRefusedNotCut) {
  Start({}, {.max_context = 64});
  int tokens = 0;
  // "hello" is 5 tokens (no special tokens asked): 59 more fit, 60 do not.
  grpc::Status status = Generate(Request("hello", 60), &tokens);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("max_tokens"));
  ASSERT_TRUE(Generate(Request("hello", 59), &tokens).ok());
  EXPECT_EQ(tokens, 59);
  status = Generate(Request(std::string(100, 'a'), 1), &tokens);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("maximum context length is 64"));
  // Far too long to be worth tokenizing.
  status = Generate(Request(std::string(64 * 64 + 1, 'a'), 1), &tokens);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("bytes"));
}

TEST_F(GenerateServiceTest, DefaultMaxTokensStopsAtTheContext) {
  Start({.default_max_tokens = 100}, {.max_context = 16});
  int tokens = 0;
  ASSERT_TRUE(Generate(Request("hello", 0), &tokens).ok());
  EXPECT_EQ(tokens, 11);  // 16 - 5
}

TEST_F(GenerateServiceTest, ApiKeyProtectsEveryCallButHealth) {
  Start({.api_key = "sekret"});
  int tokens = 0;
  EXPECT_EQ(Generate(Request("hi", 2), &tokens).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(Generate(Request("hi", 2), &tokens, "sekreT").error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(Generate(Request("hi", 2), &tokens, "sekret").ok());
  {
    grpc::ClientContext context;
    v1::StatsResponse stats;
    EXPECT_EQ(stub_->Stats(&context, v1::StatsRequest(), &stats).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
  }
  {
    grpc::ClientContext context;
    v1::TokenizeRequest request;
    request.set_text("x");
    v1::TokenizeResponse response;
    EXPECT_EQ(stub_->Tokenize(&context, request, &response).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
  }
  grpc::ClientContext context;
  v1::HealthResponse health;
  EXPECT_TRUE(stub_->Health(&context, v1::HealthRequest(), &health).ok());
}

TEST_F(GenerateServiceTest, ConcurrencyLimitIsResourceExhausted) {
  Start({.max_concurrent_requests = 1}, {.step = std::chrono::milliseconds(20)});
  grpc::ClientContext first_context;
  auto first = stub_->Generate(&first_context, Request("hi", 200));
  v1::GenerateResponse response;
  ASSERT_TRUE(first->Read(&response));  // admitted and running
  int tokens = 0;
  EXPECT_EQ(Generate(Request("hi", 2), &tokens).error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  first_context.TryCancel();
  while (first->Read(&response)) {
  }
  first->Finish();
}

// Another client's request, running under the id that choice 1 of "job" used to take
// ("job-1"): it neither blocks nor is cancelled by "job" with n = 2, whose responses still
// carry "job".
TEST_F(GenerateServiceTest, ARequestHoldingAnOldChoiceIdDoesNotBlockAnotherRequestsChoices) {
  Start({}, {.step = std::chrono::milliseconds(5)});
  RunningCall other;
  Begin(other, "job-1", 100);

  v1::GenerateRequest job = Request("hi", 2);
  job.set_request_id("job");
  job.set_n(2);
  grpc::ClientContext context;
  auto reader = stub_->Generate(&context, job);
  int tokens[2] = {0, 0};
  bool finished[2] = {false, false};
  v1::GenerateResponse choice;
  while (reader->Read(&choice)) {
    EXPECT_EQ(choice.request_id(), "job");
    ASSERT_TRUE(choice.index() == 0 || choice.index() == 1) << choice.index();
    tokens[choice.index()] += choice.token_ids_size();
    if (choice.finished()) finished[choice.index()] = true;
  }
  grpc::Status status = reader->Finish();
  EXPECT_TRUE(status.ok()) << status.error_message();
  EXPECT_TRUE(finished[0] && finished[1]);
  EXPECT_EQ(tokens[0], 2);
  EXPECT_EQ(tokens[1], 2);

  ExpectRunsToLength(other, "job-1", 100);
}

// The ids the server derives (choices' ids, default ids) are refused from clients.
TEST_F(GenerateServiceTest, IdsWithTheServersMarkAreRefused) {
  Start({});
  int tokens = 0;
  for (const char* id : {"job#1", "grpc#1", "#"}) {
    v1::GenerateRequest request = Request("hi", 2);
    request.set_request_id(id);
    grpc::Status status = Generate(request, &tokens);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << id;
    EXPECT_THAT(status.error_message(), HasSubstr("request_id")) << id;
  }
  EXPECT_EQ(engine_->running(), 0);
  // Without an id the server makes one in its own namespace, and reports it.
  grpc::ClientContext context;
  auto reader = stub_->Generate(&context, Request("hi", 2));
  v1::GenerateResponse response;
  ASSERT_TRUE(reader->Read(&response));
  EXPECT_THAT(response.request_id(), ::testing::StartsWith("grpc#"));
  while (reader->Read(&response)) {
  }
  EXPECT_TRUE(reader->Finish().ok());
}

// A client that goes away cancels every choice of its own request (by the engine ids the
// server gave them) and nothing else, even a request holding the old form of a choice's id.
TEST_F(GenerateServiceTest, CancellingCancelsTheOwnChoicesOnly) {
  Start({}, {.step = std::chrono::milliseconds(10)});
  RunningCall other;
  Begin(other, "job-1", 60);

  v1::GenerateRequest job = Request("hi", 3000);
  job.set_request_id("job");
  job.set_n(2);
  grpc::ClientContext context;
  auto reader = stub_->Generate(&context, job);
  v1::GenerateResponse choice;
  bool saw_choice_1 = false;
  while (!saw_choice_1 && reader->Read(&choice)) saw_choice_1 = choice.index() == 1;
  ASSERT_TRUE(saw_choice_1);
  context.TryCancel();
  while (reader->Read(&choice)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_TRUE(engine_->WaitForCancel("job", std::chrono::seconds(10)));
  EXPECT_TRUE(engine_->WaitForCancel("job#1", std::chrono::seconds(10)));

  ExpectRunsToLength(other, "job-1", 60);
}

}  // namespace
}  // namespace ringserve
