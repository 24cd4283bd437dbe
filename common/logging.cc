#include "common/logging.h"

#include <cstdlib>
#include <string>

#include "fmt/format.h"

namespace ringserve {

void InitLogging(std::string_view role, int stage_index) {
  std::string tag = stage_index >= 0 ? fmt::format("{} {}", role, stage_index) : std::string(role);
  spdlog::set_pattern("[%Y-%m-%d %H:%M:%S.%e] [" + tag + "] [%l] %v");
  // The only environment switch for logging, documented in README.md.
  const char* level = std::getenv("RINGSERVE_LOG_LEVEL");
  spdlog::set_level(level ? spdlog::level::from_str(level) : spdlog::level::info);
}

}  // namespace ringserve
