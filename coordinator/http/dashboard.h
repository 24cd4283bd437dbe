// The ring-utilization dashboard: one self-contained HTML page (coordinator/http/dashboard.html,
// embedded into the binary at build time) that polls /dashboard/data.
#pragma once

#include <string_view>

#include "coordinator/engine.h"
#include "nlohmann/json.hpp"

namespace ringserve::http {

// The page, byte for byte as dashboard.html (generated dashboard_html.cc).
std::string_view DashboardHtml();

// The page's feed. Shape:
//   {"model": {...}, "requests": {...},
//    "stages": [{"index", "endpoint", "first_layer", "last_layer", "busy_fraction",
//                "mean_step_ms", "micro_batches_in_flight", "kv_blocks_used",
//                "kv_blocks_total", "bytes_sent", "load_status"}],
//    "spans": [{"mb", "stage", "start_us", "end_us", "tokens"}],   // oldest first
//    "now_us": <latest span end, the timeline's right edge>}
nlohmann::json DashboardData(const RingStats& stats, const ModelInfo& model);

}  // namespace ringserve::http
