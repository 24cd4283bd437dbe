// Loading: tokenizer.json / tokenizer_config.json into a TokenizerImpl.
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/json_limits.h"
#include "common/status_macros.h"
#include "coordinator/tokenizer/tokenizer_impl.h"
#include "coordinator/tokenizer/utf8.h"

namespace ringserve::tokenizer_internal {
namespace {

absl::StatusOr<nlohmann::json> ParseJson(absl::string_view text, absl::string_view what) {
  RS_RETURN_IF_ERROR(CheckJsonDepth(std::string_view(text.data(), text.size()),
                                    std::string_view(what.data(), what.size())));
  try {
    return nlohmann::json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": invalid JSON: ", e.what()));
  }
}

// A token named in tokenizer_config.json: "text" or {"content": "text", ...}.
std::optional<std::string> ConfigToken(const nlohmann::json& config, const char* field) {
  auto it = config.find(field);
  if (it == config.end()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
    return (*it)["content"].get<std::string>();
  }
  return std::nullopt;
}

absl::Status ParsePostProcessor(const nlohmann::json& spec, std::vector<int32_t>* prefix,
                                std::vector<int32_t>* suffix) {
  if (spec.is_null()) return absl::OkStatus();
  if (!spec.is_object() || !spec.contains("type") || !spec["type"].is_string()) {
    return absl::InvalidArgumentError("post_processor: expected an object with a string 'type'");
  }
  const std::string type = spec["type"].get<std::string>();
  if (type == "ByteLevel") return absl::OkStatus();  // offsets only
  if (type == "Sequence") {
    auto list = spec.find("processors");
    if (list == spec.end() || !list->is_array()) {
      return absl::InvalidArgumentError("post_processor Sequence: missing array 'processors'");
    }
    for (const auto& item : *list) RS_RETURN_IF_ERROR(ParsePostProcessor(item, prefix, suffix));
    return absl::OkStatus();
  }
  if (type != "TemplateProcessing") {
    return absl::InvalidArgumentError(absl::StrCat("unsupported post_processor type '", type, "'"));
  }
  auto single = spec.find("single");
  auto specials = spec.find("special_tokens");
  if (single == spec.end() || !single->is_array() || specials == spec.end() ||
      !specials->is_object()) {
    return absl::InvalidArgumentError(
        "post_processor TemplateProcessing: needs array 'single' and object 'special_tokens'");
  }
  bool seen_sequence = false;
  for (const auto& item : *single) {
    if (item.contains("Sequence")) {
      seen_sequence = true;
      continue;
    }
    if (!item.contains("SpecialToken") || !item["SpecialToken"].contains("id")) {
      return absl::InvalidArgumentError(
          "post_processor TemplateProcessing: item is neither Sequence nor SpecialToken");
    }
    const std::string name = item["SpecialToken"]["id"].get<std::string>();
    auto special = specials->find(name);
    if (special == specials->end() || !special->contains("ids") || !(*special)["ids"].is_array()) {
      return absl::InvalidArgumentError(
          absl::StrCat("post_processor TemplateProcessing: special token '", name, "' has no ids"));
    }
    for (const auto& id : (*special)["ids"]) {
      (seen_sequence ? suffix : prefix)->push_back(id.get<int32_t>());
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<TokenizerImpl>> TokenizerImpl::Create(
    absl::string_view tokenizer_json, absl::string_view config_json,
    const Tokenizer::Options& options) {
  RS_ASSIGN_OR_RETURN(nlohmann::json spec, ParseJson(tokenizer_json, "tokenizer.json"));
  nlohmann::json config = nlohmann::json::object();
  if (!config_json.empty()) {
    RS_ASSIGN_OR_RETURN(config, ParseJson(config_json, "tokenizer_config.json"));
  }
  if (!spec.is_object() || !spec.contains("model")) {
    return absl::InvalidArgumentError("tokenizer.json: missing 'model'");
  }
  std::unique_ptr<TokenizerImpl> impl(new TokenizerImpl());
  try {
    const nlohmann::json null_json;
    auto part = [&](const char* name) -> const nlohmann::json& {
      auto it = spec.find(name);
      return it == spec.end() ? null_json : *it;
    };
    RS_ASSIGN_OR_RETURN(impl->normalizer_, MakeNormalizer(part("normalizer")));
    RS_ASSIGN_OR_RETURN(impl->pre_tokenizer_, PreTokenizer::Create(part("pre_tokenizer")));
    RS_ASSIGN_OR_RETURN(
        impl->model_,
        BpeModel::Create(spec["model"], {.byte_level = impl->pre_tokenizer_->byte_level(),
                                         .cache_capacity = options.cache_capacity}));
    if (!part("decoder").is_null()) {
      RS_ASSIGN_OR_RETURN(impl->decoder_, Decoder::Create(part("decoder")));
    }
    RS_RETURN_IF_ERROR(
        ParsePostProcessor(part("post_processor"), &impl->prefix_ids_, &impl->suffix_ids_));

    // Added tokens.
    const nlohmann::json& added = part("added_tokens");
    if (!added.is_null() && !added.is_array()) {
      return absl::InvalidArgumentError("tokenizer.json: 'added_tokens' must be an array");
    }
    int32_t max_id = impl->model_->id_limit() - 1;
    for (const auto& item : added.is_array() ? added : nlohmann::json::array()) {
      AddedToken token;
      if (!item.is_object() || !item.contains("id") || !item["id"].is_number_integer() ||
          !item.contains("content") || !item["content"].is_string()) {
        return absl::InvalidArgumentError(
            "tokenizer.json: an added token lacks an integer 'id' or string 'content'");
      }
      const nlohmann::json& id = item["id"];
      if (id.is_number_unsigned() ? id.get<uint64_t>() > uint64_t{kMaxTokenId}
                                  : id.get<int64_t>() < 0 || id.get<int64_t>() > kMaxTokenId) {
        return absl::InvalidArgumentError(absl::StrCat("tokenizer.json: added token id ", id.dump(),
                                                       " is outside [0, ", kMaxTokenId, "]"));
      }
      token.id = id.get<int32_t>();
      token.content = item["content"].get<std::string>();
      if (FindInvalidUtf8(token.content).has_value()) {
        return absl::InvalidArgumentError(
            absl::StrCat("tokenizer.json: added token ", token.id, " is malformed"));
      }
      token.special = item.value("special", false);
      token.lstrip = item.value("lstrip", false);
      token.rstrip = item.value("rstrip", false);
      token.single_word = item.value("single_word", false);
      token.normalized = item.value("normalized", !token.special);
      max_id = std::max(max_id, token.id);
      impl->added_by_content_[token.content] = token.id;
      impl->added_by_id_[token.id] = impl->added_.size();
      impl->added_.push_back(std::move(token));
    }
    std::vector<const AddedToken*> raw, normalized;
    std::vector<std::string> raw_patterns, normalized_patterns;
    for (const AddedToken& token : impl->added_) {
      if (token.normalized) {
        normalized.push_back(&token);
        std::string pattern = token.content;
        if (impl->normalizer_ != nullptr) {
          NormalizeBudget budget = NormalizeBudget::ForInput(token.content.size());
          absl::Status normalized_ok =
              impl->normalizer_->Normalize(token.content, &budget, &pattern);
          if (!normalized_ok.ok()) {
            return absl::InvalidArgumentError(absl::StrCat("tokenizer.json: added token ", token.id,
                                                           ": ", normalized_ok.message()));
          }
        }
        normalized_patterns.push_back(std::move(pattern));
      } else {
        raw.push_back(&token);
        raw_patterns.push_back(token.content);
      }
    }
    impl->raw_matcher_.Build(raw, raw_patterns);
    impl->normalized_matcher_.Build(normalized, normalized_patterns);

    impl->vocab_size_ = max_id + 1;
    impl->special_.assign(impl->vocab_size_, false);
    impl->known_.assign(impl->vocab_size_, false);
    for (const AddedToken& token : impl->added_) {
      impl->special_[token.id] = token.special;
      impl->known_[token.id] = true;
    }
    const bool byte_level = impl->byte_level_decoder();
    if (byte_level) impl->token_bytes_.resize(impl->vocab_size_);
    for (int32_t id = 0; id < impl->vocab_size_; ++id) {
      const std::string* token = impl->IdToToken(id);
      if (token == nullptr) continue;
      impl->known_[id] = true;
      if (byte_level) {
        std::optional<std::string> bytes = ByteLevelToBytes(*token);
        impl->token_bytes_[id] = bytes.has_value() ? *std::move(bytes) : *token;
      }
    }

    // tokenizer_config.json.
    auto lookup = [&](const char* field) -> std::optional<int32_t> {
      std::optional<std::string> name = ConfigToken(config, field);
      return name.has_value() ? impl->TokenToId(*name) : std::nullopt;
    };
    impl->bos_id_ = lookup("bos_token");
    impl->eos_id_ = lookup("eos_token");
    impl->pad_id_ = lookup("pad_token");
    const bool has_bos_flag =
        config.contains("add_bos_token") && config["add_bos_token"].is_boolean();
    const bool has_eos_flag =
        config.contains("add_eos_token") && config["add_eos_token"].is_boolean();
    if (options.apply_config_special_tokens && (has_bos_flag || has_eos_flag)) {
      // transformers' Llama-style fast tokenizers rebuild the post-processor from these flags.
      if (has_bos_flag && config["add_bos_token"].get<bool>() && impl->bos_id_.has_value() &&
          (impl->prefix_ids_.empty() || impl->prefix_ids_[0] != *impl->bos_id_)) {
        impl->prefix_ids_.insert(impl->prefix_ids_.begin(), *impl->bos_id_);
      }
      if (has_eos_flag && config["add_eos_token"].get<bool>() && impl->eos_id_.has_value() &&
          (impl->suffix_ids_.empty() || impl->suffix_ids_.back() != *impl->eos_id_)) {
        impl->suffix_ids_.push_back(*impl->eos_id_);
      }
    }
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer.json: unexpected structure: ", e.what()));
  }
  return impl;
}

}  // namespace ringserve::tokenizer_internal
