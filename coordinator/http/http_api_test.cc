#include "coordinator/http/http_api.h"

#include <httplib.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

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
