#include "coordinator/hosts/ring_config.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <map>
#include <set>

#include "common/bounded_file.h"
#include "common/status_macros.h"
#include "fmt/format.h"
#include "yaml-cpp/yaml.h"

namespace ringserve {
namespace {

std::string Trim(std::string_view text) {
  size_t begin = 0;
  size_t end = text.size();
  while (begin < end && std::isspace(static_cast<unsigned char>(text[begin]))) ++begin;
  while (end > begin && std::isspace(static_cast<unsigned char>(text[end - 1]))) --end;
  return std::string(text.substr(begin, end - begin));
}

// Parses a whole string as a decimal int64; nullopt for anything else (signs allowed).
std::optional<int64_t> ParseInt(std::string_view text) {
  std::string trimmed = Trim(text);
  if (trimmed.empty()) return std::nullopt;
  int64_t value = 0;
  const char* begin = trimmed.data();
  if (*begin == '+') ++begin;
  const char* end = trimmed.data() + trimmed.size();
  auto [ptr, ec] = std::from_chars(begin, end, value);
  if (ec != std::errc() || ptr != end) return std::nullopt;
  return value;
}

// Canonical host for comparisons: "localhost" and "127.0.0.1" are the same machine.
std::string CanonicalHost(const std::string& host) {
  if (host == "localhost" || host == "127.0.0.1" || host == "::1") return "127.0.0.1";
  return host;
}

// Errors while parsing carry the source and the field path.
class Parser {
 public:
  explicit Parser(std::string source) : source_(std::move(source)) {}

  absl::Status Error(const std::string& field, const std::string& what) const {
    return absl::InvalidArgumentError(fmt::format("{}: {}: {}", source_, field, what));
  }

  // The node's scalar text, or an error naming the field when it is not a scalar.
  absl::StatusOr<std::string> Scalar(const YAML::Node& node, const std::string& field) const {
    if (!node.IsScalar()) return Error(field, "expected a scalar value");
    return node.Scalar();
  }

  absl::StatusOr<int64_t> Int(const YAML::Node& node, const std::string& field) const {
    RS_ASSIGN_OR_RETURN(std::string text, Scalar(node, field));
    std::optional<int64_t> value = ParseInt(text);
    if (!value) return Error(field, fmt::format("expected an integer, got '{}'", text));
    return *value;
  }

  absl::StatusOr<int> IntInRange(const YAML::Node& node, const std::string& field, int64_t low,
                                 int64_t high) const {
    RS_ASSIGN_OR_RETURN(int64_t value, Int(node, field));
    if (value < low || value > high) {
      return Error(field, fmt::format("{} is out of range [{}, {}]", value, low, high));
    }
    return static_cast<int>(value);
  }

  absl::Status CheckKeys(const YAML::Node& map, const std::string& field,
                         const std::set<std::string>& known) const {
    if (!map.IsMap()) return Error(field.empty() ? "(top level)" : field, "expected a mapping");
    for (const auto& item : map) {
      std::string key = item.first.IsScalar() ? item.first.Scalar() : "<non-scalar key>";
      if (!known.count(key)) {
        std::string list;
        for (const auto& name : known) list += (list.empty() ? "" : ", ") + name;
        return Error(field.empty() ? key : field + "." + key,
                     fmt::format("unknown key (known: {})", list));
      }
    }
    return absl::OkStatus();
  }

  const std::string& source() const { return source_; }

 private:
  std::string source_;
};

absl::StatusOr<int64_t> ParseBytes(const Parser& parser, const YAML::Node& node,
                                   const std::string& field) {
  RS_ASSIGN_OR_RETURN(std::string text, parser.Scalar(node, field));
  std::string trimmed = Trim(text);
  size_t digits = 0;
  while (digits < trimmed.size() && std::isdigit(static_cast<unsigned char>(trimmed[digits]))) {
    ++digits;
  }
  std::optional<int64_t> number = ParseInt(trimmed.substr(0, digits));
  std::string unit = Trim(trimmed.substr(digits));
  static const std::map<std::string, int64_t> kUnits = {{"", 1},
                                                        {"B", 1},
                                                        {"KB", 1000},
                                                        {"KiB", int64_t{1} << 10},
                                                        {"MB", 1000 * 1000},
                                                        {"MiB", int64_t{1} << 20},
                                                        {"GB", int64_t{1000} * 1000 * 1000},
                                                        {"GiB", int64_t{1} << 30},
                                                        {"TB", int64_t{1000} * 1000 * 1000 * 1000},
                                                        {"TiB", int64_t{1} << 40}};
  auto unit_it = kUnits.find(unit);
  if (!number || *number <= 0 || unit_it == kUnits.end()) {
    return parser.Error(field,
                        fmt::format("expected a positive size such as 8GiB, got '{}'", text));
  }
  if (*number > (int64_t{1} << 62) / unit_it->second) return parser.Error(field, "size too large");
  return *number * unit_it->second;
}

// "host:port" with a port in 1..65535 (0 allowed when `allow_zero`, meaning "any").
absl::Status CheckListenAddress(const Parser& parser, const std::string& field,
                                const std::string& address, bool allow_zero) {
  size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    return parser.Error(field, fmt::format("expected host:port, got '{}'", address));
  }
  std::optional<int64_t> port = ParseInt(address.substr(colon + 1));
  if (!port || *port < (allow_zero ? 0 : 1) || *port > 65535) {
    return parser.Error(field, fmt::format("bad port in '{}' (1..65535)", address));
  }
  return absl::OkStatus();
}

struct RawStage {
  StageConfig stage;
  enum class LayerSpec { kNone, kCount, kRange } spec = LayerSpec::kNone;
  int count = 0;
};

absl::StatusOr<RawStage> ParseStage(const Parser& parser, const YAML::Node& node, int index) {
  const std::string field = fmt::format("stages[{}]", index);
  RS_RETURN_IF_ERROR(
      parser.CheckKeys(node, field, {"host", "port", "device", "layers", "kv_cache_dtype"}));
  RawStage raw;
  if (!node["host"]) return parser.Error(field + ".host", "missing");
  RS_ASSIGN_OR_RETURN(raw.stage.host, parser.Scalar(node["host"], field + ".host"));
  if (Trim(raw.stage.host).empty() || raw.stage.host.find_first_of(" \t:/") != std::string::npos) {
    return parser.Error(field + ".host", fmt::format("bad host '{}'", raw.stage.host));
  }
  if (!node["port"]) return parser.Error(field + ".port", "missing");
  RS_ASSIGN_OR_RETURN(raw.stage.control_port,
                      parser.IntInRange(node["port"], field + ".port", 1, 65535));
  if (node["device"]) {
    RS_ASSIGN_OR_RETURN(std::string device_text, parser.Scalar(node["device"], field + ".device"));
    auto device = ParseDevice(device_text);
    if (!device.ok()) {
      return parser.Error(field + ".device",
                          fmt::format("unknown device '{}' (cpu or cuda:N)", device_text));
    }
    raw.stage.device = *device;
  }
  if (node["kv_cache_dtype"]) {
    const std::string dtype_field = field + ".kv_cache_dtype";
    RS_ASSIGN_OR_RETURN(std::string dtype_text, parser.Scalar(node["kv_cache_dtype"], dtype_field));
    auto dtype = ParseKvCacheDtype(dtype_text, dtype_field);
    if (!dtype.ok())
      return parser.Error(dtype_field, "expected auto or fp8_e4m3, got '" + dtype_text + "'");
    raw.stage.kv_cache_dtype = *dtype;
  }
  if (const YAML::Node layers = node["layers"]) {
    const std::string lfield = field + ".layers";
    if (layers.IsSequence()) {
      if (layers.size() != 2) return parser.Error(lfield, "a range is [first, last) : two numbers");
      RS_ASSIGN_OR_RETURN(int64_t first, parser.Int(layers[0], lfield + "[0]"));
      RS_ASSIGN_OR_RETURN(int64_t last, parser.Int(layers[1], lfield + "[1]"));
      if (first < 0 || last <= first || last > (1 << 20)) {
        return parser.Error(lfield,
                            fmt::format("bad range [{}, {}): need 0 <= first < last", first, last));
      }
      raw.spec = RawStage::LayerSpec::kRange;
      raw.stage.first_layer = static_cast<int>(first);
      raw.stage.last_layer = static_cast<int>(last);
    } else if (layers.IsScalar()) {
      std::string text = Trim(layers.Scalar());
      size_t dash = text.find('-', 1);
      if (dash != std::string::npos) {
        std::optional<int64_t> first = ParseInt(text.substr(0, dash));
        std::optional<int64_t> last = ParseInt(text.substr(dash + 1));
        if (!first || !last || *first < 0 || *last <= *first || *last > (1 << 20)) {
          return parser.Error(
              lfield, fmt::format("bad range '{}': need \"a-b\" with 0 <= a < b ([a, b))", text));
        }
        raw.spec = RawStage::LayerSpec::kRange;
        raw.stage.first_layer = static_cast<int>(*first);
        raw.stage.last_layer = static_cast<int>(*last);
      } else {
        std::optional<int64_t> count = ParseInt(text);
        if (!count || *count < 1 || *count > (1 << 20)) {
          return parser.Error(lfield, fmt::format("expected a layer count >= 1, a range [a, b) or "
                                                  "\"a-b\", got '{}'",
                                                  text));
        }
        raw.spec = RawStage::LayerSpec::kCount;
        raw.count = static_cast<int>(*count);
      }
    } else {
      return parser.Error(lfield, "expected a count, [a, b) or \"a-b\"");
    }
  }
  return raw;
}

// Checks the layer assignment: in ring order, contiguous, every layer exactly once.
absl::Status CheckLayers(const Parser& parser, const std::vector<StageConfig>& stages,
                         int num_layers) {
  int expected_first = 0;
  for (size_t i = 0; i < stages.size(); ++i) {
    const StageConfig& stage = stages[i];
    const std::string field = fmt::format("stages[{}].layers", i);
    if (stage.last_layer <= stage.first_layer) {
      return parser.Error(
          field, fmt::format("empty layer range [{}, {})", stage.first_layer, stage.last_layer));
    }
    if (stage.first_layer < expected_first) {
      return parser.Error(
          field, fmt::format("layers [{}, {}) overlap the previous stages, which end at layer {}",
                             stage.first_layer, stage.last_layer, expected_first));
    }
    if (stage.first_layer > expected_first) {
      return parser.Error(field, fmt::format("layers [{}, {}) are missing: no stage has them (this "
                                             "stage starts at {})",
                                             expected_first, stage.first_layer, stage.first_layer));
    }
    if (stage.last_layer > num_layers) {
      return parser.Error(field, fmt::format("layers [{}, {}) go past the model's {} layers",
                                             stage.first_layer, stage.last_layer, num_layers));
    }
    expected_first = stage.last_layer;
  }
  if (expected_first != num_layers) {
    return parser.Error("stages",
                        fmt::format("layers sum to {} but the model has {} (layers "
                                    "[{}, {}) are missing)",
                                    expected_first, num_layers, expected_first, num_layers));
  }
  return absl::OkStatus();
}

absl::Status CheckStagesAndChannel(const Parser& parser, const RingConfig& config) {
  if (config.stages.empty()) return parser.Error("stages", "at least one stage is needed");
  std::map<std::string, size_t> endpoints;
  for (size_t i = 0; i < config.stages.size(); ++i) {
    const StageConfig& stage = config.stages[i];
    const std::string field = fmt::format("stages[{}]", i);
    if (stage.host.empty()) return parser.Error(field + ".host", "missing");
    if (stage.control_port < 1 || stage.control_port > 65535) {
      return parser.Error(field + ".port",
                          fmt::format("{} is out of range [1, 65535]", stage.control_port));
    }
    if (stage.device.index < 0) return parser.Error(field + ".device", "negative CUDA ordinal");
    std::string key = fmt::format("{}:{}", CanonicalHost(stage.host), stage.control_port);
    auto [it, inserted] = endpoints.emplace(key, i);
    if (!inserted) {
      return parser.Error(field, fmt::format("duplicate endpoint {}: stages[{}] has it too",
                                             stage.endpoint(), it->second));
    }
  }
  if (config.channel == ChannelKind::kTcp) return absl::OkStatus();
  const std::string name(ChannelKindName(config.channel));
  std::map<std::string, size_t> gpus;
  for (size_t i = 0; i < config.stages.size(); ++i) {
    const StageConfig& stage = config.stages[i];
    if (!stage.device.is_cuda()) {
      return parser.Error(
          fmt::format("stages[{}].device", i),
          fmt::format("channel {} needs cuda devices, got {}", name, stage.device.ToString()));
    }
    if (config.channel == ChannelKind::kCudaIpc &&
        CanonicalHost(stage.host) != CanonicalHost(config.stages[0].host)) {
      return parser.Error(fmt::format("stages[{}].host", i),
                          fmt::format("channel cuda_ipc needs all stages on one host, but "
                                      "stages[0] is on {} and this one on {}",
                                      config.stages[0].host, stage.host));
    }
    if (config.channel == ChannelKind::kNccl) {
      std::string key = fmt::format("{}/{}", CanonicalHost(stage.host), stage.device.index);
      auto [it, inserted] = gpus.emplace(key, i);
      if (!inserted) {
        return parser.Error(fmt::format("stages[{}].device", i),
                            fmt::format("channel nccl needs one GPU per stage, but stages[{}] "
                                        "also uses {} on {} (use cuda_ipc or tcp to share a GPU)",
                                        it->second, stage.device.ToString(), stage.host));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateWith(const Parser& parser, const RingConfig& config) {
  if (config.model_dir.empty()) return parser.Error("model", "missing");
  if (config.num_layers < 1) {
    return parser.Error("model", fmt::format("the model has {} layers", config.num_layers));
  }
  RS_RETURN_IF_ERROR(CheckListenAddress(parser, "api.grpc", config.grpc_listen, true));
  if (!config.http_listen.empty()) {
    RS_RETURN_IF_ERROR(CheckListenAddress(parser, "api.http", config.http_listen, true));
  }
  const SchedulerKnobs& knobs = config.scheduler;
  if (knobs.max_tokens_per_micro_batch < 1) {
    return parser.Error("scheduler.max_tokens_per_micro_batch", "must be >= 1");
  }
  if (knobs.micro_batches_in_flight < 0) {
    return parser.Error("scheduler.micro_batches_in_flight", "must be >= 0 (0 = stages)");
  }
  if (knobs.kv_block_size < 1) return parser.Error("scheduler.kv_block_size", "must be >= 1");
  if (knobs.kv_blocks < 0) return parser.Error("scheduler.kv_blocks", "must be >= 0");
  if (knobs.kv_budget_bytes < 0) return parser.Error("scheduler.kv_budget", "must be >= 0");
  if (knobs.kv_blocks > 0 && knobs.kv_budget_bytes > 0) {
    return parser.Error("scheduler", "kv_blocks and kv_budget are exclusive: give one");
  }
  RS_RETURN_IF_ERROR(CheckStagesAndChannel(parser, config));
  return CheckLayers(parser, config.stages, config.num_layers);
}

absl::StatusOr<RingConfig> ParseNode(const Parser& parser, const YAML::Node& root,
                                     const LayerCountFn& layer_count) {
  if (!root || root.IsNull()) return parser.Error("(file)", "empty");
  RS_RETURN_IF_ERROR(parser.CheckKeys(
      root, "", {"model", "channel", "api", "scheduler", "partition", "stages", "ring_secret"}));
  RingConfig config;
  config.source = parser.source();
  if (!root["model"]) return parser.Error("model", "missing (the model directory)");
  RS_ASSIGN_OR_RETURN(config.model_dir, parser.Scalar(root["model"], "model"));
  if (Trim(config.model_dir).empty()) return parser.Error("model", "empty");
  if (root["channel"]) {
    RS_ASSIGN_OR_RETURN(std::string channel, parser.Scalar(root["channel"], "channel"));
    std::optional<ChannelKind> kind = ParseChannelKind(Trim(channel));
    if (!kind) {
      return parser.Error("channel",
                          fmt::format("unknown channel '{}' (tcp, cuda_ipc or nccl)", channel));
    }
    config.channel = *kind;
  }
  if (root["ring_secret"]) {
    RS_ASSIGN_OR_RETURN(config.ring_secret_file, parser.Scalar(root["ring_secret"], "ring_secret"));
    if (Trim(config.ring_secret_file).empty()) return parser.Error("ring_secret", "empty");
  }
  if (const YAML::Node api = root["api"]) {
    RS_RETURN_IF_ERROR(parser.CheckKeys(api, "api", {"grpc", "http"}));
    if (api["grpc"]) {
      RS_ASSIGN_OR_RETURN(config.grpc_listen, parser.Scalar(api["grpc"], "api.grpc"));
    }
    if (api["http"]) {
      RS_ASSIGN_OR_RETURN(config.http_listen, parser.Scalar(api["http"], "api.http"));
    }
  }
  if (const YAML::Node knobs = root["scheduler"]) {
    RS_RETURN_IF_ERROR(parser.CheckKeys(knobs, "scheduler",
                                        {"max_tokens_per_micro_batch", "micro_batches_in_flight",
                                         "kv_block_size", "kv_blocks", "kv_budget"}));
    SchedulerKnobs& out = config.scheduler;
    constexpr int64_t kMaxInt = 1 << 30;
    if (knobs["max_tokens_per_micro_batch"]) {
      RS_ASSIGN_OR_RETURN(out.max_tokens_per_micro_batch,
                          parser.IntInRange(knobs["max_tokens_per_micro_batch"],
                                            "scheduler.max_tokens_per_micro_batch", 1, kMaxInt));
    }
    if (knobs["micro_batches_in_flight"]) {
      RS_ASSIGN_OR_RETURN(out.micro_batches_in_flight,
                          parser.IntInRange(knobs["micro_batches_in_flight"],
                                            "scheduler.micro_batches_in_flight", 0, 4096));
    }
    if (knobs["kv_block_size"]) {
      RS_ASSIGN_OR_RETURN(out.kv_block_size, parser.IntInRange(knobs["kv_block_size"],
                                                               "scheduler.kv_block_size", 1, 4096));
    }
    if (knobs["kv_blocks"]) {
      RS_ASSIGN_OR_RETURN(out.kv_blocks,
                          parser.IntInRange(knobs["kv_blocks"], "scheduler.kv_blocks", 1, kMaxInt));
    }
    if (knobs["kv_budget"]) {
      RS_ASSIGN_OR_RETURN(out.kv_budget_bytes,
                          ParseBytes(parser, knobs["kv_budget"], "scheduler.kv_budget"));
    }
  }

  const YAML::Node stages = root["stages"];
  if (!stages) return parser.Error("stages", "missing (a list of stages)");
  if (!stages.IsSequence()) return parser.Error("stages", "expected a list of stages");
  if (stages.size() == 0) return parser.Error("stages", "at least one stage is needed");
  std::vector<RawStage> raw;
  for (size_t i = 0; i < stages.size(); ++i) {
    RS_ASSIGN_OR_RETURN(RawStage stage, ParseStage(parser, stages[i], static_cast<int>(i)));
    raw.push_back(std::move(stage));
  }

  absl::StatusOr<int> num_layers = layer_count(config.model_dir);
  if (!num_layers.ok()) {
    return absl::Status(
        num_layers.status().code(),
        fmt::format("{}: model: cannot read the layer count of '{}': {}", parser.source(),
                    config.model_dir, std::string(num_layers.status().message())));
  }
  config.num_layers = *num_layers;
  if (config.num_layers < 1) {
    return parser.Error("model", fmt::format("the model has {} layers", config.num_layers));
  }

  bool any_layers = false;
  for (const RawStage& stage : raw) any_layers |= stage.spec != RawStage::LayerSpec::kNone;
  std::vector<int> counts;
  if (const YAML::Node partition = root["partition"]) {
    if (any_layers) {
      return parser.Error("partition", "give either partition or per-stage layers, not both");
    }
    if (partition.IsSequence()) {
      for (size_t i = 0; i < partition.size(); ++i) {
        RS_ASSIGN_OR_RETURN(
            int count,
            parser.IntInRange(partition[i], fmt::format("partition[{}]", i), 1, 1 << 20));
        counts.push_back(count);
      }
    } else {
      RS_ASSIGN_OR_RETURN(std::string text, parser.Scalar(partition, "partition"));
      absl::StatusOr<std::vector<int>> parsed = ParsePartition(text);
      if (!parsed.ok()) return parser.Error("partition", std::string(parsed.status().message()));
      counts = *std::move(parsed);
    }
    if (counts.size() != raw.size()) {
      return parser.Error("partition", fmt::format("has {} entries but there are {} stages",
                                                   counts.size(), raw.size()));
    }
    int64_t sum = 0;
    for (int count : counts) sum += count;
    if (sum != config.num_layers) {
      return parser.Error("partition", fmt::format("sums to {} layers but the model has {}", sum,
                                                   config.num_layers));
    }
  } else if (!any_layers) {
    if (static_cast<int>(raw.size()) > config.num_layers) {
      return parser.Error("stages", fmt::format("{} stages for a model of {} layers: every stage "
                                                "needs at least one layer",
                                                raw.size(), config.num_layers));
    }
    RS_ASSIGN_OR_RETURN(counts, EvenPartition(config.num_layers, static_cast<int>(raw.size())));
  } else {
    for (size_t i = 0; i < raw.size(); ++i) {
      if (raw[i].spec == RawStage::LayerSpec::kNone) {
        return parser.Error(fmt::format("stages[{}].layers", i),
                            "missing (the other stages give layers; give them for every stage "
                            "or use partition)");
      }
    }
  }

  int next_first = 0;
  for (size_t i = 0; i < raw.size(); ++i) {
    StageConfig stage = raw[i].stage;
    if (!counts.empty()) {
      stage.first_layer = next_first;
      stage.last_layer = next_first + counts[i];
    } else if (raw[i].spec == RawStage::LayerSpec::kCount) {
      stage.first_layer = next_first;
      stage.last_layer = next_first + raw[i].count;
    }
    next_first = stage.last_layer;
    config.stages.push_back(std::move(stage));
  }
  RS_RETURN_IF_ERROR(ValidateWith(parser, config));
  return config;
}

}  // namespace

std::string StageConfig::endpoint() const { return fmt::format("{}:{}", host, control_port); }

int RingConfig::num_parallel_stages() const {
  std::set<std::pair<std::string, int>> gpus;
  int others = 0;
  for (const StageConfig& stage : stages) {
    if (stage.device.is_cuda()) {
      gpus.insert({stage.host == "localhost" ? "127.0.0.1" : stage.host, stage.device.index});
    } else {
      ++others;
    }
  }
  return static_cast<int>(gpus.size()) + others;
}

int RingConfig::effective_micro_batches_in_flight() const {
  return scheduler.micro_batches_in_flight > 0 ? scheduler.micro_batches_in_flight
                                               : std::max(1, num_parallel_stages());
}

absl::StatusOr<RingConfig> ParseRingConfig(std::string_view yaml_text, const std::string& source,
                                           const LayerCountFn& layer_count) {
  Parser parser(source);
  YAML::Node root;
  try {
    root = YAML::Load(std::string(yaml_text));
  } catch (const YAML::Exception& e) {
    return parser.Error(fmt::format("line {}", e.mark.line + 1),
                        fmt::format("malformed YAML: {}", e.msg));
  }
  try {
    return ParseNode(parser, root, layer_count);
  } catch (const YAML::Exception& e) {
    return parser.Error(fmt::format("line {}", e.mark.line + 1),
                        fmt::format("unexpected YAML structure: {}", e.msg));
  }
}

absl::StatusOr<RingConfig> ParseRingConfig(std::string_view yaml_text, const std::string& source,
                                           int num_layers) {
  return ParseRingConfig(
      yaml_text, source,
      [num_layers](const std::string&) -> absl::StatusOr<int> { return num_layers; });
}

absl::StatusOr<RingConfig> LoadRingConfig(const std::string& path,
                                          const LayerCountFn& layer_count) {
  RS_ASSIGN_OR_RETURN(const std::string text, ReadBoundedFile(path, kMaxHostsFileBytes));
  return ParseRingConfig(text, path, layer_count);
}

absl::Status ValidateRingConfig(const RingConfig& config) {
  return ValidateWith(Parser(config.source.empty() ? "ring config" : config.source), config);
}

absl::StatusOr<std::vector<int>> EvenPartition(int num_layers, int num_stages) {
  if (num_stages < 1 || num_stages > num_layers) {
    return absl::InvalidArgumentError(
        fmt::format("cannot split {} layers over {} stages (need 1 <= stages <= layers)",
                    num_layers, num_stages));
  }
  std::vector<int> counts(num_stages, num_layers / num_stages);
  for (int i = 0; i < num_layers % num_stages; ++i) ++counts[i];
  return counts;
}

absl::StatusOr<std::vector<int>> ParsePartition(std::string_view text) {
  std::string trimmed = Trim(text);
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(
        fmt::format("bad partition '{}': {} (expected counts such as 14,14,12 or LxN such as 5x8 = "
                    "8 stages of 5 layers)",
                    trimmed, why));
  };
  if (trimmed.empty()) return bad("empty");
  std::vector<int> counts;
  size_t x = trimmed.find_first_of("xX");
  if (x != std::string::npos) {
    std::optional<int64_t> layers = ParseInt(trimmed.substr(0, x));
    std::optional<int64_t> stages = ParseInt(trimmed.substr(x + 1));
    if (!stages || !layers) return bad("not LxN");
    if (*stages < 1 || *stages > 4096 || *layers < 1 || *layers > (1 << 20)) {
      return bad("counts must be >= 1");
    }
    counts.assign(static_cast<size_t>(*stages), static_cast<int>(*layers));
    return counts;
  }
  size_t begin = 0;
  while (begin <= trimmed.size()) {
    size_t comma = trimmed.find(',', begin);
    if (comma == std::string::npos) comma = trimmed.size();
    std::optional<int64_t> count = ParseInt(trimmed.substr(begin, comma - begin));
    if (!count) return bad(fmt::format("entry {} is not a number", counts.size()));
    if (*count < 1 || *count > (1 << 20)) {
      return bad(fmt::format("entry {} is {}; counts must be >= 1", counts.size(), *count));
    }
    counts.push_back(static_cast<int>(*count));
    begin = comma + 1;
  }
  return counts;
}

absl::StatusOr<int> PickFreeLocalPort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return absl::InternalError(fmt::format("socket: {}", std::strerror(errno)));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  socklen_t length = sizeof(address);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    int error = errno;
    ::close(fd);
    return absl::InternalError(fmt::format("picking a free port: {}", std::strerror(error)));
  }
  ::close(fd);
  return static_cast<int>(ntohs(address.sin_port));
}

absl::StatusOr<RingConfig> DefaultRingConfig(const DefaultRingOptions& options) {
  if (options.num_layers < 1) {
    return absl::InvalidArgumentError(
        fmt::format("default ring: the model has {} layers", options.num_layers));
  }
  std::vector<int> counts = options.partition;
  if (counts.empty()) {
    const int num_stages = std::clamp(options.num_stages, 1, options.num_layers);
    RS_ASSIGN_OR_RETURN(counts, EvenPartition(options.num_layers, num_stages));
  }
  const int num_stages = static_cast<int>(counts.size());
  RingConfig config;
  config.source = "<embedded default>";
  config.model_dir = options.model_dir;
  config.channel = options.channel;
  if (options.max_tokens_per_micro_batch > 0) {
    config.scheduler.max_tokens_per_micro_batch = options.max_tokens_per_micro_batch;
  }
  config.scheduler.micro_batches_in_flight = options.micro_batches_in_flight;
  config.grpc_listen = options.grpc_listen;
  config.http_listen = options.http_listen;
  config.num_layers = options.num_layers;
  std::set<int> ports;
  int first = 0;
  for (int i = 0; i < num_stages; ++i) {
    StageConfig stage;
    stage.host = "127.0.0.1";
    stage.device = options.device;
    stage.kv_cache_dtype = options.kv_cache_dtype;
    // The kernel rarely repeats a port it just handed out, but make the ports distinct anyway.
    for (int attempt = 0;
         attempt < 16 && (stage.control_port == 0 || ports.count(stage.control_port)); ++attempt) {
      RS_ASSIGN_OR_RETURN(stage.control_port, PickFreeLocalPort());
    }
    if (ports.count(stage.control_port)) {
      return absl::InternalError("default ring: could not find distinct free ports");
    }
    ports.insert(stage.control_port);
    stage.first_layer = first;
    stage.last_layer = first + counts[i];
    first = stage.last_layer;
    config.stages.push_back(std::move(stage));
  }
  RS_RETURN_IF_ERROR(ValidateRingConfig(config));
  return config;
}

}  // namespace ringserve
