#include "coordinator/http/openai_protocol.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ringserve::http {
namespace {

using ::testing::HasSubstr;

TEST(OpenAiProtocolTest, ParsesCompletionWithEverySupportedField) {
  absl::StatusOr<OpenAiRequest> r = ParseCompletionRequest(R"({
    "model": "m", "prompt": "hi", "max_tokens": 7, "temperature": 0.5, "top_p": 0.9,
    "top_k": 40, "seed": 42, "stop": ["a", "bc"], "stream": true,
    "stream_options": {"include_usage": true}, "n": 1, "logprobs": null,
    "presence_penalty": 0, "user": "x", "ignore_eos": true, "stop_token_ids": [5, 6]})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->kind, ApiKind::kCompletion);
  EXPECT_EQ(r->model, "m");
  EXPECT_EQ(r->prompt_text, "hi");
  EXPECT_EQ(r->max_tokens, 7);
  EXPECT_FLOAT_EQ(r->sampling.temperature, 0.5f);
  EXPECT_FLOAT_EQ(r->sampling.top_p, 0.9f);
  EXPECT_EQ(r->sampling.top_k, 40);
  EXPECT_EQ(r->sampling.seed, 42u);
  EXPECT_EQ(r->sampling.stop, (std::vector<std::string>{"a", "bc"}));
  EXPECT_EQ(r->sampling.stop_token_ids, (std::vector<int32_t>{5, 6}));
  EXPECT_TRUE(r->sampling.ignore_eos);
  EXPECT_TRUE(r->stream);
  EXPECT_TRUE(r->include_usage);
}

TEST(OpenAiProtocolTest, ParsesChoicesLogprobsAndMinTokens) {
  absl::StatusOr<OpenAiRequest> c = ParseCompletionRequest(
      R"({"model": "m", "prompt": "hi", "n": 3, "logprobs": 4, "min_tokens": 2})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->n, 3);
  EXPECT_TRUE(c->sampling.logprobs);
  EXPECT_EQ(c->sampling.top_logprobs, 4);
  EXPECT_EQ(c->sampling.min_tokens, 2);
  absl::StatusOr<OpenAiRequest> zero =
      ParseCompletionRequest(R"({"model": "m", "prompt": "hi", "logprobs": 0})");
  ASSERT_TRUE(zero.ok()) << zero.status();
  EXPECT_TRUE(zero->sampling.logprobs);  // the sampled tokens' logprobs, no alternatives
  EXPECT_EQ(zero->sampling.top_logprobs, 0);
  absl::StatusOr<OpenAiRequest> chat = ParseChatRequest(
      R"({"model": "m", "messages": [{"role": "user", "content": "x"}], "logprobs": true,
          "top_logprobs": 20, "n": 16})");
  ASSERT_TRUE(chat.ok()) << chat.status();
  EXPECT_TRUE(chat->sampling.logprobs);
  EXPECT_EQ(chat->sampling.top_logprobs, 20);
  EXPECT_EQ(chat->n, 16);
  absl::StatusOr<OpenAiRequest> plain = ParseChatRequest(
      R"({"model": "m", "messages": [{"role": "user", "content": "x"}], "logprobs": false})");
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE(plain->sampling.logprobs);
  EXPECT_EQ(plain->n, 1);
}

TEST(OpenAiProtocolTest, DefaultsFollowOpenAi) {
  absl::StatusOr<OpenAiRequest> r = ParseCompletionRequest(R"({"model": "m", "prompt": "x"})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FLOAT_EQ(r->sampling.temperature, 1.0f);
  EXPECT_FALSE(r->max_tokens.has_value());
  EXPECT_FALSE(r->stream);
  EXPECT_FALSE(r->sampling.seed.has_value());
}

TEST(OpenAiProtocolTest, PromptShapes) {
  absl::StatusOr<OpenAiRequest> ids = ParseCompletionRequest(R"({"model":"m","prompt":[1,2,3]})");
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(ids->prompt_ids, (std::vector<int32_t>{1, 2, 3}));
  absl::StatusOr<OpenAiRequest> one = ParseCompletionRequest(R"({"model":"m","prompt":["x"]})");
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(one->prompt_text, "x");
  absl::StatusOr<OpenAiRequest> nested =
      ParseCompletionRequest(R"({"model":"m","prompt":[[4,5]]})");
  ASSERT_TRUE(nested.ok());
  EXPECT_EQ(nested->prompt_ids, (std::vector<int32_t>{4, 5}));
  absl::StatusOr<OpenAiRequest> two = ParseCompletionRequest(R"({"model":"m","prompt":["a","b"]})");
  EXPECT_EQ(two.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ErrorParam(two.status()), "prompt");
  EXPECT_FALSE(ParseCompletionRequest(R"({"model":"m","prompt":[1,-2]})").ok());
  EXPECT_FALSE(ParseCompletionRequest(R"({"model":"m","prompt":""})").ok());
  EXPECT_FALSE(ParseCompletionRequest(R"({"model":"m","prompt":{}})").ok());
}

TEST(OpenAiProtocolTest, MaxCompletionTokensWins) {
  absl::StatusOr<OpenAiRequest> r = ParseChatRequest(
      R"({"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":3,
          "max_completion_tokens":9})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->max_tokens, 9);
}

struct BadCase {
  const char* body;
  const char* param;
  const char* message;
};

TEST(OpenAiProtocolTest, RejectsWhatItCannotHonourNamingTheField) {
  const BadCase cases[] = {
      {R"({"prompt":"x"})", "model", "required"},
      {R"({"model":"m"})", "prompt", "required"},
      {R"({"model":"m","prompt":"x","n":17})", "n", "between 1 and 16"},
      {R"({"model":"m","prompt":"x","n":0})", "n", "between 1 and 16"},
      {R"({"model":"m","prompt":"x","logprobs":21})", "logprobs", "between 0 and 20"},
      {R"({"model":"m","prompt":"x","logprobs":true})", "logprobs", "integer"},
      {R"({"model":"m","prompt":"x","min_tokens":-1})", "min_tokens", "between 0"},
      {R"({"model":"m","prompt":"x","echo":true})", "echo", "not supported"},
      {R"({"model":"m","prompt":"x","best_of":3})", "best_of", "best_of=1"},
      {R"({"model":"m","prompt":"x","temperature":3})", "temperature", "between 0 and 2"},
      {R"({"model":"m","prompt":"x","temperature":"hot"})", "temperature", "number"},
      {R"({"model":"m","prompt":"x","top_p":0})", "top_p", "greater than 0"},
      {R"({"model":"m","prompt":"x","max_tokens":0})", "max_tokens", "at least 1"},
      {R"({"model":"m","prompt":"x","max_tokens":1.5})", "max_tokens", "integer"},
      {R"({"model":"m","prompt":"x","stop":5})", "stop", "string"},
      {R"({"model":"m","prompt":"x","stop":[""]})", "stop", "empty"},
      {R"({"model":"m","prompt":"x","stream_options":{"include_usage":true}})", "stream_options",
       "stream=true"},
      {R"({"model":"m","prompt":"x","frequency_penalty":0.5})", "frequency_penalty",
       "not supported"},
      {R"({"model":"m","prompt":"x","logit_bias":{"1":2}})", "logit_bias", "not supported"},
      {R"({"model":"m","messages":[]})", "messages", "non-empty"},
      {R"({"model":"m","messages":[{"content":"x"}]})", "messages[0].role", "role"},
      {R"({"model":"m","messages":[{"role":"user","content":"x"}],"logprobs":1})", "logprobs",
       "boolean"},
      {R"({"model":"m","messages":[{"role":"user","content":"x"}],"top_logprobs":2})",
       "top_logprobs", "needs 'logprobs'"},
      {R"({"model":"m","messages":[{"role":"user","content":"x"}],"logprobs":true,
          "top_logprobs":21})",
       "top_logprobs", "between 0 and 20"},
      {R"({"model":"m","messages":[{"role":"user","content":"x"}],"tools":[{}]})", "tools",
       "not supported"},
      {R"({"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"},
          {"type":"image_url","image_url":{"url":"http://x"}}]}]})",
       "messages[0].content[1]", "'image_url' is not supported"},
      {R"({"model":"m","messages":[{"role":"user","content":[{"text":"a"}]}]})",
       "messages[0].content[0]", "string 'type'"},
      {R"({"model":"m","messages":[{"role":"user","content":[{"type":"text","text":5}]}]})",
       "messages[0].content[0]", "string 'text'"},
  };
  for (const BadCase& c : cases) {
    std::string body = c.body;
    absl::StatusOr<OpenAiRequest> r = body.find("messages") != std::string::npos
                                          ? ParseChatRequest(body)
                                          : ParseCompletionRequest(body);
    ASSERT_FALSE(r.ok()) << body;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << body;
    EXPECT_EQ(ErrorParam(r.status()), c.param) << body;
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(c.message)) << body;
  }
}

TEST(OpenAiProtocolTest, BadJsonIsA400WithoutParam) {
  absl::StatusOr<OpenAiRequest> r = ParseCompletionRequest("{not json");
  ASSERT_FALSE(r.ok());
  ApiError error = ApiErrorFromStatus(r.status());
  EXPECT_EQ(error.http_status, 400);
  EXPECT_EQ(error.type, "invalid_request_error");
  nlohmann::json json = ApiErrorJson(error);
  EXPECT_TRUE(json["error"]["param"].is_null());
  EXPECT_TRUE(json["error"]["code"].is_null());
  EXPECT_THAT(json["error"]["message"].get<std::string>(), HasSubstr("not valid JSON"));
}

TEST(OpenAiProtocolTest, StatusCodesMapToHttp) {
  EXPECT_EQ(ApiErrorFromStatus(absl::InvalidArgumentError("x")).http_status, 400);
  EXPECT_EQ(ApiErrorFromStatus(absl::UnauthenticatedError("x")).http_status, 401);
  EXPECT_EQ(ApiErrorFromStatus(absl::NotFoundError("x")).http_status, 404);
  EXPECT_EQ(ApiErrorFromStatus(absl::ResourceExhaustedError("x")).http_status, 429);
  EXPECT_EQ(ApiErrorFromStatus(absl::UnavailableError("x")).http_status, 503);
  EXPECT_EQ(ApiErrorFromStatus(absl::InternalError("x")).http_status, 500);
}

TEST(OpenAiProtocolTest, ChunksHaveOpenAiShape) {
  ResponseHeader header{.id = "chatcmpl-1", .created = 5, .model = "m"};
  nlohmann::json first = ChatChunk(header, "", /*first=*/true, FinishReason::kNone);
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(first["choices"][0]["delta"]["content"], "");
  EXPECT_TRUE(first["choices"][0]["finish_reason"].is_null());
  nlohmann::json last = ChatChunk(header, "", /*first=*/false, FinishReason::kLength);
  EXPECT_TRUE(last["choices"][0]["delta"].empty());
  EXPECT_EQ(last["choices"][0]["finish_reason"], "length");
  nlohmann::json usage =
      UsageChunk(ApiKind::kChat, header, {.prompt_tokens = 3, .completion_tokens = 4});
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["total_tokens"], 7);
  EXPECT_EQ(SseEvent(nlohmann::json{{"a", 1}}), "data: {\"a\":1}\n\n");
  nlohmann::json completion = CompletionResponse(header, "abc", FinishReason::kStop,
                                                 {.prompt_tokens = 1, .completion_tokens = 2});
  EXPECT_EQ(completion["object"], "text_completion");
  EXPECT_EQ(completion["choices"][0]["text"], "abc");
  EXPECT_EQ(completion["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(completion["usage"]["completion_tokens"], 2);
}

}  // namespace
}  // namespace ringserve::http
