#include "stage/model/quant/quant_config.h"

#include <algorithm>
#include <cctype>
#include <memory>
#include <mutex>
#include <regex>
#include <sstream>
#include <unordered_map>

#include "absl/status/status.h"
#include "common/bounded_file.h"
#include "common/status_macros.h"
#include "fmt/format.h"

namespace ringserve::quant {
namespace {

using Json = nlohmann::json;
using Storage = CompressedScheme::Storage;
using Strategy = CompressedScheme::Strategy;

// Errors name the file and the key path: "config.json: quantization_config.bits: ...".
class Parser {
 public:
  explicit Parser(std::string source) : source_(std::move(source)) {}

  absl::Status Error(const std::string& key, const std::string& what) const {
    return absl::InvalidArgumentError(
        fmt::format("{}: quantization_config.{}: {}", source_, key, what));
  }

  // An optional string; `fallback` when absent or null.
  absl::StatusOr<std::string> String(const Json& obj, const std::string& key,
                                     const std::string& path, const std::string& fallback) const {
    auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) return fallback;
    if (!it->is_string()) return Error(path + key, fmt::format("{} is not a string", it->dump()));
    return it->get<std::string>();
  }

  absl::StatusOr<bool> Bool(const Json& obj, const std::string& key, const std::string& path,
                            bool fallback) const {
    auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) return fallback;
    if (!it->is_boolean()) return Error(path + key, fmt::format("{} is not a boolean", it->dump()));
    return it->get<bool>();
  }

  absl::StatusOr<int64_t> Int(const Json& obj, const std::string& key, const std::string& path,
                              int64_t fallback) const {
    auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) return fallback;
    if (!it->is_number_integer()) {
      return Error(path + key, fmt::format("{} is not an integer", it->dump()));
    }
    return it->get<int64_t>();
  }

  // A list of strings; empty when absent or null.
  absl::StatusOr<std::vector<std::string>> Strings(const Json& obj, const std::string& key,
                                                   const std::string& path) const {
    std::vector<std::string> out;
    auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) return out;
    if (!it->is_array()) return Error(path + key, fmt::format("{} is not a list", it->dump()));
    for (const Json& item : *it) {
      if (item.is_string()) {
        out.push_back(item.get<std::string>());
      } else if (item.is_array()) {  // gptq's modules_in_block_to_quantize is a list of lists
        for (const Json& inner : item) {
          if (!inner.is_string()) {
            return Error(path + key, fmt::format("{} is not a string", inner.dump()));
          }
          out.push_back(inner.get<std::string>());
        }
      } else {
        return Error(path + key, fmt::format("{} is not a string", item.dump()));
      }
    }
    return out;
  }

  absl::Status CheckRegexes(const std::vector<std::string>& patterns,
                            const std::string& key) const {
    for (const std::string& p : patterns) {
      if (p.rfind("re:", 0) != 0) continue;
      try {
        std::regex re(p.substr(3));
      } catch (const std::regex_error& e) {
        return Error(key, fmt::format("\"{}\" is not a valid regular expression: {}", p, e.what()));
      }
    }
    return absl::OkStatus();
  }

 private:
  std::string source_;
};

std::string Lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

absl::Status ParseFp8(const Parser& p, const Json& q, QuantConfig& config) {
  RS_ASSIGN_OR_RETURN(std::string fmt_name, p.String(q, "fmt", "", "e4m3"));
  if (fmt_name != "e4m3")
    return p.Error("fmt", fmt::format("\"{}\" is not supported (e4m3)", fmt_name));
  RS_ASSIGN_OR_RETURN(std::string activation, p.String(q, "activation_scheme", "", "dynamic"));
  if (activation != "dynamic" && activation != "static") {
    return p.Error("activation_scheme",
                   fmt::format("\"{}\" is not supported (dynamic, static)", activation));
  }
  config.block_rows = config.block_cols = 128;  // FineGrainedFP8Config's default
  auto block = q.find("weight_block_size");
  if (block != q.end()) {
    if (!block->is_array() || block->size() != 2 || !(*block)[0].is_number_integer() ||
        !(*block)[1].is_number_integer() || (*block)[0].get<int64_t>() <= 0 ||
        (*block)[1].get<int64_t>() <= 0) {
      return p.Error("weight_block_size",
                     fmt::format("{} is not two positive integers (per-tensor FP8 is not "
                                 "supported)",
                                 block->dump()));
    }
    config.block_rows = (*block)[0].get<int64_t>();
    config.block_cols = (*block)[1].get<int64_t>();
  }
  RS_ASSIGN_OR_RETURN(std::string scale_fmt, p.String(q, "scale_fmt", "", "float"));
  if (scale_fmt != "float" && scale_fmt != "ue8m0") {
    return p.Error("scale_fmt", fmt::format("\"{}\" is not supported (ue8m0)", scale_fmt));
  }
  config.scale_ue8m0 = scale_fmt == "ue8m0";
  RS_ASSIGN_OR_RETURN(config.modules_to_not_convert, p.Strings(q, "modules_to_not_convert", ""));
  const auto skip_list = q.find("modules_to_not_convert");
  config.fp8_skip_list_given = skip_list != q.end() && !skip_list->is_null();
  // transformers 5 writes "modules_to_convert": null; a list would restrict the converted modules.
  RS_ASSIGN_OR_RETURN(std::vector<std::string> to_convert, p.Strings(q, "modules_to_convert", ""));
  if (!to_convert.empty()) return p.Error("modules_to_convert", "a list is not supported (null)");
  return absl::OkStatus();
}

absl::Status ParseGptq(const Parser& p, const Json& q, QuantConfig& config) {
  RS_ASSIGN_OR_RETURN(int64_t bits, p.Int(q, "bits", "", 4));
  if (bits != 2 && bits != 4 && bits != 8) {
    return p.Error("bits", fmt::format("{} is not supported (2, 4, 8)", bits));
  }
  config.bits = static_cast<int>(bits);
  RS_ASSIGN_OR_RETURN(int64_t group_size, p.Int(q, "group_size", "", 128));
  if (group_size == 0 || group_size < -1) {
    return p.Error("group_size", fmt::format("{} is not -1 or positive", group_size));
  }
  config.group_size = static_cast<int>(group_size);
  RS_ASSIGN_OR_RETURN(config.desc_act, p.Bool(q, "desc_act", "", false));
  RS_ASSIGN_OR_RETURN(config.symmetric, p.Bool(q, "sym", "", true));
  RS_ASSIGN_OR_RETURN(config.gptq_lm_head, p.Bool(q, "lm_head", "", false));
  for (const char* key : {"checkpoint_format", "format"}) {
    RS_ASSIGN_OR_RETURN(std::string format, p.String(q, key, "", "gptq"));
    if (format == "gptq") {
      continue;
    } else if (format == "gptq_v2") {
      config.gptq_zero_offset = 0;
    } else {
      return p.Error(key, fmt::format("\"{}\" is not supported (gptq, gptq_v2)", format));
    }
  }
  RS_ASSIGN_OR_RETURN(std::string pack_dtype, p.String(q, "pack_dtype", "", "int32"));
  if (pack_dtype != "int32" && pack_dtype != "torch.int32") {
    return p.Error("pack_dtype", fmt::format("\"{}\" is not supported (int32)", pack_dtype));
  }
  RS_ASSIGN_OR_RETURN(config.gptq_block_modules, p.Strings(q, "modules_in_block_to_quantize", ""));
  return absl::OkStatus();
}

absl::Status ParseAwq(const Parser& p, const Json& q, QuantConfig& config) {
  RS_ASSIGN_OR_RETURN(int64_t bits, p.Int(q, "bits", "", 4));
  if (bits != 4) return p.Error("bits", fmt::format("{} is not supported (4)", bits));
  config.bits = 4;
  RS_ASSIGN_OR_RETURN(int64_t group_size, p.Int(q, "group_size", "", 128));
  if (group_size == 0 || group_size < -1) {
    return p.Error("group_size", fmt::format("{} is not -1 or positive", group_size));
  }
  config.group_size = static_cast<int>(group_size);
  RS_ASSIGN_OR_RETURN(bool zero_point, p.Bool(q, "zero_point", "", true));
  if (!zero_point) return p.Error("zero_point", "false is not supported (true)");
  RS_ASSIGN_OR_RETURN(std::string version, p.String(q, "version", "", "gemm"));
  if (Lower(version) != "gemm") {
    return p.Error("version", fmt::format("\"{}\" is not supported (gemm)", version));
  }
  // transformers 5 saves AutoAWQ's backend as "auto"; the storage is the same GEMM layout.
  RS_ASSIGN_OR_RETURN(std::string backend, p.String(q, "backend", "", "autoawq"));
  if (Lower(backend) != "autoawq" && Lower(backend) != "auto") {
    return p.Error("backend", fmt::format("\"{}\" is not supported (autoawq, auto)", backend));
  }
  RS_ASSIGN_OR_RETURN(config.modules_to_not_convert, p.Strings(q, "modules_to_not_convert", ""));
  return absl::OkStatus();
}

// Names compared with their digit runs as numbers: "group_2" < "group_10".
bool NaturalLess(const std::string& a, const std::string& b) {
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    const bool da = std::isdigit(static_cast<unsigned char>(a[i])) != 0;
    const bool db = std::isdigit(static_cast<unsigned char>(b[j])) != 0;
    if (da && db) {
      size_t ei = i, ej = j;
      while (ei < a.size() && std::isdigit(static_cast<unsigned char>(a[ei]))) ++ei;
      while (ej < b.size() && std::isdigit(static_cast<unsigned char>(b[ej]))) ++ej;
      const std::string_view na = std::string_view(a).substr(i, ei - i);
      const std::string_view nb = std::string_view(b).substr(j, ej - j);
      const std::string_view ta = na.substr(std::min(na.find_first_not_of('0'), na.size()));
      const std::string_view tb = nb.substr(std::min(nb.find_first_not_of('0'), nb.size()));
      if (ta.size() != tb.size()) return ta.size() < tb.size();
      if (ta != tb) return ta < tb;
      i = ei;
      j = ej;
    } else {
      if (a[i] != b[j]) return a[i] < b[j];
      ++i;
      ++j;
    }
  }
  return a.size() - i < b.size() - j;
}

absl::StatusOr<CompressedScheme> ParseCompressedGroup(const Parser& p, const std::string& name,
                                                      const Json& group,
                                                      const std::string& top_format) {
  const std::string path = "config_groups." + name + ".";
  if (!group.is_object()) return p.Error("config_groups." + name, "is not an object");
  CompressedScheme s;
  s.group_name = name;
  RS_ASSIGN_OR_RETURN(s.targets, p.Strings(group, "targets", path));
  RS_RETURN_IF_ERROR(p.CheckRegexes(s.targets, path + "targets"));
  auto output = group.find("output_activations");
  if (output != group.end() && !output->is_null()) {
    return p.Error(path + "output_activations", "output activation quantization is not supported");
  }
  RS_ASSIGN_OR_RETURN(std::string format, p.String(group, "format", path, top_format));
  auto weights = group.find("weights");
  if (weights == group.end() || weights->is_null() || format == "dense") {
    s.storage = Storage::kDense;
    return s;
  }
  const std::string wpath = path + "weights.";
  if (!weights->is_object()) return p.Error(path + "weights", "is not an object");
  RS_ASSIGN_OR_RETURN(int64_t bits, p.Int(*weights, "num_bits", wpath, 8));
  RS_ASSIGN_OR_RETURN(std::string type, p.String(*weights, "type", wpath, "int"));
  RS_ASSIGN_OR_RETURN(s.symmetric, p.Bool(*weights, "symmetric", wpath, true));
  RS_ASSIGN_OR_RETURN(bool dynamic, p.Bool(*weights, "dynamic", wpath, false));
  if (dynamic) return p.Error(wpath + "dynamic", "dynamic weight quantization is not supported");
  if (type != "int" && type != "float") {
    return p.Error(wpath + "type", fmt::format("\"{}\" is not supported (int, float)", type));
  }
  if (type == "int" && (bits < 1 || bits > 8)) {
    return p.Error(wpath + "num_bits", fmt::format("{} is not supported for int (1-8)", bits));
  }
  if (type == "float" && bits != 8) {
    return p.Error(wpath + "num_bits", fmt::format("{} is not supported for float (8)", bits));
  }
  s.num_bits = static_cast<int>(bits);
  if (format == "pack-quantized" && type == "int") {
    s.storage = Storage::kPacked;
  } else if ((format == "int-quantized" || format == "naive-quantized") && type == "int") {
    // Weights of any width up to 8 bits stored one int8 each.
    s.storage = Storage::kInt;
  } else if ((format == "float-quantized" || format == "naive-quantized") && type == "float") {
    s.storage = Storage::kFloat;
  } else {
    return p.Error(path + "format",
                   fmt::format("\"{}\" with {} {}-bit weights is not supported (pack-quantized, "
                               "int-quantized, float-quantized, naive-quantized, dense)",
                               format, type, bits));
  }
  RS_ASSIGN_OR_RETURN(std::string strategy, p.String(*weights, "strategy", wpath, "tensor"));
  if (strategy == "tensor") {
    s.strategy = Strategy::kTensor;
  } else if (strategy == "channel") {
    s.strategy = Strategy::kChannel;
  } else if (strategy == "group") {
    s.strategy = Strategy::kGroup;
    RS_ASSIGN_OR_RETURN(s.group_size, p.Int(*weights, "group_size", wpath, 0));
    if (s.group_size <= 0) {
      return p.Error(wpath + "group_size",
                     fmt::format("{} is not positive (strategy group)", s.group_size));
    }
  } else if (strategy == "block") {
    s.strategy = Strategy::kBlock;
    auto block = weights->find("block_structure");
    bool ok = false;
    if (block != weights->end() && block->is_array() && block->size() == 2 &&
        (*block)[0].is_number_integer() && (*block)[1].is_number_integer()) {
      s.block_rows = (*block)[0].get<int64_t>();
      s.block_cols = (*block)[1].get<int64_t>();
      ok = true;
    } else if (block != weights->end() && block->is_string()) {  // older files: "128x128"
      long long r = 0, c = 0;
      char x = 0;
      std::istringstream in(block->get<std::string>());
      ok = static_cast<bool>(in >> r >> x >> c) && x == 'x';
      s.block_rows = r;
      s.block_cols = c;
    }
    if (!ok || s.block_rows <= 0 || s.block_cols <= 0) {
      return p.Error(wpath + "block_structure",
                     fmt::format("{} is not two positive integers (strategy block)",
                                 block == weights->end() ? "absent" : block->dump()));
    }
  } else {
    return p.Error(
        wpath + "strategy",
        fmt::format("\"{}\" is not supported (tensor, channel, group, block)", strategy));
  }
  if (!s.symmetric && s.storage == Storage::kFloat) {
    return p.Error(wpath + "symmetric", "asymmetric float weights are not supported");
  }
  return s;
}

absl::Status ParseCompressed(const Parser& p, const Json& q, QuantConfig& config) {
  RS_ASSIGN_OR_RETURN(std::string status, p.String(q, "quantization_status", "", "compressed"));
  if (status != "compressed") {
    return p.Error("quantization_status",
                   fmt::format("\"{}\" is not supported (compressed)", status));
  }
  auto sparsity = q.find("sparsity_config");
  if (sparsity != q.end() && sparsity->is_object() && !sparsity->empty()) {
    auto format = sparsity->find("format");
    if (format == sparsity->end() || *format != "dense") {
      return p.Error("sparsity_config", "sparse checkpoints are not supported");
    }
  }
  // Rotations (QuIP, SpinQuant) the reference applies at run time; llm-compressor writes {}
  // when there are none.
  auto transforms = q.find("transform_config");
  if (transforms != q.end() && !transforms->is_null() &&
      !(transforms->is_object() && transforms->empty())) {
    return p.Error("transform_config", "weight and activation transforms are not supported");
  }
  RS_ASSIGN_OR_RETURN(std::string top_format, p.String(q, "format", "", "dense"));
  auto groups = q.find("config_groups");
  if (groups == q.end() || !groups->is_object() || groups->empty()) {
    return p.Error("config_groups", "missing or empty");
  }
  for (auto it = groups->begin(); it != groups->end(); ++it) {
    RS_ASSIGN_OR_RETURN(CompressedScheme scheme,
                        ParseCompressedGroup(p, it.key(), it.value(), top_format));
    config.schemes.push_back(std::move(scheme));
  }
  // The file's order ("group_2" before "group_10"; the parsed object sorts names as text).
  std::stable_sort(config.schemes.begin(), config.schemes.end(),
                   [](const CompressedScheme& a, const CompressedScheme& b) {
                     return NaturalLess(a.group_name, b.group_name);
                   });
  RS_ASSIGN_OR_RETURN(config.ignore, p.Strings(q, "ignore", ""));
  return p.CheckRegexes(config.ignore, "ignore");
}

// A pattern compiled once per process, or nullptr when it is not a valid expression. Every
// linear module of a model is tested on its own (tens of thousands in a DeepSeek file), and
// building a std::regex costs far more than matching one.
const std::regex* CompiledPattern(const std::string& pattern) {
  static std::mutex mu;
  static auto* cache = new std::unordered_map<std::string, std::unique_ptr<const std::regex>>;
  const std::lock_guard<std::mutex> lock(mu);
  auto [it, inserted] = cache->try_emplace(pattern);
  if (inserted) {
    try {
      it->second = std::make_unique<const std::regex>(pattern);
    } catch (const std::regex_error&) {
      it->second = nullptr;
    }
  }
  return it->second.get();
}

// Python's re.match: the expression matches a prefix of the name.
bool MatchesFromStart(const std::string& name, const std::regex& re) {
  return std::regex_search(name, re, std::regex_constants::match_continuous);
}

// compressed-tensors' match: "re:<regex>" matched from the start of the name (Python re.match),
// "Linear" (every linear module), or the exact name. Parsing checked that every "re:" compiles.
bool MatchesTarget(std::string_view module, const std::string& target) {
  if (target == "Linear") return true;
  if (target.rfind("re:", 0) == 0) {
    const std::regex* re = CompiledPattern(target.substr(3));
    return re != nullptr && MatchesFromStart(std::string(module), *re);
  }
  return module == target;
}

// AutoAWQ's modules_to_not_convert test: the key is a substring of the name, or of the name
// with every number replaced by "*".
bool MatchesNotConvert(std::string_view module, const std::vector<std::string>& keys) {
  std::string starred;
  for (size_t i = 0; i < module.size();) {
    if (std::isdigit(static_cast<unsigned char>(module[i]))) {
      starred += '*';
      while (i < module.size() && std::isdigit(static_cast<unsigned char>(module[i]))) ++i;
    } else {
      starred += module[i++];
    }
  }
  for (const std::string& key : keys) {
    if (module.find(key) != std::string_view::npos || starred.find(key) != std::string::npos) {
      return true;
    }
  }
  return false;
}

// transformers 5's test for fp8 and mxfp4 (should_convert_module): a key keeps a module
// unquantized when it matches the name from its start as a regular expression (Python's
// re.match: "model.layers.*.self_attn.o_proj" names every layer's), or the name ends with it. A
// key that is not a valid expression is compared as text.
bool MatchesSkipKey(std::string_view module, const std::vector<std::string>& keys) {
  const std::string name(module);
  for (const std::string& key : keys) {
    if (key.empty()) continue;
    if (name.ends_with(key)) return true;
    const std::regex* re = CompiledPattern(key);
    if (re != nullptr ? MatchesFromStart(name, *re) : name.starts_with(key)) return true;
  }
  return false;
}

}  // namespace

std::string_view QuantMethodName(QuantMethod method) {
  switch (method) {
    case QuantMethod::kNone:
      return "none";
    case QuantMethod::kFp8:
      return "fp8";
    case QuantMethod::kCompressedTensors:
      return "compressed-tensors";
    case QuantMethod::kGptq:
      return "gptq";
    case QuantMethod::kAwq:
      return "awq";
    case QuantMethod::kMxfp4:
      return "mxfp4";
  }
  return "?";
}

absl::StatusOr<QuantConfig> ParseQuantConfig(const Json& config_json, const std::string& source) {
  QuantConfig config;
  if (!config_json.is_object()) return config;
  auto q = config_json.find("quantization_config");
  if (q == config_json.end() || q->is_null()) return config;
  const Parser p(source);
  if (!q->is_object()) {
    return absl::InvalidArgumentError(
        fmt::format("{}: quantization_config is not an object", source));
  }
  RS_ASSIGN_OR_RETURN(std::string method, p.String(*q, "quant_method", "", ""));
  if (method == "fp8") {
    config.method = QuantMethod::kFp8;
    RS_RETURN_IF_ERROR(ParseFp8(p, *q, config));
  } else if (method == "compressed-tensors") {
    config.method = QuantMethod::kCompressedTensors;
    RS_RETURN_IF_ERROR(ParseCompressed(p, *q, config));
  } else if (method == "gptq") {
    config.method = QuantMethod::kGptq;
    RS_RETURN_IF_ERROR(ParseGptq(p, *q, config));
  } else if (method == "awq") {
    config.method = QuantMethod::kAwq;
    RS_RETURN_IF_ERROR(ParseAwq(p, *q, config));
  } else if (method == "mxfp4") {
    config.method = QuantMethod::kMxfp4;
    RS_ASSIGN_OR_RETURN(config.modules_to_not_convert, p.Strings(*q, "modules_to_not_convert", ""));
  } else {
    return p.Error(
        "quant_method",
        fmt::format("\"{}\" is not supported (fp8, compressed-tensors, gptq, awq, mxfp4)", method));
  }
  return config;
}

absl::StatusOr<QuantConfig> LoadQuantConfig(const std::string& model_dir) {
  const std::string path = model_dir + "/config.json";
  RS_ASSIGN_OR_RETURN(const std::string text, ReadBoundedFile(path, kMaxConfigJsonBytes));
  Json json;
  try {
    json = Json::parse(text);
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(fmt::format("{}: not valid JSON: {}", path, e.what()));
  }
  return ParseQuantConfig(json, path);
}

LinearStorage StorageOf(const QuantConfig& config, std::string_view module) {
  switch (config.method) {
    case QuantMethod::kNone:
      return {};
    case QuantMethod::kMxfp4:  // only gpt-oss's stacked experts
      if (!(module.ends_with(".mlp.experts.gate_up_proj") ||
            module.ends_with(".mlp.experts.down_proj")) ||
          MatchesSkipKey(module, config.modules_to_not_convert)) {
        return {};
      }
      return {.method = config.method};
    case QuantMethod::kFp8:
      if ((module == "lm_head" && !config.fp8_skip_list_given) ||
          MatchesSkipKey(module, config.modules_to_not_convert)) {
        return {};
      }
      return {.method = config.method};
    case QuantMethod::kAwq:  // AutoAWQ's own test: the key is a substring of the name
      if (module == "lm_head" || MatchesNotConvert(module, config.modules_to_not_convert)) {
        return {};
      }
      return {.method = config.method};
    case QuantMethod::kGptq: {
      if (module == "lm_head")
        return config.gptq_lm_head ? LinearStorage{.method = config.method} : LinearStorage{};
      constexpr std::string_view kLayers = "model.layers.";
      if (module.substr(0, kLayers.size()) != kLayers) return {};
      const size_t dot = module.find('.', kLayers.size());
      if (dot == std::string_view::npos) return {};
      const std::string_view inner = module.substr(dot + 1);  // "self_attn.q_proj"
      // optimum quantizes a block's module when its name ends with a listed one.
      if (!config.gptq_block_modules.empty() &&
          std::none_of(config.gptq_block_modules.begin(), config.gptq_block_modules.end(),
                       [&](const std::string& m) { return inner.ends_with(m); })) {
        return {};
      }
      return {.method = config.method};
    }
    case QuantMethod::kCompressedTensors: {
      for (const std::string& pattern : config.ignore) {
        if (pattern != "Linear" && MatchesTarget(module, pattern)) return {};
      }
      // The reference's precedence: an exact name over a "re:" pattern over "Linear"; among
      // equals the later group.
      const CompressedScheme* best = nullptr;
      int best_rank = 3;
      for (const CompressedScheme& scheme : config.schemes) {
        for (const std::string& target : scheme.targets) {
          if (!MatchesTarget(module, target)) continue;
          const int rank = target == "Linear" ? 2 : (target.rfind("re:", 0) == 0 ? 1 : 0);
          if (rank <= best_rank) {
            best = &scheme;
            best_rank = rank;
          }
        }
      }
      if (best == nullptr || best->storage == CompressedScheme::Storage::kDense) return {};
      return {.method = config.method, .scheme = best};
    }
  }
  return {};
}

}  // namespace ringserve::quant
