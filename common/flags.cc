#include "common/flags.h"

#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"

namespace ringserve {

std::string NormalizeFlagSpelling(std::string_view arg) {
  if (arg.size() <= 2 || arg.substr(0, 2) != "--") return std::string(arg);
  const size_t eq = arg.find('=');
  std::string name(arg.substr(2, eq == std::string_view::npos ? std::string_view::npos : eq - 2));
  if (name.rfind("no-", 0) == 0) name = "no" + name.substr(3);  // --no-x: absl's --nox
  for (char& c : name) {
    if (c == '-') c = '_';
  }
  return "--" + name + std::string(eq == std::string_view::npos ? "" : arg.substr(eq));
}

void ParseCommandLineFlags(int argc, char** argv, absl::string_view usage,
                           std::vector<std::string>* positional_args) {
  absl::FlagsUsageConfig config;
  // --help lists the flags of our own sources (the binary's main file and any library), not
  // absl's: absl's default shows only flags of a file named like the binary.
  config.contains_help_flags = [](absl::string_view file) {
    return !absl::StrContains(file, "absl/");
  };
  config.contains_helpshort_flags = config.contains_help_flags;
  config.normalize_filename = [](absl::string_view file) { return std::string(file); };
  absl::SetFlagsUsageConfig(config);
  absl::SetProgramUsageMessage(usage);
  // Old spellings with dashes (--max-tokens) keep working: names are normalized to underscores
  // up to a bare "--".
  std::vector<std::string> normalized;
  bool flags_done = false;
  for (int i = 0; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--") flags_done = true;
    normalized.push_back(i == 0 || flags_done ? std::string(arg) : NormalizeFlagSpelling(arg));
  }
  std::vector<char*> normalized_argv;
  for (std::string& arg : normalized) normalized_argv.push_back(arg.data());
  normalized_argv.push_back(nullptr);
  // Unknown flags and bad values: absl prints the error and exits.
  std::vector<char*> args = absl::ParseCommandLine(argc, normalized_argv.data());
  std::vector<std::string> positional;
  for (size_t i = 1; i < args.size(); ++i) positional.emplace_back(args[i]);
  if (positional_args != nullptr) {
    *positional_args = std::move(positional);
    return;
  }
  if (!positional.empty()) {
    std::fprintf(stderr, "%s: unexpected argument '%s' (flags are --name=value; see --help)\n",
                 argv[0], positional[0].c_str());
    std::exit(2);
  }
}

}  // namespace ringserve
