// Fuzzes tokenizer.json loading (coordinator/tokenizer): the input is tokenizer.json, optionally
// followed by "\n---\n" and text to encode (and decode back) when it loads.
#include <cstdint>

#include "coordinator/tokenizer/tokenizer.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto [json, text] = ringserve::fuzz::SplitTwo(ringserve::fuzz::AsText(data, size));
  auto tokenizer = ringserve::Tokenizer::FromJson(absl::string_view(json.data(), json.size()), "",
                                                  ringserve::Tokenizer::Options{});
  if (!tokenizer.ok()) return 0;
  auto ids = (*tokenizer)
                 ->Encode(absl::string_view(text.data(), text.size()),
                          /*add_special_tokens=*/true);
  if (ids.ok()) (void)(*tokenizer)->Decode(*ids, /*skip_special_tokens=*/false);
  return 0;
}
