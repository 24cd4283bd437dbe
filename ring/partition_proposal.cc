#include "ring/partition_proposal.h"

#include <algorithm>
#include <limits>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "fmt/format.h"

namespace ringserve {
namespace {

std::string Gib(int64_t bytes) {
  if (bytes < (int64_t{1} << 30)) return fmt::format("{:.2f} MiB", bytes / double(1 << 20));
  return fmt::format("{:.2f} GiB", bytes / double(int64_t{1} << 30));
}

// The non-empty pieces of `text` between `separator`s.
std::vector<std::string> Split(std::string_view text, char separator) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find(separator, start);
    if (end == std::string_view::npos) end = text.size();
    if (end > start) out.emplace_back(text.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

}  // namespace

std::string FormatLayerCostProfile(const LayerCostProfile& p) {
  std::string out = fmt::format("probe {} rows {} context {} memory {} kv_bytes {}\n", p.device,
                                p.rows, p.context, p.memory_bytes, p.kv_bytes_per_token_and_layer);
  for (size_t i = 0; i < p.layers.size(); ++i) {
    out += fmt::format("layer {} us {:.3f} bytes {}\n", i, p.layers[i].step_us, p.layers[i].bytes);
  }
  return out;
}

absl::StatusOr<LayerCostProfile> ParseLayerCostProfile(std::string_view text) {
  LayerCostProfile p;
  bool header = false;
  int line_no = 0;
  for (const std::string& line : Split(text, '\n')) {
    ++line_no;
    const std::vector<std::string> f = Split(line, ' ');
    if (f.empty()) continue;
    auto bad = [&](std::string_view what) {
      return absl::InvalidArgumentError(
          fmt::format("layer cost profile line {} ('{}'): {}", line_no, line, what));
    };
    if (!f.empty() && f[0] == "probe") {
      if (header) return bad("a second header");
      if (f.size() != 10 || f[2] != "rows" || f[4] != "context" || f[6] != "memory" ||
          f[8] != "kv_bytes" || !absl::SimpleAtoi(f[3], &p.rows) ||
          !absl::SimpleAtoi(f[5], &p.context) || !absl::SimpleAtoi(f[7], &p.memory_bytes) ||
          !absl::SimpleAtoi(f[9], &p.kv_bytes_per_token_and_layer)) {
        return bad("expected 'probe DEVICE rows R context C memory M kv_bytes K'");
      }
      p.device = f[1];
      header = true;
      continue;
    }
    int index = -1;
    LayerCost cost;
    if (f.size() != 6 || f[0] != "layer" || f[2] != "us" || f[4] != "bytes" ||
        !absl::SimpleAtoi(f[1], &index) || !absl::SimpleAtod(f[3], &cost.step_us) ||
        !absl::SimpleAtoi(f[5], &cost.bytes)) {
      return bad("expected 'layer I us T bytes B'");
    }
    if (!header) return bad("a layer before the 'probe' header");
    if (index != static_cast<int>(p.layers.size())) {
      return bad(fmt::format("layer {} where layer {} was expected", index, p.layers.size()));
    }
    if (cost.step_us < 0 || cost.bytes < 0) return bad("a negative cost");
    p.layers.push_back(cost);
  }
  if (!header) return absl::InvalidArgumentError("layer cost profile: no 'probe' header");
  if (p.layers.empty()) return absl::InvalidArgumentError("layer cost profile: no layers");
  return p;
}

absl::StatusOr<PartitionProposal> ProposePartition(std::span<const LayerCost> layers,
                                                   std::span<const int64_t> stage_memory) {
  const int n = static_cast<int>(layers.size());
  const int stages = static_cast<int>(stage_memory.size());
  if (stages < 1 || stages > n) {
    return absl::InvalidArgumentError(
        fmt::format("cannot split {} layers into {} non-empty stages", n, stages));
  }
  std::vector<double> us(n + 1, 0);
  std::vector<int64_t> bytes(n + 1, 0);
  for (int i = 0; i < n; ++i) {
    if (layers[i].step_us < 0 || layers[i].bytes < 0) {
      return absl::InvalidArgumentError(fmt::format("layer {} has a negative cost", i));
    }
    us[i + 1] = us[i] + layers[i].step_us;
    bytes[i + 1] = bytes[i] + layers[i].bytes;
  }
  constexpr double kInf = std::numeric_limits<double>::infinity();
  // best[s][i]: the smallest slowest-stage time of the last s stages over layers [i, n), every
  // one within its memory; stage (stages - s) takes layers [i, j).
  auto fits = [&](int s, int i, int j) { return bytes[j] - bytes[i] <= stage_memory[stages - s]; };
  std::vector<std::vector<double>> best(stages + 1, std::vector<double>(n + 1, kInf));
  best[0][n] = 0;
  for (int s = 1; s <= stages; ++s) {
    for (int i = n - s; i >= 0; --i) {
      for (int j = i + 1; j <= n - (s - 1); ++j) {
        if (best[s - 1][j] == kInf || !fits(s, i, j)) continue;
        best[s][i] = std::min(best[s][i], std::max(us[j] - us[i], best[s - 1][j]));
      }
    }
  }
  const double target = best[stages][0];
  if (target == kInf) {
    int64_t widest = 0;
    for (const LayerCost& l : layers) widest = std::max(widest, l.bytes);
    return absl::InvalidArgumentError(fmt::format(
        "no split of {} layers ({} in all, the largest layer {}) fits {} stage(s) of {} each", n,
        Gib(bytes[n]), Gib(widest), stages,
        Gib(*std::min_element(stage_memory.begin(), stage_memory.end()))));
  }
  std::vector<int> counts;
  int i = 0;
  for (int s = stages; s >= 1; --s) {
    for (int j = i + 1; j <= n - (s - 1); ++j) {
      if (fits(s, i, j) && us[j] - us[i] <= target && best[s - 1][j] <= target) {
        counts.push_back(j - i);
        i = j;
        break;
      }
    }
  }
  return EvaluatePartition(layers, counts);
}

PartitionProposal EvaluatePartition(std::span<const LayerCost> layers,
                                    std::span<const int> counts) {
  PartitionProposal p;
  p.counts.assign(counts.begin(), counts.end());
  size_t layer = 0;
  for (int count : counts) {
    double us = 0;
    int64_t bytes = 0;
    for (int k = 0; k < count && layer < layers.size(); ++k, ++layer) {
      us += layers[layer].step_us;
      bytes += layers[layer].bytes;
    }
    p.stage_us.push_back(us);
    p.stage_bytes.push_back(bytes);
  }
  return p;
}

std::string DescribePartition(const PartitionProposal& p, std::span<const int64_t> stage_memory) {
  std::string out;
  int first = 0;
  for (size_t s = 0; s < p.counts.size(); ++s) {
    out += fmt::format("{}stage {}: layers [{}, {}) {:.3f} ms, {}", s ? "; " : "", s, first,
                       first + p.counts[s], p.stage_us[s] / 1000, Gib(p.stage_bytes[s]));
    if (s < stage_memory.size()) out += fmt::format(" of {}", Gib(stage_memory[s]));
    first += p.counts[s];
  }
  return out;
}

}  // namespace ringserve
