#include "coordinator/tokenizer/tokenizer.h"

#include <deque>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/bounded_file.h"
#include "common/status_macros.h"
#include "coordinator/tokenizer/tokenizer_impl.h"
#include "coordinator/tokenizer/utf8.h"

namespace ringserve {
namespace tokenizer_internal {

absl::Status TokenizerImpl::EncodeText(absl::string_view text, std::vector<int32_t>* ids) const {
  thread_local std::vector<TextPiece> raw_pieces;
  thread_local std::vector<TextPiece> pieces;
  thread_local std::vector<absl::string_view> words;
  thread_local std::string normalized;
  thread_local std::deque<std::string> storage;
  storage.clear();
  raw_pieces.clear();
  // One budget for the whole text: its pieces' normalizations together.
  NormalizeBudget budget = NormalizeBudget::ForInput(text.size());
  if (raw_matcher_.empty()) {
    raw_pieces.push_back({text, -1});
  } else {
    raw_matcher_.Split(text, &raw_pieces);
  }
  for (const TextPiece& raw : raw_pieces) {
    if (raw.id >= 0) {
      ids->push_back(raw.id);
      continue;
    }
    absl::string_view view = raw.text;
    if (normalizer_ != nullptr) {
      RS_RETURN_IF_ERROR(normalizer_->Normalize(raw.text, &budget, &normalized));
      view = normalized;
    }
    pieces.clear();
    if (normalized_matcher_.empty()) {
      pieces.push_back({view, -1});
    } else {
      normalized_matcher_.Split(view, &pieces);
    }
    for (const TextPiece& piece : pieces) {
      if (piece.id >= 0) {
        ids->push_back(piece.id);
        continue;
      }
      words.clear();
      RS_RETURN_IF_ERROR(pre_tokenizer_->Split(piece.text, &storage, &words));
      for (absl::string_view word : words) model_->Encode(word, ids);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int32_t>> TokenizerImpl::Encode(absl::string_view text,
                                                           bool add_special_tokens) const {
  if (std::optional<size_t> bad = FindInvalidUtf8(text); bad.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("text to encode is not valid UTF-8: byte 0x%02X at byte offset %d",
                        static_cast<unsigned char>(text[*bad]), *bad));
  }
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 8);
  if (add_special_tokens) ids.insert(ids.end(), prefix_ids_.begin(), prefix_ids_.end());
  RS_RETURN_IF_ERROR(EncodeText(text, &ids));
  if (add_special_tokens) ids.insert(ids.end(), suffix_ids_.begin(), suffix_ids_.end());
  return ids;
}

void TokenizerImpl::AppendTokenBytes(int32_t id, bool skip_special_tokens, std::string* out) const {
  if (id < 0 || id >= vocab_size_ || !known_[id]) return;
  if (skip_special_tokens && special_[id]) return;
  out->append(token_bytes_[id]);
}

std::string TokenizerImpl::Decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
  if (byte_level_decoder()) {
    std::string bytes;
    for (int32_t id : ids) AppendTokenBytes(id, skip_special_tokens, &bytes);
    std::string text;
    AppendUtf8Lossy(bytes, &text);
    return text;
  }
  std::vector<std::string> tokens;
  for (int32_t id : ids) {
    const std::string* token = IdToToken(id);
    if (token == nullptr || (skip_special_tokens && IsSpecial(id))) continue;
    tokens.push_back(*token);
  }
  if (decoder_ != nullptr) return decoder_->Decode(std::move(tokens));
  std::string text;
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (i > 0) text += ' ';
    text += tokens[i];
  }
  return text;
}

std::optional<int32_t> TokenizerImpl::TokenToId(absl::string_view token) const {
  auto it = added_by_content_.find(token);
  if (it != added_by_content_.end()) return it->second;
  return model_->TokenToId(token);
}

const std::string* TokenizerImpl::IdToToken(int32_t id) const {
  auto it = added_by_id_.find(id);
  if (it != added_by_id_.end()) return &added_[it->second].content;
  return model_->IdToToken(id);
}

}  // namespace tokenizer_internal

namespace {

// tokenizer_config.json is optional: absent is "", but one that is there and cannot be read
// (a FIFO, a device, too large) is an error.
absl::StatusOr<std::string> ReadOptionalFile(const std::string& path, uint64_t max_bytes) {
  absl::StatusOr<std::string> text = ReadBoundedFile(path, max_bytes);
  if (absl::IsNotFound(text.status())) return std::string();
  return text;
}

}  // namespace

Tokenizer::Tokenizer(std::unique_ptr<tokenizer_internal::TokenizerImpl> impl)
    : impl_(std::move(impl)) {}
Tokenizer::~Tokenizer() = default;

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromDirectory(const std::string& dir) {
  return FromDirectory(dir, Options());
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromDirectory(const std::string& dir,
                                                                    const Options& options) {
  const std::string json_path = dir + "/tokenizer.json";
  RS_ASSIGN_OR_RETURN(std::string json, ReadBoundedFile(json_path, kMaxTokenizerJsonBytes));
  RS_ASSIGN_OR_RETURN(std::string config,
                      ReadOptionalFile(dir + "/tokenizer_config.json", kMaxConfigJsonBytes));
  auto tokenizer = FromJson(json, config, options);
  if (!tokenizer.ok()) {
    return absl::Status(tokenizer.status().code(),
                        absl::StrCat(dir, ": ", tokenizer.status().message()));
  }
  return tokenizer;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromJson(absl::string_view tokenizer_json,
                                                               absl::string_view config_json,
                                                               const Options& options) {
  RS_ASSIGN_OR_RETURN(
      auto impl, tokenizer_internal::TokenizerImpl::Create(tokenizer_json, config_json, options));
  return std::unique_ptr<Tokenizer>(new Tokenizer(std::move(impl)));
}

absl::StatusOr<std::vector<int32_t>> Tokenizer::Encode(absl::string_view text,
                                                       bool add_special_tokens) const {
  return impl_->Encode(text, add_special_tokens);
}

std::string Tokenizer::Decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
  return impl_->Decode(ids, skip_special_tokens);
}

std::optional<int32_t> Tokenizer::TokenToId(absl::string_view token) const {
  return impl_->TokenToId(token);
}

std::optional<std::string> Tokenizer::IdToToken(int32_t id) const {
  const std::string* token = impl_->IdToToken(id);
  if (token == nullptr) return std::nullopt;
  return *token;
}

int32_t Tokenizer::vocab_size() const { return impl_->vocab_size(); }
std::optional<int32_t> Tokenizer::bos_token_id() const { return impl_->bos_id(); }
std::optional<int32_t> Tokenizer::eos_token_id() const { return impl_->eos_id(); }
std::optional<int32_t> Tokenizer::pad_token_id() const { return impl_->pad_id(); }
bool Tokenizer::IsSpecial(int32_t id) const { return impl_->IsSpecial(id); }

std::vector<int32_t> Tokenizer::SpecialTokenIds() const {
  std::vector<int32_t> ids;
  for (int32_t id = 0; id < impl_->vocab_size(); ++id) {
    if (impl_->IsSpecial(id)) ids.push_back(id);
  }
  return ids;
}

StreamDecoder::StreamDecoder(const Tokenizer& tokenizer) : StreamDecoder(tokenizer, Options()) {}
StreamDecoder::StreamDecoder(const Tokenizer& tokenizer, const Options& options)
    : tokenizer_(tokenizer), options_(options) {}

std::string StreamDecoder::Step(int32_t id) {
  const auto& impl = *tokenizer_.impl_;
  std::string text;
  if (impl.byte_level_decoder()) {
    impl.AppendTokenBytes(id, options_.skip_special_tokens, &pending_bytes_);
    const size_t complete = tokenizer_internal::CompleteUtf8PrefixLength(pending_bytes_);
    tokenizer_internal::AppendUtf8Lossy(absl::string_view(pending_bytes_).substr(0, complete),
                                        &text);
    pending_bytes_.erase(0, complete);
    return text;
  }
  // Other decoders: decode the ids so far and emit what extends the text already emitted, once
  // it no longer ends in U+FFFD (a possibly incomplete character).
  window_ids_.push_back(id);
  const std::string all = impl.Decode(window_ids_, options_.skip_special_tokens);
  const absl::string_view kReplacement = "\xEF\xBF\xBD";
  if (all.size() > window_emitted_bytes_ && !absl::EndsWith(absl::string_view(all), kReplacement)) {
    text = all.substr(window_emitted_bytes_);
    window_emitted_bytes_ = all.size();
  }
  return text;
}

std::string StreamDecoder::Finish() {
  std::string text;
  if (tokenizer_.impl_->byte_level_decoder()) {
    tokenizer_internal::AppendUtf8Lossy(pending_bytes_, &text);
  } else if (!window_ids_.empty()) {
    const std::string all = tokenizer_.impl_->Decode(window_ids_, options_.skip_special_tokens);
    if (all.size() > window_emitted_bytes_) text = all.substr(window_emitted_bytes_);
  }
  pending_bytes_.clear();
  window_ids_.clear();
  window_emitted_bytes_ = 0;
  return text;
}

}  // namespace ringserve
