// Fuzzes chat-template parsing and rendering (coordinator/chat/chat_template.h): the input is a
// Jinja template, optionally followed by "\n---\n" and a JSON messages array to render it with
// (a fixed conversation when absent or not JSON).
#include <cstdint>

#include "coordinator/chat/chat_template.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using nlohmann::ordered_json;
  auto [source, messages_text] = ringserve::fuzz::SplitTwo(ringserve::fuzz::AsText(data, size));
  auto tmpl = ringserve::chat::ChatTemplate::FromString(
      std::string(source), ordered_json{{"bos_token", "<s>"}, {"eos_token", "</s>"}});
  if (!tmpl.ok()) return 0;
  ordered_json messages = ordered_json::parse(messages_text, nullptr, /*allow_exceptions=*/false);
  if (messages.is_discarded() || !messages.is_array()) {
    messages = ordered_json::array({{{"role", "system"}, {"content", "Be brief."}},
                                    {{"role", "user"}, {"content", "Hi"}},
                                    {{"role", "assistant"}, {"content", "Hello"}}});
  }
  ringserve::chat::ChatRenderOptions options;
  options.add_generation_prompt = true;
  options.now = std::chrono::system_clock::time_point();
  (void)tmpl->Render(messages, options);
  return 0;
}
