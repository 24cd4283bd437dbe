// UTF-8 encoding of one code point, shared by the tokenizer and the chat-template interpreter.
#pragma once

#include <string>

namespace ringserve {

// Appends the UTF-8 encoding (1 to 4 bytes) of `cp` to `out`. `cp` must be <= U+10FFFF.
void AppendUtf8(char32_t cp, std::string* out);

}  // namespace ringserve
