// The one logging wrapper over spdlog. Every process calls InitLogging once with its role
// ("coordinator", "stage") and, for a stage, its index; the pattern then carries both, e.g.
//   [2026-12-02 15:30:01.123] [stage 2] [info] loaded layers [10, 20)
// Use the RS_LOG_* macros; nothing per token at info level.
#pragma once

#include <string_view>

#include "spdlog/spdlog.h"

namespace ringserve {

// Sets the global logger's name and pattern. `stage_index` < 0 means "not a stage".
// Level comes from RINGSERVE_LOG_LEVEL (trace, debug, info, warn, error), default info.
// Thread-safe to call once at start-up; later calls replace the pattern.
void InitLogging(std::string_view role, int stage_index = -1);

}  // namespace ringserve

#define RS_LOG_TRACE(...) SPDLOG_TRACE(__VA_ARGS__)
#define RS_LOG_DEBUG(...) SPDLOG_DEBUG(__VA_ARGS__)
#define RS_LOG_INFO(...) SPDLOG_INFO(__VA_ARGS__)
#define RS_LOG_WARN(...) SPDLOG_WARN(__VA_ARGS__)
#define RS_LOG_ERROR(...) SPDLOG_ERROR(__VA_ARGS__)
