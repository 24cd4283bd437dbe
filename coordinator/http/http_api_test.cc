#include "coordinator/http/http_api.h"

#include <httplib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "common/testing/fifo_watchdog.h"
#include "common/testing/temp_dir.h"
#include "coordinator/http/fake_engine.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ringserve::http {
namespace {

using ::testing::HasSubstr;

TEST(HttpApiTest, ParsesListenAddresses) {
  auto v4 = ParseListenAddress("0.0.0.0:8000", "api.http");
  ASSERT_TRUE(v4.ok());
  EXPECT_EQ(v4->first, "0.0.0.0");
  EXPECT_EQ(v4->second, 8000);
  auto v6 = ParseListenAddress("[::1]:0", "api.http");
  ASSERT_TRUE(v6.ok());
  EXPECT_EQ(v6->first, "::1");
  for (const char* bad : {"8000", ":8000", "host:", "host:http", "host:70000"}) {
    auto parsed = ParseListenAddress(bad, "api.http");
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(std::string(parsed.status().message()), HasSubstr("api.http")) << bad;
  }
}

TEST(HttpApiTest, ReadsApiKeyFiles) {
  std::string path = ::testing::TempDir() + "/rs_api_key_" + std::to_string(getpid());
  std::ofstream(path) << "  sk-local-123\n";
  EXPECT_EQ(*ReadApiKeyFile(path), "sk-local-123");
  std::ofstream(path) << "\n";
  EXPECT_EQ(ReadApiKeyFile(path).status().code(), absl::StatusCode::kInvalidArgument);
  std::filesystem::remove(path);
  EXPECT_EQ(ReadApiKeyFile(path).status().code(), absl::StatusCode::kNotFound);
}

TEST(HttpApiTest, ApiKeyFileThatIsAFifoOrDeviceIsRefusedWithoutBlocking) {
  ringserve::testing::TempDir dir;
  const std::string fifo = dir.path() + "/api.key";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  absl::StatusOr<std::string> key;
  EXPECT_TRUE(ringserve::testing::ReturnsWithoutAWriter(fifo, [&] { key = ReadApiKeyFile(fifo); }))
      << "reading blocked on the FIFO";
  EXPECT_EQ(key.status().code(), absl::StatusCode::kInvalidArgument) << key.status();
  EXPECT_THAT(std::string(key.status().message()), HasSubstr(fifo));
  const std::string zero = dir.path() + "/zero.key";
  std::filesystem::create_symlink("/dev/zero", zero);
  EXPECT_EQ(ReadApiKeyFile(zero).status().code(), absl::StatusCode::kInvalidArgument);
}

// The model directory's real chat template (tests/ops/tiny_tokenizer: ChatML) builds the prompt.
TEST(HttpApiTest, ChatPromptComesFromTheModelsTemplate) {
  FakeEngine engine({});
  auto server = StartHttpApi(engine, "tests/ops/tiny_tokenizer", {.listen = "127.0.0.1:0"});
  ASSERT_TRUE(server.ok()) << server.status();
  httplib::Client client("127.0.0.1", (*server)->port());
  nlohmann::json body = {{"model", "fake-model"},
                         {"messages", {{{"role", "user"}, {"content", "hi"}}}},
                         {"max_tokens", 2}};
  auto res = client.Post("/v1/chat/completions", body.dump(), "application/json");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  EXPECT_EQ(engine.last_request().prompt_ids,
            *engine.Tokenize("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", false));
  (*server)->Stop();
}

// A model's chat template is untrusted: one that builds a huge value for some conversation
// fails that request with a 400 naming the limit, and the server goes on serving.
TEST(HttpApiTest, TemplateOverItsBudgetFailsOnlyThatRequest) {
  std::string dir = ::testing::TempDir() + "/rs_hostile_template_" + std::to_string(getpid());
  std::filesystem::create_directories(dir);
  std::string source = "{% if messages[0].content == 'explode' %}{% set l = [1] %}";
  for (int i = 0; i < 40; ++i) source += "{% set l = [l, l] %}";
  source += "{{ l }}{% else %}{{ messages[0].content }}{% endif %}";
  std::ofstream(dir + "/tokenizer_config.json") << nlohmann::json({{"chat_template", source}});
  FakeEngine engine({});
  auto server = StartHttpApi(engine, dir, {.listen = "127.0.0.1:0"});
  ASSERT_TRUE(server.ok()) << server.status();
  httplib::Client client("127.0.0.1", (*server)->port());
  client.set_read_timeout(60, 0);
  auto chat = [&](const std::string& content) {
    nlohmann::json body = {{"model", "fake-model"},
                           {"messages", {{{"role", "user"}, {"content", content}}}},
                           {"max_tokens", 2}};
    return client.Post("/v1/chat/completions", body.dump(), "application/json");
  };
  auto hostile = chat("explode");
  ASSERT_TRUE(hostile);
  EXPECT_EQ(hostile->status, 400) << hostile->body;
  EXPECT_THAT(hostile->body, HasSubstr("Cannot apply the chat template"));
  EXPECT_THAT(hostile->body, HasSubstr("render exceeds 10000000 steps"));
  auto normal = chat("hi");
  ASSERT_TRUE(normal);
  EXPECT_EQ(normal->status, 200) << normal->body;
  EXPECT_EQ(engine.last_request().prompt_ids, *engine.Tokenize("hi", false));
  (*server)->Stop();
  std::filesystem::remove_all(dir);
}

TEST(HttpApiTest, NoTemplateMeansChatIsRefusedButCompletionsWork) {
  FakeEngine engine({});
  std::string empty_dir = ::testing::TempDir();
  auto server = StartHttpApi(engine, empty_dir, {.listen = "127.0.0.1:0", .api_key = "k"});
  ASSERT_TRUE(server.ok()) << server.status();
  httplib::Client client("127.0.0.1", (*server)->port());
  httplib::Headers auth = {{"Authorization", "Bearer k"}};
  nlohmann::json chat = {{"model", "fake-model"},
                         {"messages", {{{"role", "user"}, {"content", "hi"}}}}};
  auto refused = client.Post("/v1/chat/completions", auth, chat.dump(), "application/json");
  EXPECT_EQ(refused->status, 400);
  EXPECT_THAT(refused->body, HasSubstr("no chat template"));
  nlohmann::json completion = {{"model", "fake-model"}, {"prompt", "x"}, {"max_tokens", 1}};
  EXPECT_EQ(client.Post("/v1/completions", auth, completion.dump(), "application/json")->status,
            200);
}

TEST(HttpApiTest, BusyPortIsUnavailable) {
  FakeEngine engine({});
  auto first = StartHttpApi(engine, "", {.listen = "127.0.0.1:0"});
  ASSERT_TRUE(first.ok());
  auto second =
      StartHttpApi(engine, "", {.listen = "127.0.0.1:" + std::to_string((*first)->port())});
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace ringserve::http
