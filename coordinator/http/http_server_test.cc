// The HTTP server against a scripted in-process engine (fake_engine.h), over real loopback
// HTTP with cpp-httplib's client. The ring-backed tests with the official OpenAI client live in
// tests/ops.
#include "coordinator/http/http_server.h"

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "coordinator/http/fake_engine.h"
#include "coordinator/http/request_ids.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ringserve::http {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;
using Json = nlohmann::json;
using std::chrono::milliseconds;

constexpr milliseconds kWait(10000);

absl::StatusOr<std::string> RenderForTest(const nlohmann::ordered_json& messages, bool add_gen,
                                          const nlohmann::ordered_json& kwargs) {
  std::string out;
  for (const auto& m : messages) {
    out += "<" + m["role"].get<std::string>() + ">" + m.value("content", std::string()) + "\n";
  }
  if (kwargs.contains("suffix")) out += kwargs["suffix"].get<std::string>();
  if (add_gen) out += "<assistant>";
  return out;
}

class HttpServerTest : public ::testing::Test {
 protected:
  void Start(FakeEngine::Script script = {}, HttpServer::Options options = {}) {
    engine_ = std::make_unique<FakeEngine>(std::move(script));
    if (options.keepalive_interval == milliseconds(1000))
      options.keepalive_interval = milliseconds(100);
    server_ = std::make_unique<HttpServer>(*engine_, RenderForTest, options);
    ASSERT_TRUE(server_->Start().ok());
    client_ = std::make_unique<httplib::Client>("127.0.0.1", server_->port());
    client_->set_read_timeout(10, 0);
  }
  void TearDown() override {
    if (server_) server_->Stop();
  }

  httplib::Result PostJson(const std::string& path, const Json& body,
                           const httplib::Headers& headers = {}) {
    return client_->Post(path.c_str(), headers, body.dump(), "application/json");
  }

  // Sends a streaming request; returns the SSE "data:" payloads in order.
  std::vector<std::string> PostStream(const std::string& path, const Json& body) {
    httplib::Request req;
    req.method = "POST";
    req.path = path;
    req.body = body.dump();
    req.set_header("Content-Type", "application/json");
    std::string raw;
    req.content_receiver = [&](const char* data, size_t len, uint64_t, uint64_t) {
      raw.append(data, len);
      return true;
    };
    httplib::Response res;
    httplib::Error error;
    EXPECT_TRUE(client_->send(req, res, error)) << httplib::to_string(error);
    EXPECT_EQ(res.status, 200);
    EXPECT_THAT(res.get_header_value("Content-Type"), StartsWith("text/event-stream"));
    std::vector<std::string> events;
    size_t pos = 0;
    while ((pos = raw.find("data: ", pos)) != std::string::npos) {
      size_t end = raw.find("\n\n", pos);
      events.push_back(raw.substr(pos + 6, end - pos - 6));
      pos = end;
    }
    return events;
  }

  static Json CompletionBody(Json extra = Json::object()) {
    Json body = {{"model", "fake-model"}, {"prompt", "Say hi"}, {"temperature", 0}};
    body.update(extra);
    return body;
  }
  static Json ChatBody(Json extra = Json::object()) {
    Json body = {{"model", "fake-model"},
                 {"messages", {{{"role", "user"}, {"content", "Say hi"}}}},
                 {"max_tokens", 5}};
    body.update(extra);
    return body;
  }

  std::unique_ptr<FakeEngine> engine_;
  std::unique_ptr<HttpServer> server_;
  std::unique_ptr<httplib::Client> client_;
};

TEST_F(HttpServerTest, ListsTheServedModel) {
  Start();
  httplib::Result res = client_->Get("/v1/models");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  Json body = Json::parse(res->body);
  EXPECT_EQ(body["object"], "list");
  EXPECT_EQ(body["data"][0]["id"], "fake-model");
  EXPECT_EQ(body["data"][0]["object"], "model");
  EXPECT_EQ(client_->Get("/v1/models/fake-model")->status, 200);
  httplib::Result missing = client_->Get("/v1/models/other");
  EXPECT_EQ(missing->status, 404);
  EXPECT_EQ(Json::parse(missing->body)["error"]["code"], "model_not_found");
}

TEST_F(HttpServerTest, CompletionNonStreaming) {
  Start();
  httplib::Result res = PostJson("/v1/completions", CompletionBody({{"max_tokens", 5}}));
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  Json body = Json::parse(res->body);
  EXPECT_EQ(body["object"], "text_completion");
  EXPECT_THAT(body["id"].get<std::string>(), StartsWith("cmpl-"));
  EXPECT_EQ(body["model"], "fake-model");
  EXPECT_EQ(body["choices"][0]["text"], "Hello");
  EXPECT_EQ(body["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(body["usage"]["prompt_tokens"], 7);  // BOS + 6 bytes
  EXPECT_EQ(body["usage"]["completion_tokens"], 5);
  EXPECT_EQ(body["usage"]["total_tokens"], 12);
  GenerateRequest sent = engine_->last_request();
  EXPECT_EQ(sent.sampling.max_tokens, 5);
  EXPECT_EQ(sent.sampling.temperature, 0.0f);
  EXPECT_EQ(sent.prompt_ids, *engine_->Tokenize("Say hi", true));
}

TEST_F(HttpServerTest, CompletionDefaultsToSixteenTokensAndHonoursStop) {
  Start();
  Json body = Json::parse(PostJson("/v1/completions", CompletionBody())->body);
  EXPECT_EQ(body["usage"]["completion_tokens"], 16);
  Json stopped = Json::parse(
      PostJson("/v1/completions", CompletionBody({{"stop", {"fake"}}, {"max_tokens", 30}}))->body);
  EXPECT_EQ(stopped["choices"][0]["text"], "Hello from the ");
  EXPECT_EQ(stopped["choices"][0]["finish_reason"], "stop");
}

TEST_F(HttpServerTest, TokenPromptsPassThrough) {
  Start();
  httplib::Result res =
      PostJson("/v1/completions", CompletionBody({{"prompt", {10, 11, 12}}, {"max_tokens", 1}}));
  ASSERT_EQ(res->status, 200) << res->body;
  EXPECT_EQ(engine_->last_request().prompt_ids, (std::vector<int32_t>{10, 11, 12}));
  httplib::Result bad = PostJson("/v1/completions", CompletionBody({{"prompt", {10, 99999}}}));
  EXPECT_EQ(bad->status, 400);
  EXPECT_EQ(Json::parse(bad->body)["error"]["param"], "prompt");
}

TEST_F(HttpServerTest, CompletionStreamingEndsWithDoneAndUsage) {
  Start();
  std::vector<std::string> events = PostStream(
      "/v1/completions",
      CompletionBody(
          {{"max_tokens", 8}, {"stream", true}, {"stream_options", {{"include_usage", true}}}}));
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events.back(), "[DONE]");
  std::string text;
  std::string finish;
  for (size_t i = 0; i + 2 < events.size(); ++i) {
    Json chunk = Json::parse(events[i]);
    EXPECT_EQ(chunk["object"], "text_completion");
    text += chunk["choices"][0]["text"].get<std::string>();
    if (!chunk["choices"][0]["finish_reason"].is_null())
      finish = chunk["choices"][0]["finish_reason"];
  }
  EXPECT_EQ(text, "Hello fr");
  EXPECT_EQ(finish, "length");
  Json usage = Json::parse(events[events.size() - 2]);
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["completion_tokens"], 8);
}

TEST_F(HttpServerTest, ChatUsesTheTemplateAndStreamsDeltas) {
  Start();
  std::vector<std::string> events =
      PostStream("/v1/chat/completions",
                 ChatBody({{"stream", true}, {"chat_template_kwargs", {{"suffix", "[x]"}}}}));
  ASSERT_GE(events.size(), 3u);
  Json first = Json::parse(events[0]);
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_THAT(first["id"].get<std::string>(), StartsWith("chatcmpl-"));
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  std::string text;
  for (size_t i = 1; i + 1 < events.size(); ++i) {
    Json delta = Json::parse(events[i])["choices"][0]["delta"];
    if (delta.contains("content")) text += delta["content"].get<std::string>();
  }
  EXPECT_EQ(text, "Hello");
  EXPECT_EQ(Json::parse(events[events.size() - 2])["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(events.back(), "[DONE]");
  // The chat prompt is the rendered template, tokenized without extra special tokens.
  EXPECT_EQ(engine_->last_request().prompt_ids,
            *engine_->Tokenize("<user>Say hi\n[x]<assistant>", false));
}

TEST_F(HttpServerTest, ChatNonStreaming) {
  Start();
  httplib::Result res = PostJson("/v1/chat/completions", ChatBody());
  ASSERT_EQ(res->status, 200) << res->body;
  Json body = Json::parse(res->body);
  EXPECT_EQ(body["object"], "chat.completion");
  EXPECT_EQ(body["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(body["choices"][0]["message"]["content"], "Hello");
  EXPECT_EQ(body["usage"]["completion_tokens"], 5);
}

TEST_F(HttpServerTest, ChatWithoutMaxTokensUsesTheRestOfTheContext) {
  Start({.eos_after_replies = 1, .max_context = 100});
  Json body = ChatBody();
  body.erase("max_tokens");
  ASSERT_EQ(PostJson("/v1/chat/completions", body)->status, 200);
  int prompt = static_cast<int>(engine_->last_request().prompt_ids.size());
  EXPECT_EQ(engine_->last_request().sampling.max_tokens, 100 - prompt);
}

TEST_F(HttpServerTest, ErrorsUseOpenAiShapeAndStatus) {
  Start({.max_context = 64});
  struct Case {
    std::string path;
    std::string body;
    int status;
    std::string param;
  };
  const Case cases[] = {
      {"/v1/completions", "{oops", 400, ""},
      {"/v1/completions", CompletionBody({{"n", 30}}).dump(), 400, "n"},
      {"/v1/completions", CompletionBody({{"logprobs", 30}}).dump(), 400, "logprobs"},
      {"/v1/completions", CompletionBody({{"min_tokens", 9}, {"max_tokens", 4}}).dump(), 400,
       "min_tokens"},
      {"/v1/completions", CompletionBody({{"model", "gpt-4"}}).dump(), 404, "model"},
      {"/v1/completions", CompletionBody({{"max_tokens", 60}}).dump(), 400, "max_tokens"},
      {"/v1/chat/completions", ChatBody({{"messages", "hi"}}).dump(), 400, "messages"},
  };
  for (const Case& c : cases) {
    httplib::Result res = client_->Post(c.path.c_str(), c.body, "application/json");
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, c.status) << c.body << " -> " << res->body;
    Json body = Json::parse(res->body);
    ASSERT_TRUE(body.contains("error")) << res->body;
    EXPECT_FALSE(body["error"]["message"].get<std::string>().empty());
    EXPECT_TRUE(body["error"]["type"].is_string());
    if (c.param.empty()) {
      EXPECT_TRUE(body["error"]["param"].is_null());
    } else {
      EXPECT_EQ(body["error"]["param"], c.param);
    }
  }
  httplib::Result route = client_->Get("/v1/nothing");
  EXPECT_EQ(route->status, 404);
  EXPECT_THAT(Json::parse(route->body)["error"]["message"].get<std::string>(),
              HasSubstr("/v1/nothing"));
}

TEST_F(HttpServerTest, ApiKeyIsRequiredWhenSet) {
  Start({}, {.api_key = "sekret"});
  httplib::Result none = PostJson("/v1/completions", CompletionBody({{"max_tokens", 1}}));
  EXPECT_EQ(none->status, 401);
  EXPECT_EQ(Json::parse(none->body)["error"]["code"], "invalid_api_key");
  httplib::Result wrong = PostJson("/v1/completions", CompletionBody({{"max_tokens", 1}}),
                                   {{"Authorization", "Bearer nope"}});
  EXPECT_EQ(wrong->status, 401);
  EXPECT_EQ(client_->Get("/v1/models")->status, 401);
  httplib::Result right = PostJson("/v1/completions", CompletionBody({{"max_tokens", 1}}),
                                   {{"Authorization", "Bearer sekret"}});
  EXPECT_EQ(right->status, 200) << right->body;
  EXPECT_EQ(client_->Get("/metrics")->status, 200);  // operators' endpoints stay open
}

TEST_F(HttpServerTest, OverloadIs429AndEngineUnavailableIs503) {
  Start({.step = milliseconds(20)}, {.max_concurrent_requests = 1});
  // Hold the only slot with a long stream, then ask again.
  httplib::Client holder("127.0.0.1", server_->port());
  std::atomic<bool> got_data{false};
  std::thread stream([&] {
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/completions";
    req.body = CompletionBody({{"max_tokens", 1000}, {"stream", true}}).dump();
    req.set_header("Content-Type", "application/json");
    req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) {
      got_data = true;
      got_data.notify_all();
      return false;  // hang up after the first bytes
    };
    httplib::Response res;
    httplib::Error error;
    holder.send(req, res, error);
  });
  got_data.wait(false);
  stream.join();
  // The holder has hung up but its slot may not be released yet; the engine must cancel it.
  std::string held = engine_->last_request().request_id;
  ASSERT_TRUE(engine_->WaitForCancel(held, kWait));
  // The engine hears of the cancel before the server's handler releases the slot.
  const auto deadline = std::chrono::steady_clock::now() + kWait;
  while (client_->Get("/metrics")->body.find("ringserve_api_requests_in_flight 0\n") ==
             std::string::npos &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(5));
  }

  engine_->set_script({.submit_error = absl::UnavailableError("stages are restarting")});
  httplib::Result res = PostJson("/v1/completions", CompletionBody({{"max_tokens", 1}}));
  EXPECT_EQ(res->status, 503) << res->body;
  EXPECT_THAT(res->body, HasSubstr("stages are restarting"));
}

TEST_F(HttpServerTest, ConcurrencyLimitAnswers429) {
  Start({.step = milliseconds(50)}, {.max_concurrent_requests = 1});
  httplib::Client holder("127.0.0.1", server_->port());
  std::atomic<int> phase{0};
  std::thread stream([&] {
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/completions";
    req.body = CompletionBody({{"max_tokens", 1000}, {"stream", true}}).dump();
    req.set_header("Content-Type", "application/json");
    req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) {
      if (phase == 0) {
        phase = 1;
        phase.notify_all();
      }
      return phase != 2;  // keep reading until the test is done
    };
    httplib::Response res;
    httplib::Error error;
    holder.send(req, res, error);
  });
  phase.wait(0);
  httplib::Result res = PostJson("/v1/completions", CompletionBody({{"max_tokens", 1}}));
  EXPECT_EQ(res->status, 429) << res->body;
  EXPECT_EQ(Json::parse(res->body)["error"]["code"], "rate_limit_exceeded");
  phase = 2;
  stream.join();
}

TEST_F(HttpServerTest, StreamingDisconnectCancelsTheRequest) {
  Start({.step = milliseconds(10)});
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.body = CompletionBody({{"max_tokens", 4000}, {"stream", true}}).dump();
  req.set_header("Content-Type", "application/json");
  int chunks = 0;
  req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) { return ++chunks < 3; };
  httplib::Response res;
  httplib::Error error;
  client_->send(req, res, error);
  std::string id = engine_->last_request().request_id;
  ASSERT_FALSE(id.empty()) << httplib::to_string(error) << " " << res.status << " " << res.body;
  EXPECT_TRUE(engine_->WaitForCancel(id, kWait)) << "the engine kept generating for a gone client";
}

// n choices are n engine requests ("<id>", "<id>#1", ...: ids no gRPC client may choose, so
// none can hold one before the choice starts), seeded seed + index; a client that goes away
// cancels every one of them.
TEST_F(HttpServerTest, ChoicesAreSeparateRequestsCancelledTogether) {
  Start({.step = milliseconds(2)});
  httplib::Result res =
      PostJson("/v1/completions", CompletionBody({{"max_tokens", 5}, {"n", 3}, {"seed", 40}}));
  ASSERT_EQ(res->status, 200) << res->body;
  Json body = Json::parse(res->body);
  ASSERT_EQ(body["choices"].size(), 3u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(body["choices"][i]["index"], i);
  EXPECT_EQ(body["usage"]["completion_tokens"], 15);
  const GenerateRequest last = engine_->last_request();
  EXPECT_EQ(last.sampling.seed, 42u) << "choice 2: seed + 2";
  EXPECT_TRUE(last.request_id.ends_with("#2")) << last.request_id;
  EXPECT_FALSE(CheckClientRequestId(last.request_id).ok()) << last.request_id;

  engine_->set_script({.step = milliseconds(10)});
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.body = CompletionBody({{"max_tokens", 4000}, {"stream", true}, {"n", 2}}).dump();
  req.set_header("Content-Type", "application/json");
  int chunks = 0;
  req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) { return ++chunks < 3; };
  httplib::Response streamed;
  httplib::Error error;
  client_->send(req, streamed, error);
  const std::string id = engine_->last_request().request_id;  // choice 1's
  ASSERT_TRUE(id.ends_with("#1")) << id;
  EXPECT_TRUE(engine_->WaitForCancel(id, kWait));
  EXPECT_TRUE(engine_->WaitForCancel(id.substr(0, id.size() - 2), kWait));
}

TEST_F(HttpServerTest, LongNonStreamingRequestStillReturnsValidJson) {
  Start({.step = milliseconds(5)});  // 60 tokens * 5 ms > the 100 ms keep-alive interval
  httplib::Result res = PostJson("/v1/completions", CompletionBody({{"max_tokens", 60}}));
  ASSERT_EQ(res->status, 200);
  Json body = Json::parse(res->body);
  EXPECT_EQ(body["usage"]["completion_tokens"], 60);
}

TEST_F(HttpServerTest, EngineFailureMidGeneration) {
  // 30 tokens * 10 ms: the failure comes well after the 100 ms keep-alive interval, and the
  // non-streaming answer still carries its status.
  Start({.step = milliseconds(10),
         .error = absl::InternalError("stage 2 lost its device"),
         .error_after_tokens = 30});
  httplib::Result res = PostJson("/v1/completions", CompletionBody({{"max_tokens", 50}}));
  EXPECT_EQ(res->status, 500);
  EXPECT_THAT(Json::parse(res->body)["error"]["message"].get<std::string>(),
              HasSubstr("stage 2 lost its device"));
  std::vector<std::string> events =
      PostStream("/v1/completions", CompletionBody({{"max_tokens", 50}, {"stream", true}}));
  ASSERT_GE(events.size(), 2u);
  EXPECT_EQ(events.back(), "[DONE]");
  Json error = Json::parse(events[events.size() - 2]);
  EXPECT_THAT(error["error"]["message"].get<std::string>(), HasSubstr("lost its device"));
}

TEST_F(HttpServerTest, MetricsCountRequestsAndLatencies) {
  Start();
  ASSERT_EQ(PostJson("/v1/completions", CompletionBody({{"max_tokens", 4}}))->status, 200);
  ASSERT_EQ(PostJson("/v1/completions", CompletionBody({{"n", 20}}))->status, 400);
  httplib::Result res = client_->Get("/metrics");
  ASSERT_EQ(res->status, 200);
  EXPECT_THAT(res->get_header_value("Content-Type"), StartsWith("text/plain; version=0.0.4"));
  EXPECT_THAT(res->body,
              HasSubstr("ringserve_requests_total{api=\"http\",outcome=\"length\"} 1\n"));
  EXPECT_THAT(res->body,
              HasSubstr("ringserve_requests_total{api=\"http\",outcome=\"rejected\"} 1\n"));
  EXPECT_THAT(res->body, HasSubstr("ringserve_time_to_first_token_seconds_count 1\n"));
  EXPECT_THAT(res->body, HasSubstr("ringserve_inter_token_latency_seconds_count 3\n"));
  EXPECT_THAT(res->body, HasSubstr("ringserve_stage_busy_ratio{stage=\"2\"}"));
  EXPECT_THAT(
      res->body,
      HasSubstr("ringserve_http_responses_total{route=\"/v1/completions\",code=\"400\"} 1"));
}

TEST_F(HttpServerTest, DashboardAndItsData) {
  Start();
  httplib::Result page = client_->Get("/dashboard");
  ASSERT_EQ(page->status, 200);
  EXPECT_THAT(page->get_header_value("Content-Type"), StartsWith("text/html"));
  EXPECT_THAT(page->body, HasSubstr("/dashboard/data"));
  EXPECT_THAT(page->body, HasSubstr("</html>"));
  ASSERT_EQ(PostJson("/v1/completions", CompletionBody({{"max_tokens", 3}}))->status, 200);
  Json data = Json::parse(client_->Get("/dashboard/data")->body);
  ASSERT_EQ(data["stages"].size(), 3u);
  EXPECT_EQ(data["stages"][1]["load_status"], "ready");
  EXPECT_FALSE(data["spans"].empty());
  EXPECT_GT(data["now_us"].get<int64_t>(), 0);
  EXPECT_EQ(client_->Get("/health")->status, 200);
}

}  // namespace
}  // namespace ringserve::http
