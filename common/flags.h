// Command-line flags for every ringserve binary: absl flags (ABSL_FLAG in the binary's main file),
// one spelling for the same setting everywhere (--model, --listen, --target, ...), underscores
// between words. ParseCommandLineFlags parses them once at the top of main. The older spellings
// with dashes keep working (--max-tokens is --max_tokens, --no-ignore-eos is --noignore_eos).
//
// `--help` lists every flag of the binary with its default (absl's --helpfull adds absl's own).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/string_view.h"

namespace ringserve {

// Parses argv with absl::ParseCommandLine after setting `usage` (the first line: what the binary
// does; later lines: "Usage: ..."). Exits (absl's status 1) after --help / --helpfull, on an
// unknown flag or a bad value, naming it; with status 2 on an argument that is not a flag unless
// `positional_args` is given, which then receives the arguments after argv[0] that are not
// flags. Call once, before any flag is read.
void ParseCommandLineFlags(int argc, char** argv, absl::string_view usage,
                           std::vector<std::string>* positional_args = nullptr);

// One argument in the canonical spelling: a flag's name ("--a-b=c-d") with underscores and absl's
// "--no" prefix for false booleans ("--a_b=c-d", "--no-x" -> "--nox"); anything else unchanged.
std::string NormalizeFlagSpelling(std::string_view arg);

}  // namespace ringserve
