// Fuzzes the OpenAI request parsers (coordinator/http/openai_protocol.h), completions and chat.
#include <cstdint>

#include "coordinator/http/openai_protocol.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view body = ringserve::fuzz::AsText(data, size);
  (void)ringserve::http::ParseCompletionRequest(body);
  auto chat = ringserve::http::ParseChatRequest(body);
  if (!chat.ok())
    (void)ringserve::http::ApiErrorJson(ringserve::http::ApiErrorFromStatus(chat.status())).dump();
  return 0;
}
