// Bounds on JSON that comes from outside the process (request bodies, model files). Deeply
// nested input is refused before anything recursive (nlohmann's dump and destructor of nested
// values, our JSON-to-template-value conversion, config walkers) touches it, so a 40 KB body of
// brackets cannot overflow a thread's stack.
//
// Thread-safe (pure functions).
#pragma once

#include <string_view>

#include "absl/status/status.h"

namespace ringserve {

// Nesting depth every external JSON document may have. OpenAI requests need about 6 (messages
// -> content parts -> image_url), tokenizer.json about 6, tool schemas a few more.
inline constexpr int kMaxJsonDepth = 64;

// Scans `text` without parsing it and returns InvalidArgument naming `what` when arrays and
// objects nest deeper than `max_depth` (brackets inside strings do not count). Malformed JSON
// is not diagnosed here: the parser does that.
absl::Status CheckJsonDepth(std::string_view text, std::string_view what,
                            int max_depth = kMaxJsonDepth);

}  // namespace ringserve
