// The parts of a loaded tokenizer.json and the encode / decode pipeline over them. Internal to
// coordinator/tokenizer; use tokenizer.h.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "coordinator/tokenizer/added_vocabulary.h"
#include "coordinator/tokenizer/bpe_model.h"
#include "coordinator/tokenizer/decoder.h"
#include "coordinator/tokenizer/normalizer.h"
#include "coordinator/tokenizer/pre_tokenizer.h"
#include "coordinator/tokenizer/tokenizer.h"

namespace ringserve::tokenizer_internal {

class TokenizerImpl {
 public:
  static absl::StatusOr<std::unique_ptr<TokenizerImpl>> Create(absl::string_view tokenizer_json,
                                                               absl::string_view config_json,
                                                               const Tokenizer::Options& options);

  absl::StatusOr<std::vector<int32_t>> Encode(absl::string_view text,
                                              bool add_special_tokens) const;
  std::string Decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const;

  // Byte-level decoders only: appends the raw bytes `id` decodes to (nothing for unknown ids
  // and, with skip_special_tokens, special ones).
  bool byte_level_decoder() const { return decoder_ != nullptr && decoder_->byte_level_only(); }
  void AppendTokenBytes(int32_t id, bool skip_special_tokens, std::string* out) const;

  std::optional<int32_t> TokenToId(absl::string_view token) const;
  const std::string* IdToToken(int32_t id) const;
  int32_t vocab_size() const { return vocab_size_; }
  bool IsSpecial(int32_t id) const {
    return id >= 0 && id < static_cast<int32_t>(special_.size()) && special_[id];
  }
  std::optional<int32_t> bos_id() const { return bos_id_; }
  std::optional<int32_t> eos_id() const { return eos_id_; }
  std::optional<int32_t> pad_id() const { return pad_id_; }

 private:
  TokenizerImpl() = default;
  absl::Status EncodeText(absl::string_view text, std::vector<int32_t>* ids) const;

  std::unique_ptr<Normalizer> normalizer_;
  std::unique_ptr<PreTokenizer> pre_tokenizer_;
  std::unique_ptr<BpeModel> model_;
  std::unique_ptr<Decoder> decoder_;  // nullptr: tokens joined with spaces

  std::vector<AddedToken> added_;
  absl::flat_hash_map<std::string, int32_t> added_by_content_;
  absl::flat_hash_map<int32_t, size_t> added_by_id_;  // index into added_
  AddedTokenMatcher raw_matcher_;                     // normalized == false, on the input
  AddedTokenMatcher normalized_matcher_;              // normalized == true, after normalizing

  // Post-processing of a single sequence: ids before and after it.
  std::vector<int32_t> prefix_ids_;
  std::vector<int32_t> suffix_ids_;

  int32_t vocab_size_ = 0;
  std::vector<bool> special_;
  std::vector<std::string> token_bytes_;  // byte-level decoders: raw bytes per id
  std::vector<bool> known_;               // ids that decode to something
  std::optional<int32_t> bos_id_, eos_id_, pad_id_;
};

}  // namespace ringserve::tokenizer_internal
