// Hugging Face `tokenizer.json` tokenizers (byte-level BPE: Llama 3, Qwen 2/3, DeepSeek V3 and
// the like), exact against the `tokenizers` library.
//
//   RS_ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tok, Tokenizer::FromDirectory(dir));
//   RS_ASSIGN_OR_RETURN(std::vector<int32_t> ids, tok->Encode(prompt,
//   /*add_special_tokens=*/true)); std::string text = tok->Decode(ids,
//   /*skip_special_tokens=*/false);
//
//   StreamDecoder stream(*tok, {.skip_special_tokens = true});
//   for (int32_t id : generated) send(stream.Step(id));   // never a broken UTF-8 sequence
//   send(stream.Finish());                                  // the held-back tail, if any
//
// Supported tokenizer.json parts (anything else is refused at load time, naming the part):
//   model:          BPE (merges as "a b" strings or [a, b] pairs; ignore_merges; byte_fallback;
//                   unk_token / fuse_unk; continuing_subword_prefix; end_of_word_suffix)
//   normalizer:     NFC, NFD, NFKC, NFKD (ICU), Lowercase, Prepend, Replace (String pattern),
//                   Strip, Sequence, null (Prepend and Replace literals up to 64 KiB)
//   pre_tokenizer:  Split (Regex via PCRE2 in UTF+UCP mode with JIT, or String; behaviors
//                   Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous; invert),
//                   ByteLevel (add_prefix_space, use_regex; must come last), Digits
//                   (individual_digits), Sequence, null
//   post_processor: ByteLevel, TemplateProcessing (single sequence), Sequence, null
//   decoder:        ByteLevel, ByteFallback, Fuse, Replace (String pattern), Strip, Sequence, null
//                   (Replace steps that could grow text more than 64-fold in all are refused)
//   added_tokens:   special, lstrip, rstrip, single_word, normalized
//
// Thread safety: a loaded Tokenizer is immutable except for an internal, internally locked
// cache; every const method may be called from any number of threads at once.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ringserve {

namespace tokenizer_internal {
class TokenizerImpl;
}  // namespace tokenizer_internal

class Tokenizer {
 public:
  struct Options {
    // tokenizer_config.json may ask for a BOS/EOS token (`add_bos_token` / `add_eos_token`)
    // that tokenizer.json's post-processor does not add (DeepSeek V3 ships it that way;
    // transformers' LlamaTokenizerFast then adds BOS itself). When true, Encode with
    // add_special_tokens adds them as transformers does. When false, Encode follows
    // tokenizer.json alone, exactly like `tokenizers.Tokenizer.from_file(...)`.
    bool apply_config_special_tokens = true;
    // Bound on the number of cached pre-token -> ids entries (the whole cache, all threads).
    // 0 disables the cache.
    size_t cache_capacity = 65536;
  };

  // Loads `dir`/tokenizer.json and, if present, `dir`/tokenizer_config.json, each read as a
  // regular file of bounded size (common/bounded_file.h: kMaxTokenizerJsonBytes,
  // kMaxConfigJsonBytes; symlinks to regular files, as in hub caches, are fine).
  // InvalidArgument / NotFound naming the file and what is wrong: not a regular file (a FIFO,
  // a device) or too large, bad JSON, unsupported model, normalizer, pre-tokenizer,
  // post-processor or decoder type, a regex PCRE2 rejects, a merge naming a token missing from
  // the vocab, ...
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromDirectory(const std::string& dir);
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromDirectory(const std::string& dir,
                                                                  const Options& options);
  // Same from in-memory file contents; `config_json` may be empty (no tokenizer_config.json).
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromJson(absl::string_view tokenizer_json,
                                                             absl::string_view config_json,
                                                             const Options& options);

  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // Encodes UTF-8 `text`. Added tokens (special or not) found in the text become their ids,
  // as in Hugging Face. `add_special_tokens` applies the post-processor (and, see Options,
  // tokenizer_config.json's add_bos_token/add_eos_token).
  // InvalidArgument if `text` is not valid UTF-8 (the message gives the byte offset), or if
  // the tokenizer's normalizers would grow it past its budget (64 times its size, at least
  // 1 MiB, at most 256 MiB; normalizer.h), naming the step ("normalizer.normalizers[2]
  // (Replace)"). A failed Encode leaves the tokenizer as it was.
  absl::StatusOr<std::vector<int32_t>> Encode(absl::string_view text,
                                              bool add_special_tokens) const;

  // Decodes ids to text as Hugging Face's `decode` does: unknown ids are dropped; byte
  // sequences that are not valid UTF-8 become U+FFFD. With `skip_special_tokens`, tokens
  // flagged special are left out.
  std::string Decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const;

  // Token string (as in tokenizer.json, e.g. "Ġthe") <-> id, added tokens included.
  std::optional<int32_t> TokenToId(absl::string_view token) const;
  std::optional<std::string> IdToToken(int32_t id) const;

  // One more than the largest id (vocab and added tokens).
  int32_t vocab_size() const;
  // From tokenizer_config.json (bos_token / eos_token / pad_token), when it names a token
  // that exists. Qwen3: no BOS, EOS <|im_end|>. Llama 3: <|begin_of_text|>, <|end_of_text|>.
  std::optional<int32_t> bos_token_id() const;
  std::optional<int32_t> eos_token_id() const;
  std::optional<int32_t> pad_token_id() const;
  // True for added tokens flagged `special` in tokenizer.json.
  bool IsSpecial(int32_t id) const;
  // Every special token id, ascending.
  std::vector<int32_t> SpecialTokenIds() const;

 private:
  friend class StreamDecoder;
  explicit Tokenizer(std::unique_ptr<tokenizer_internal::TokenizerImpl> impl);
  std::unique_ptr<tokenizer_internal::TokenizerImpl> impl_;
};

// Incremental detokenization for streaming: feed ids one at a time, get text pieces.
// Pieces never end inside a UTF-8 sequence (an incomplete multi-byte character is held back
// until the bytes that complete it arrive), and the concatenation of every Step() result and
// Finish() equals Decode(all ids, skip_special_tokens).
// Not thread-safe (one per stream); keeps a reference to `tokenizer`, which must outlive it.
class StreamDecoder {
 public:
  struct Options {
    bool skip_special_tokens = false;
  };
  explicit StreamDecoder(const Tokenizer& tokenizer);
  StreamDecoder(const Tokenizer& tokenizer, const Options& options);

  // Returns the text that `id` completes; often empty (mid-character).
  std::string Step(int32_t id);
  // Returns what is still held back (as U+FFFD where it can never become valid) and resets.
  std::string Finish();

 private:
  const Tokenizer& tokenizer_;
  Options options_;
  // Byte-level decoders: raw bytes not yet emitted (an incomplete UTF-8 sequence, < 4 bytes).
  std::string pending_bytes_;
  // Other decoders (not used by the byte-level files): every id so far, re-decoded per step
  // (quadratic in the output length), and how many bytes of that text were emitted.
  std::vector<int32_t> window_ids_;
  size_t window_emitted_bytes_ = 0;
};

}  // namespace ringserve
