// A tokenizer whose normalizers multiply text (tokenizer.json's Replace of "a" by 1,000 "a"s,
// five times over) behind the real HTTP and gRPC front ends, on loopback: the request whose
// text it cannot encode is answered 400 / INVALID_ARGUMENT, and every other request, one
// already streaming included, is served as usual.
#include <grpcpp/grpcpp.h>
#include <httplib.h>

#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "coordinator/generate_service.h"
#include "coordinator/http/fake_engine.h"
#include "coordinator/http/http_server.h"
#include "coordinator/tokenizer/tokenizer.h"
#include "fmt/format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace ringserve {
namespace {

using ::testing::HasSubstr;
using Json = nlohmann::json;

// The tiny model's tokenizer.json with a normalizer that turns each "a" into 10^15 of them.
std::unique_ptr<Tokenizer> MultiplyingTokenizer() {
  const char* root = std::getenv("RINGSERVE_SOURCE_DIR");
  std::ifstream file(std::string(root != nullptr ? root : ".") +
                     "/models/ringserve-tiny/tokenizer.json");
  Json spec = Json::parse(file);
  Json replaces = Json::array();
  for (int i = 0; i < 5; ++i) {
    replaces.push_back(
        {{"type", "Replace"}, {"pattern", {{"String", "a"}}}, {"content", std::string(1000, 'a')}});
  }
  spec["normalizer"] = {{"type", "Sequence"}, {"normalizers", replaces}};
  auto tokenizer = Tokenizer::FromJson(spec.dump(), "", {});
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status();
  return tokenizer.ok() ? std::move(tokenizer).value() : nullptr;
}

// The scripted engine (tokens generated on its worker thread) with the real tokenizer.
class TokenizingEngine : public http::FakeEngine {
 public:
  TokenizingEngine(std::unique_ptr<Tokenizer> tokenizer, Script script)
      : FakeEngine(std::move(script)), tokenizer_(std::move(tokenizer)) {}
  absl::StatusOr<std::vector<int32_t>> Tokenize(const std::string& text,
                                                bool add_special_tokens) override {
    return tokenizer_->Encode(text, add_special_tokens);
  }

 private:
  std::unique_ptr<Tokenizer> tokenizer_;
};

TEST(EncodeErrorsTest, TextTheTokenizerCannotEncodeFailsThatRequestOnly) {
  std::unique_ptr<Tokenizer> tokenizer = MultiplyingTokenizer();
  ASSERT_NE(tokenizer, nullptr);
  TokenizingEngine engine(std::move(tokenizer), {.step = std::chrono::milliseconds(5)});
  http::HttpServer http_server(engine,
                               [](const nlohmann::ordered_json&, bool,
                                  const nlohmann::ordered_json&) -> absl::StatusOr<std::string> {
                                 return std::string("hi");
                               },
                               {.host = "127.0.0.1", .port = 0});
  ASSERT_TRUE(http_server.Start().ok());
  httplib::Client http("127.0.0.1", http_server.port());
  http.set_read_timeout(30, 0);
  GenerateService service(&engine, {});
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> grpc_server = builder.BuildAndStart();
  ASSERT_NE(grpc_server, nullptr);
  auto stub = v1::Generate::NewStub(
      grpc::CreateChannel(fmt::format("127.0.0.1:{}", port), grpc::InsecureChannelCredentials()));

  // A request already streaming when the bad one comes: 300 tokens, 5 ms apart.
  grpc::ClientContext running_context;
  v1::GenerateRequest running_request;
  running_request.set_text("hi");
  running_request.mutable_sampling()->set_max_tokens(300);
  auto running = stub->Generate(&running_context, running_request);
  v1::GenerateResponse response;
  ASSERT_TRUE(running->Read(&response));
  int running_tokens = response.token_ids_size();

  const Json bad_body = {{"model", "fake-model"}, {"prompt", "a"}, {"max_tokens", 2}};
  httplib::Result bad = http.Post("/v1/completions", bad_body.dump(), "application/json");
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400) << bad->body;
  const Json error = Json::parse(bad->body)["error"];
  EXPECT_EQ(error["type"], "invalid_request_error");
  EXPECT_THAT(error["message"].get<std::string>(),
              HasSubstr("normalizer.normalizers[2] (Replace) grows the text past"));

  {
    grpc::ClientContext context;
    v1::TokenizeRequest request;
    request.set_text("a");
    v1::TokenizeResponse tokenized;
    grpc::Status status = stub->Tokenize(&context, request, &tokenized);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  }
  {
    grpc::ClientContext context;
    v1::GenerateRequest request;
    request.set_text("a");
    request.mutable_sampling()->set_max_tokens(2);
    auto reader = stub->Generate(&context, request);
    v1::GenerateResponse ignored;
    while (reader->Read(&ignored)) {
    }
    grpc::Status status = reader->Finish();
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
    EXPECT_THAT(status.error_message(), HasSubstr("normalizer.normalizers[2] (Replace)"));
  }

  // Other text is served on both APIs.
  const Json good_body = {{"model", "fake-model"}, {"prompt", "hi there"}, {"max_tokens", 2}};
  httplib::Result good = http.Post("/v1/completions", good_body.dump(), "application/json");
  ASSERT_TRUE(good);
  EXPECT_EQ(good->status, 200) << good->body;
  EXPECT_GT(Json::parse(good->body)["usage"]["prompt_tokens"].get<int>(), 0);
  {
    grpc::ClientContext context;
    v1::GenerateRequest request;
    request.set_text("hi there");
    request.mutable_sampling()->set_max_tokens(2);
    auto reader = stub->Generate(&context, request);
    v1::GenerateResponse ignored;
    while (reader->Read(&ignored)) {
    }
    EXPECT_TRUE(reader->Finish().ok());
  }

  // The streaming request ran to its end, undisturbed.
  while (running->Read(&response)) running_tokens += response.token_ids_size();
  EXPECT_TRUE(running->Finish().ok());
  EXPECT_EQ(running_tokens, 300);
  EXPECT_EQ(response.finish_reason(), v1::FINISH_REASON_LENGTH);

  grpc_server->Shutdown();
  http_server.Stop();
}

}  // namespace
}  // namespace ringserve
