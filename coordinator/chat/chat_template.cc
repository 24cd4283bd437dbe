#include "coordinator/chat/chat_template.h"

#include <filesystem>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/bounded_file.h"
#include "common/json_limits.h"
#include "common/status_macros.h"
#include "coordinator/chat/jinja_template.h"

namespace ringserve::chat {
namespace {

using nlohmann::ordered_json;

// transformers' special_tokens_map: the attributes that are set, as strings.
constexpr const char* kSpecialTokenNames[] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                              "pad_token", "cls_token", "mask_token"};

absl::StatusOr<ordered_json> TokenString(const ordered_json& v, const std::string& name) {
  if (v.is_string()) return v;
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"];
  return absl::InvalidArgumentError(
      absl::StrCat("tokenizer_config: ", name, " is neither a string nor an AddedToken"));
}

// Values reach the template through jinja::Value::FromJson, which recurses once a level:
// refuse values nested deeper than external JSON may be (json_limits.h), without recursing.
absl::Status CheckValueDepth(const ordered_json& root, const char* what) {
  std::vector<std::pair<const ordered_json*, int>> pending = {{&root, 1}};
  while (!pending.empty()) {
    auto [value, depth] = pending.back();
    pending.pop_back();
    if (!value->is_structured()) continue;
    if (depth > kMaxJsonDepth) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": JSON nested deeper than ", kMaxJsonDepth, " levels"));
    }
    for (const ordered_json& child : *value) pending.emplace_back(&child, depth + 1);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ChatTemplate> ChatTemplate::FromTokenizerConfig(const std::string& path_or_dir) {
  std::filesystem::path path(path_or_dir);
  std::error_code ec;
  std::string source;  // from <dir>/chat_template.jinja, when the directory has one
  std::filesystem::path source_path;
  if (std::filesystem::is_directory(path, ec)) {
    source_path = path / "chat_template.jinja";
    absl::StatusOr<std::string> jinja = ReadBoundedFile(source_path.string(), kMaxConfigJsonBytes);
    if (jinja.ok()) {
      source = *std::move(jinja);
    } else if (!absl::IsNotFound(jinja.status())) {
      return jinja.status();
    }
    path /= "tokenizer_config.json";
  }
  absl::StatusOr<std::string> text = ReadBoundedFile(path.string(), kMaxConfigJsonBytes);
  if (!text.ok() && !(absl::IsNotFound(text.status()) && !source.empty())) return text.status();
  ordered_json config = ordered_json::object();
  if (text.ok()) {
    RS_RETURN_IF_ERROR(CheckJsonDepth(*text, path.string()));
    try {
      config = ordered_json::parse(*text);
    } catch (const ordered_json::exception& e) {
      return absl::InvalidArgumentError(absl::StrCat(path.string(), ": invalid JSON: ", e.what()));
    }
    if (!config.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(path.string(), ": not a JSON object"));
    }
  }
  if (!source.empty()) {
    path = source_path;  // errors below name the template's own file
  } else if (!config.contains("chat_template")) {
    return absl::NotFoundError(absl::StrCat(path.string(), " has no chat_template"));
  } else if (const ordered_json& ct = config["chat_template"]; ct.is_string()) {
    source = ct.get<std::string>();
  } else if (ct.is_array()) {
    for (const auto& t : ct) {
      if (t.is_object() && t.value("name", "") == "default" && t.contains("template") &&
          t["template"].is_string()) {
        source = t["template"].get<std::string>();
      }
    }
    if (source.empty()) {
      return absl::NotFoundError(absl::StrCat(path.string(), ": no chat_template named default"));
    }
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat(path.string(), ": chat_template is neither a string nor a list"));
  }
  ordered_json special = ordered_json::object();
  for (const char* name : kSpecialTokenNames) {
    if (!config.contains(name) || config[name].is_null()) continue;
    RS_ASSIGN_OR_RETURN(special[name], TokenString(config[name], name));
  }
  if (config.contains("additional_special_tokens") &&
      config["additional_special_tokens"].is_array()) {
    ordered_json list = ordered_json::array();
    for (const auto& t : config["additional_special_tokens"]) {
      RS_ASSIGN_OR_RETURN(ordered_json s, TokenString(t, "additional_special_tokens"));
      list.push_back(std::move(s));
    }
    special["additional_special_tokens"] = std::move(list);
  }
  auto tmpl = FromString(source, special);
  if (!tmpl.ok()) {
    return absl::Status(tmpl.status().code(),
                        absl::StrCat(path.string(), ": ", tmpl.status().message()));
  }
  return tmpl;
}

absl::StatusOr<ChatTemplate> ChatTemplate::FromString(const std::string& source,
                                                      const ordered_json& special_tokens) {
  if (!special_tokens.is_object()) {
    return absl::InvalidArgumentError("special_tokens must be a JSON object");
  }
  ordered_json special = ordered_json::object();
  for (const auto& [k, v] : special_tokens.items()) {
    if (v.is_array()) {
      ordered_json list = ordered_json::array();
      for (const auto& t : v) {
        RS_ASSIGN_OR_RETURN(ordered_json s, TokenString(t, k));
        list.push_back(std::move(s));
      }
      special[k] = std::move(list);
    } else if (!v.is_null()) {
      RS_ASSIGN_OR_RETURN(special[k], TokenString(v, k));
    }
  }
  RS_ASSIGN_OR_RETURN(auto tmpl, jinja::Template::Parse(source));
  return ChatTemplate(std::move(tmpl), std::move(special));
}

const std::string& ChatTemplate::source() const { return template_->source(); }

absl::StatusOr<std::string> ChatTemplate::Render(const ordered_json& messages,
                                                 const ChatRenderOptions& options) const {
  if (!messages.is_array()) return absl::InvalidArgumentError("messages must be a JSON array");
  if (messages.empty()) {  // as transformers
    return absl::InvalidArgumentError(
        "Cannot apply chat template to an empty conversation. Provide at least one message.");
  }
  if (!options.tools.is_null() && !options.tools.is_array()) {
    return absl::InvalidArgumentError("tools must be null or a JSON array");
  }
  if (!options.extra_kwargs.is_object()) {
    return absl::InvalidArgumentError("extra_kwargs must be a JSON object");
  }
  RS_RETURN_IF_ERROR(CheckValueDepth(messages, "messages"));
  RS_RETURN_IF_ERROR(CheckValueDepth(options.tools, "tools"));
  RS_RETURN_IF_ERROR(CheckValueDepth(options.extra_kwargs, "extra_kwargs"));
  // Same variables, in the same precedence, as transformers' apply_chat_template.
  jinja::Value::Dict vars;
  auto set = [&vars](const std::string& k, jinja::Value v) {
    for (auto& [name, value] : vars) {
      if (name == k) {
        value = std::move(v);
        return;
      }
    }
    vars.emplace_back(k, std::move(v));
  };
  set("messages", jinja::Value::FromJson(messages));
  set("tools", jinja::Value::FromJson(options.tools));
  set("documents", jinja::Value::None());
  set("add_generation_prompt", jinja::Value::Bool(options.add_generation_prompt));
  for (const auto& [k, v] : special_tokens_.items()) set(k, jinja::Value::FromJson(v));
  for (const auto& [k, v] : options.extra_kwargs.items()) set(k, jinja::Value::FromJson(v));
  return template_->Render(
      vars, options.now.value_or(std::chrono::system_clock::now()),
      {.max_steps = options.max_render_steps, .max_bytes = options.max_render_bytes});
}

}  // namespace ringserve::chat
