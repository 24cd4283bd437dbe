// The HTTP front end under hostile or unlucky clients, over real loopback sockets: deep JSON,
// large bodies, huge prompts, slow and idle connections, a connection cap, saturated
// generation, queue timeouts, and clients that go away while waiting.
#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "coordinator/http/fake_engine.h"
#include "coordinator/http/http_server.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ringserve::http {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using Json = nlohmann::json;
using std::chrono::milliseconds;

constexpr milliseconds kWait(10000);

// A raw TCP connection to the server (for clients cpp-httplib's client will not imitate).
class RawConnection {
 public:
  explicit RawConnection(int port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  }
  ~RawConnection() {
    if (fd_ >= 0) ::close(fd_);
  }
  bool connected() const { return connected_; }
  bool Send(std::string_view data) {
    return ::send(fd_, data.data(), data.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(data.size());
  }
  // Reads until the peer closes or `timeout` passes.
  std::string ReadAll(milliseconds timeout) {
    std::string out;
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      pollfd p{.fd = fd_, .events = POLLIN, .revents = 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      char buf[4096];
      ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
      if (n <= 0) break;
      out.append(buf, static_cast<size_t>(n));
    }
    return out;
  }
  void Close() {
    ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
  bool connected_ = false;
};

std::string PostRequest(const std::string& path, const std::string& body) {
  return "POST " + path + " HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" +
         "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
}

class HttpLimitsTest : public ::testing::Test {
 protected:
  void Start(FakeEngine::Script script = {}, HttpServer::Options options = {}) {
    engine_ = std::make_unique<FakeEngine>(std::move(script));
    if (options.keepalive_interval == milliseconds(1000)) {
      options.keepalive_interval = milliseconds(50);
    }
    server_ = std::make_unique<HttpServer>(*engine_, nullptr, options);
    ASSERT_TRUE(server_->Start().ok());
    client_ = std::make_unique<httplib::Client>("127.0.0.1", server_->port());
    client_->set_read_timeout(10, 0);
  }
  void TearDown() override {
    if (server_) server_->Stop();
  }
  httplib::Result Post(const std::string& body) {
    return client_->Post("/v1/completions", body, "application/json");
  }
  static Json Body(Json extra = Json::object()) {
    Json body = {{"model", "fake-model"}, {"prompt", "Say hi"}, {"max_tokens", 4}};
    body.update(extra);
    return body;
  }

  std::unique_ptr<FakeEngine> engine_;
  std::unique_ptr<HttpServer> server_;
  std::unique_ptr<httplib::Client> client_;
};

TEST_F(HttpLimitsTest, DeeplyNestedJsonIs400AndTheServerStaysUp) {
  Start();
  // The 40 KB body that used to overflow the stack, in a message and in the prompt.
  std::string deep = std::string(20000, '[') + std::string(20000, ']');
  std::string body = R"({"model": "fake-model", "prompt": )" + deep + "}";
  httplib::Result res = Post(body);
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 400);
  EXPECT_THAT(res->body, HasSubstr("nested deeper"));
  res = client_->Post(
      "/v1/chat/completions",
      R"({"model": "fake-model", "messages": [{"role": "user", "content": )" + deep + "}]}",
      "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 400);
  EXPECT_EQ(client_->Get("/health")->status, 200);
}

TEST_F(HttpLimitsTest, BodiesOverTheLimitAre413) {
  Start({}, {.max_body_bytes = 64 << 10});
  Json big = Body({{"prompt", std::string(100 << 10, 'a')}});
  httplib::Result res = Post(big.dump());
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 413);
  EXPECT_EQ(Post(Body().dump())->status, 200);
}

TEST_F(HttpLimitsTest, PromptsFarLongerThanTheContextAreRefusedBeforeTokenizing) {
  Start({.max_context = 128});
  // 128 tokens * 64 bytes a token at most: 9000 bytes cannot fit, whatever the tokenizer.
  httplib::Result res = Post(Body({{"prompt", std::string(9000, 'a')}}).dump());
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 400);
  EXPECT_THAT(res->body, HasSubstr("9000 bytes"));
  // Shorter text is tokenized and checked exactly.
  res = Post(Body({{"prompt", std::string(200, 'a')}}).dump());
  EXPECT_EQ(res->status, 400);
  EXPECT_THAT(res->body, HasSubstr("maximum context length is 128 tokens"));
}

TEST_F(HttpLimitsTest, SlowHeadersAreCutOffAtTheRequestDeadline) {
  Start({}, {.request_read_timeout = milliseconds(300)});
  RawConnection slow(server_->port());
  ASSERT_TRUE(slow.connected());
  ASSERT_TRUE(slow.Send("GET /health HTTP/1.1\r\nHost: x\r\n"));
  auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 20; ++i) {  // one header byte every 50 ms: never done
    if (!slow.Send("X")) break;
    std::this_thread::sleep_for(milliseconds(50));
  }
  slow.ReadAll(milliseconds(2000));  // returns when the server closes
  EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(3000));
  EXPECT_EQ(client_->Get("/health")->status, 200);
}

TEST_F(HttpLimitsTest, ConnectionCapAnswers503WithRetryAfter) {
  Start({}, {.max_connections = 4, .idle_timeout = milliseconds(5000)});
  std::vector<std::unique_ptr<RawConnection>> held;
  for (int i = 0; i < 4; ++i) {
    held.push_back(std::make_unique<RawConnection>(server_->port()));
    ASSERT_TRUE(held.back()->Send("GET /health HTTP/1.1\r\nHost: x\r\n\r\n"));
    // Answered, and the connection stays open (keep-alive).
    EXPECT_THAT(held.back()->ReadAll(milliseconds(300)), HasSubstr("200 OK"));
  }
  RawConnection extra(server_->port());
  ASSERT_TRUE(extra.connected());
  std::string answer = extra.ReadAll(milliseconds(2000));
  EXPECT_THAT(answer, HasSubstr("503 Service Unavailable"));
  EXPECT_THAT(answer, HasSubstr("Retry-After: 1"));
  held.clear();  // closing them frees their slots
  bool served = false;
  for (int i = 0; i < 100 && !served; ++i) {
    httplib::Result res = client_->Get("/health");
    served = res && res->status == 200;
    if (!served) std::this_thread::sleep_for(milliseconds(20));
  }
  EXPECT_TRUE(served);
}

TEST_F(HttpLimitsTest, HealthAndMetricsAnswerWhileGenerationIsSaturated) {
  // 100 slow connections and 40 long streams, more than the old 64-thread pool.
  Start({.step = milliseconds(50)}, {.max_concurrent_requests = 40});
  std::vector<std::unique_ptr<RawConnection>> slow;
  for (int i = 0; i < 100; ++i) {
    slow.push_back(std::make_unique<RawConnection>(server_->port()));
    slow.back()->Send("POST /v1/completions HTTP/1.1\r\n");
  }
  std::vector<std::unique_ptr<RawConnection>> streams;
  std::string stream_body = Body({{"max_tokens", 1000}, {"stream", true}}).dump();
  for (int i = 0; i < 40; ++i) {
    streams.push_back(std::make_unique<RawConnection>(server_->port()));
    streams.back()->Send(PostRequest("/v1/completions", stream_body));
  }
  for (int i = 0; i < 100 && engine_->running() < 40; ++i) {
    std::this_thread::sleep_for(milliseconds(20));
  }
  ASSERT_EQ(engine_->running(), 40);
  auto start = std::chrono::steady_clock::now();
  httplib::Result health = client_->Get("/health");
  httplib::Result metrics = client_->Get("/metrics");
  ASSERT_TRUE(health && metrics);
  EXPECT_EQ(health->status, 200);
  EXPECT_EQ(metrics->status, 200);
  EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(1000));
  // The 41st generation request is refused at once, with a hint when to come back.
  httplib::Result refused = Post(Body().dump());
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 429);
  EXPECT_EQ(refused->get_header_value("Retry-After"), "1");
}

TEST_F(HttpLimitsTest, QueueTimeoutAnswers503AndCancels) {
  Start({.step = milliseconds(10), .first_event_delay = milliseconds(5000)},
        {.queue_timeout = milliseconds(200)});
  auto start = std::chrono::steady_clock::now();
  httplib::Result res = Post(Body().dump());
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 503);
  EXPECT_EQ(res->get_header_value("Retry-After"), "1");
  EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(3000));
  EXPECT_TRUE(engine_->WaitForCancel(engine_->last_request().request_id, kWait));
  // Streams too get the status before anything is committed.
  res = Post(Body({{"stream", true}}).dump());
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 503);
}

TEST_F(HttpLimitsTest, NonStreamingClientThatGoesAwayIsCancelled) {
  Start({.step = milliseconds(10)});
  RawConnection client(server_->port());
  ASSERT_TRUE(client.Send(PostRequest("/v1/completions", Body({{"max_tokens", 4000}}).dump())));
  for (int i = 0; i < 100 && engine_->running() == 0; ++i) {
    std::this_thread::sleep_for(milliseconds(10));
  }
  ASSERT_EQ(engine_->running(), 1);
  client.Close();
  EXPECT_TRUE(engine_->WaitForCancel(engine_->last_request().request_id, kWait));
}

TEST_F(HttpLimitsTest, FailureBeforeTheFirstTokenGivesAStatusToStreams) {
  Start({.error = absl::UnavailableError("stage 1 is down"), .error_after_tokens = 0});
  httplib::Result res = Post(Body({{"stream", true}}).dump());
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 503);
  EXPECT_THAT(res->body, HasSubstr("stage 1 is down"));
}

TEST_F(HttpLimitsTest, MetricsCanRequireTheApiKey) {
  Start({}, {.api_key = "sekret", .protect_metrics = true});
  EXPECT_EQ(client_->Get("/metrics")->status, 401);
  EXPECT_EQ(client_->Get("/dashboard/data")->status, 401);
  EXPECT_EQ(client_->Get("/health")->status, 200);
  httplib::Headers auth = {{"Authorization", "Bearer sekret"}};
  httplib::Result res = client_->Get("/metrics", auth);
  ASSERT_EQ(res->status, 200);
  // Stage control endpoints are never published.
  EXPECT_THAT(res->body, Not(HasSubstr("127.0.0.1:700")));
  EXPECT_THAT(client_->Get("/dashboard/data", auth)->body, Not(HasSubstr("127.0.0.1:700")));
  EXPECT_EQ(client_->Get("/metrics", {{"Authorization", "Bearer sekreT"}})->status, 401);
}

}  // namespace
}  // namespace ringserve::http
