#include "coordinator/measured_partition.h"

#include <stdlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "coordinator/subprocess.h"
#include "fmt/format.h"
#include "ring/model_config.h"
#include "ring/partition_by_cost.h"

namespace ringserve {
namespace {

std::string ReadFile(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string LastLine(std::string text) {
  while (!text.empty() && text.back() == '\n') text.pop_back();
  const size_t newline = text.rfind('\n');
  return newline == std::string::npos ? text : text.substr(newline + 1);
}

// The probe's files live in a directory made for one probe by mkdtemp (an unpredictable name,
// created exclusively, mode 0700) and removed with them on every path out: in a shared temp
// directory nobody can plant a symlink or file where the probe writes, or read what it wrote.
class ProbeDir {
 public:
  ProbeDir() = default;
  ProbeDir(const ProbeDir&) = delete;
  ProbeDir& operator=(const ProbeDir&) = delete;
  ~ProbeDir() {
    std::error_code ignored;
    if (!path_.empty()) std::filesystem::remove_all(path_, ignored);
  }

  absl::Status Make() {
    std::error_code error;
    const std::filesystem::path temp = std::filesystem::temp_directory_path(error);
    if (error) {
      return absl::FailedPreconditionError(
          fmt::format("no temporary directory for the layer probe: {}", error.message()));
    }
    std::string pattern = (temp / "ringserve_layer_probe_XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) {
      return absl::FailedPreconditionError(fmt::format(
          "cannot make a directory for the layer probe ({}): {}", pattern, std::strerror(errno)));
    }
    path_ = pattern;
    return absl::OkStatus();
  }
  std::filesystem::path path() const { return path_; }

 private:
  std::filesystem::path path_;
};

}  // namespace

absl::StatusOr<MeasuredPartition> ProposeFromProfile(const LayerCostProfile& profile,
                                                     int num_layers, int max_positions,
                                                     std::span<const int64_t> parameter_costs,
                                                     const MeasuredPartitionOptions& o) {
  if (static_cast<int>(profile.layers.size()) != num_layers) {
    return absl::InvalidArgumentError(fmt::format(
        "the layer probe measured {} layers, the model has {}", profile.layers.size(), num_layers));
  }
  const int stages = std::clamp(o.num_stages, 1, num_layers);
  const int64_t floor_tokens =
      max_positions > 0 ? std::min(o.kv_floor_tokens, max_positions) : o.kv_floor_tokens;
  std::vector<LayerCost> layers = profile.layers;
  for (LayerCost& layer : layers) {
    layer.bytes += floor_tokens * profile.kv_bytes_per_token_and_layer;
  }
  const std::vector<int64_t> memory(
      stages, static_cast<int64_t>(profile.memory_bytes * o.memory_fraction / stages));
  RS_ASSIGN_OR_RETURN(PartitionProposal proposal, ProposePartition(layers, memory));
  MeasuredPartition out{.counts = proposal.counts, .profile = profile};
  double dense_us = 0, slowest_us = 0;
  for (const LayerCost& layer : profile.layers) {
    dense_us = std::max(dense_us, layer.step_us);
  }
  for (double us : proposal.stage_us) slowest_us = std::max(slowest_us, us);
  out.why = fmt::format(
      "{}, minimizing the slowest stage's measured decode step ({} rows at context {} on {}: "
      "the layers took {:.3f} to {:.3f} ms; layer 0 includes the embedding, the last layer "
      "the lm_head and sampling) with each stage's weights and the K/V of {} tokens within "
      "{:.0f}% of the device's memory / {} stage(s): {}",
      absl::StrJoin(proposal.counts, ","), profile.rows, profile.context, profile.device,
      std::min_element(
          profile.layers.begin(), profile.layers.end(),
          [](const LayerCost& a, const LayerCost& b) {
            return a.step_us < b.step_us;
          })->step_us /
          1000,
      dense_us / 1000, floor_tokens, o.memory_fraction * 100, stages,
      DescribePartition(proposal, memory));
  // What balancing weight parameters (the earlier rule) would cost, on the measured times.
  if (static_cast<int>(parameter_costs.size()) == num_layers) {
    absl::StatusOr<std::vector<int>> by_params = PartitionByCost(parameter_costs, stages);
    if (by_params.ok() && *by_params != proposal.counts) {
      const PartitionProposal other = EvaluatePartition(layers, *by_params);
      out.why += fmt::format(
          "; balancing weight parameters instead would give {} with a slowest stage of {:.3f} ms "
          "(against {:.3f} ms)",
          absl::StrJoin(*by_params, ","),
          *std::max_element(other.stage_us.begin(), other.stage_us.end()) / 1000,
          slowest_us / 1000);
    }
  }
  return out;
}

absl::StatusOr<MeasuredPartition> ProposeMeasuredPartition(const MeasuredPartitionOptions& o) {
  RS_ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(o.model_dir));
  ProbeDir dir;
  RS_RETURN_IF_ERROR(dir.Make());
  const std::filesystem::path out_path = dir.path() / "profile.out";
  const std::filesystem::path err_path = dir.path() / "probe.log";
  SubprocessOptions spawn;
  spawn.argv = {
      o.stage_binary,
      "--probe_layers",
      o.model_dir,
      "--probe_device",
      o.device,
      "--probe_rows",
      std::to_string(o.probe_rows),
      "--probe_context",
      std::to_string(std::min(o.probe_context, std::max(1, config.max_position_embeddings))),
      "--probe_out",
      out_path.string()};
  spawn.stdout_path = err_path.string();  // the probe's logs
  spawn.stderr_path = err_path.string();
  RS_ASSIGN_OR_RETURN(Subprocess probe, Subprocess::Spawn(spawn));
  absl::StatusOr<int> code = probe.Wait(o.timeout);
  if (!code.ok()) probe.Terminate(absl::Seconds(1));
  const std::string text = ReadFile(out_path);
  const std::string errors = ReadFile(err_path);
  if (!code.ok()) {
    return absl::DeadlineExceededError(
        fmt::format("the layer probe ({} --probe_layers) did not finish within {}", o.stage_binary,
                    absl::FormatDuration(o.timeout)));
  }
  if (*code != 0) {
    return absl::FailedPreconditionError(
        fmt::format("the layer probe exited with {}: {}", *code, LastLine(errors)));
  }
  RS_ASSIGN_OR_RETURN(LayerCostProfile profile, ParseLayerCostProfile(text));
  std::vector<int64_t> params;
  for (int layer = 0; layer < config.num_layers; ++layer) {
    params.push_back(LayerParameterCount(config, layer));
  }
  return ProposeFromProfile(profile, config.num_layers, config.max_position_embeddings, params, o);
}

}  // namespace ringserve
