// The BPE model of tokenizer.json: vocab, ranked merges, and the per-pre-token encoder with a
// bounded cache.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/hash/hash.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ringserve::tokenizer_internal {

// The largest token id a tokenizer.json may use (vocab and added tokens; real vocabularies stay
// below 2^20). Per-id tables are sized by the largest id, so a file naming id 2^31 - 1 must be
// refused rather than allocated for.
inline constexpr int64_t kMaxTokenId = (int64_t{1} << 22) - 1;

// A string key with its hash computed once, so one hash serves the cache and the vocab.
struct HashedKey {
  absl::string_view text;
  size_t hash;
};
struct KeyHash {
  using is_transparent = void;
  size_t operator()(absl::string_view s) const { return absl::HashOf(s); }
  size_t operator()(const HashedKey& k) const { return k.hash; }
};
struct KeyEq {
  using is_transparent = void;
  static absl::string_view View(absl::string_view s) { return s; }
  static absl::string_view View(const HashedKey& k) { return k.text; }
  template <typename A, typename B>
  bool operator()(const A& a, const B& b) const {
    return View(a) == View(b);
  }
};
template <typename V>
using StringMap = absl::flat_hash_map<std::string, V, KeyHash, KeyEq>;

class BpeModel {
 public:
  struct Options {
    // Pre-tokens arrive as raw bytes, each standing for its GPT-2 byte-level character.
    bool byte_level = false;
    size_t cache_capacity = 65536;
  };
  // `model` is the "model" object of tokenizer.json. InvalidArgument for a type other than
  // BPE, dropout, malformed merges, or merges / unk_token naming tokens not in the vocab.
  static absl::StatusOr<std::unique_ptr<BpeModel>> Create(const nlohmann::json& model,
                                                          const Options& options);

  // Appends the ids of one pre-token. Thread-safe.
  void Encode(absl::string_view word, std::vector<int32_t>* out) const;

  // tokenizer.json token string <-> id, model vocab only.
  std::optional<int32_t> TokenToId(absl::string_view token) const;
  const std::string* IdToToken(int32_t id) const;
  // One more than the largest vocab id.
  int32_t id_limit() const { return static_cast<int32_t>(id_to_token_.size()); }

 private:
  using Symbols = absl::InlinedVector<int32_t, 32>;
  struct Merge {
    int32_t rank;
    int32_t id;
  };
  struct CacheShard {
    std::mutex mu;
    StringMap<absl::InlinedVector<int32_t, 4>> map;  // guarded by mu
    size_t key_bytes = 0;                            // guarded by mu
  };
  static constexpr size_t kCacheShards = 16;
  // Longer words are not cached; the key bytes of one shard stay under kCacheShardBytes.
  static constexpr size_t kMaxCachedWordBytes = 4096;
  static constexpr size_t kCacheShardBytes = (size_t{16} << 20) / kCacheShards;

  BpeModel() = default;
  std::optional<int32_t> ModelSpaceId(absl::string_view key) const;
  std::optional<int32_t> JsonSpaceId(absl::string_view token) const;
  void InitialSymbols(absl::string_view word, Symbols* symbols) const;
  void MergeSmall(Symbols* symbols) const;
  void MergeLarge(Symbols* symbols) const;
  const Merge* FindMerge(int32_t left, int32_t right) const {
    auto it = merges_.find((static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) |
                           static_cast<uint32_t>(right));
    return it == merges_.end() ? nullptr : &it->second;
  }

  Options options_;
  std::vector<std::string> id_to_token_;  // tokenizer.json spelling; empty for unused ids
  std::vector<bool> id_used_;
  // Keyed by model-space spelling: raw bytes in byte-level mode, else the token itself.
  StringMap<int32_t> vocab_;
  // Byte-level mode: vocab entries whose spelling is not byte-level (unreachable by encoding).
  StringMap<int32_t> unconvertible_;
  absl::flat_hash_map<uint64_t, Merge> merges_;
  int32_t byte_ids_[256];  // byte-level fast path: id of each single byte, -1 if none
  bool fast_bytes_ = false;
  bool ignore_merges_ = false;
  bool byte_fallback_ = false;
  bool fuse_unk_ = false;
  std::optional<int32_t> unk_id_;
  std::string prefix_;  // continuing_subword_prefix, model space
  std::string suffix_;  // end_of_word_suffix, model space
  size_t cache_shard_capacity_ = 0;
  mutable CacheShard cache_[kCacheShards];
};

}  // namespace ringserve::tokenizer_internal
