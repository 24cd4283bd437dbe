#include "coordinator/tokenizer/bpe_model.h"

#include <climits>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <queue>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "coordinator/tokenizer/utf8.h"

namespace ringserve::tokenizer_internal {
namespace {

// Words up to this many symbols merge by rescanning a rank array; longer ones use a heap.
constexpr size_t kSmallWordSymbols = 128;

absl::StatusOr<std::string> OptionalString(const nlohmann::json& model, const char* field) {
  auto it = model.find(field);
  if (it == model.end() || it->is_null()) return std::string();
  if (!it->is_string()) {
    return absl::InvalidArgumentError(absl::StrCat("model: field '", field, "' must be a string"));
  }
  return it->get<std::string>();
}

}  // namespace

absl::StatusOr<std::unique_ptr<BpeModel>> BpeModel::Create(const nlohmann::json& model,
                                                           const Options& options) {
  if (!model.is_object()) return absl::InvalidArgumentError("model: expected an object");
  const std::string type = model.value("type", std::string("BPE"));
  if (type != "BPE") {
    return absl::InvalidArgumentError(
        absl::StrCat("unsupported model type '", type, "' (only BPE is supported)"));
  }
  if (model.contains("dropout") && !model["dropout"].is_null() &&
      model["dropout"].get<double>() != 0.0) {
    return absl::InvalidArgumentError("model BPE: dropout is not supported");
  }
  std::unique_ptr<BpeModel> bpe(new BpeModel());
  bpe->options_ = options;
  bpe->ignore_merges_ = model.value("ignore_merges", false);
  bpe->byte_fallback_ = model.value("byte_fallback", false);
  bpe->fuse_unk_ = model.value("fuse_unk", false);
  RS_ASSIGN_OR_RETURN(std::string prefix, OptionalString(model, "continuing_subword_prefix"));
  RS_ASSIGN_OR_RETURN(std::string suffix, OptionalString(model, "end_of_word_suffix"));
  RS_ASSIGN_OR_RETURN(std::string unk, OptionalString(model, "unk_token"));

  auto vocab = model.find("vocab");
  if (vocab == model.end() || !vocab->is_object()) {
    return absl::InvalidArgumentError("model BPE: missing object 'vocab'");
  }
  int32_t max_id = -1;
  for (auto it = vocab->begin(); it != vocab->end(); ++it) {
    if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 ||
        it.value().get<int64_t>() > kMaxTokenId) {
      return absl::InvalidArgumentError(absl::StrCat("model BPE: vocab entry '", it.key(),
                                                     "' has no valid id (0 to ", kMaxTokenId,
                                                     "): ", it.value().dump()));
    }
    max_id = std::max(max_id, it.value().get<int32_t>());
  }
  bpe->id_to_token_.resize(max_id + 1);
  bpe->id_used_.assign(max_id + 1, false);
  bpe->vocab_.reserve(vocab->size());
  for (auto it = vocab->begin(); it != vocab->end(); ++it) {
    const int32_t id = it.value().get<int32_t>();
    bpe->id_to_token_[id] = it.key();
    bpe->id_used_[id] = true;
    if (options.byte_level) {
      std::optional<std::string> bytes = ByteLevelToBytes(it.key());
      if (bytes.has_value()) {
        bpe->vocab_[*bytes] = id;
      } else {
        bpe->unconvertible_[it.key()] = id;
      }
    } else {
      bpe->vocab_[it.key()] = id;
    }
  }

  auto to_model_space = [&](const std::string& s, const char* what) -> absl::StatusOr<std::string> {
    if (!options.byte_level) return s;
    std::optional<std::string> bytes = ByteLevelToBytes(s);
    if (!bytes.has_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat("model BPE: ", what, " '", s, "' is not byte-level text"));
    }
    return *bytes;
  };
  RS_ASSIGN_OR_RETURN(bpe->prefix_, to_model_space(prefix, "continuing_subword_prefix"));
  RS_ASSIGN_OR_RETURN(bpe->suffix_, to_model_space(suffix, "end_of_word_suffix"));
  if (!unk.empty()) {
    bpe->unk_id_ = bpe->JsonSpaceId(unk);
    if (!bpe->unk_id_.has_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat("model BPE: unk_token '", unk, "' is not in the vocab"));
    }
  }

  auto merges = model.find("merges");
  if (merges == model.end() || !merges->is_array()) {
    return absl::InvalidArgumentError("model BPE: missing array 'merges'");
  }
  bpe->merges_.reserve(merges->size());
  std::string left, right;
  for (size_t rank = 0; rank < merges->size(); ++rank) {
    const nlohmann::json& m = (*merges)[rank];
    if (m.is_string()) {
      const std::string& line = m.get_ref<const std::string&>();
      const size_t space = line.find(' ');
      if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos) {
        return absl::InvalidArgumentError(
            absl::StrCat("model BPE: merge ", rank, " '", line, "' is not two tokens"));
      }
      left = line.substr(0, space);
      right = line.substr(space + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      left = m[0].get<std::string>();
      right = m[1].get<std::string>();
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("model BPE: merge ", rank, " is neither \"a b\" nor [a, b]"));
    }
    std::optional<int32_t> a = bpe->JsonSpaceId(left);
    std::optional<int32_t> b = bpe->JsonSpaceId(right);
    const absl::string_view right_tail =
        !prefix.empty() && absl::string_view(right).substr(0, prefix.size()) == prefix
            ? absl::string_view(right).substr(prefix.size())
            : absl::string_view(right);
    std::optional<int32_t> merged = bpe->JsonSpaceId(absl::StrCat(left, right_tail));
    if (!a.has_value() || !b.has_value() || !merged.has_value()) {
      return absl::InvalidArgumentError(absl::StrCat("model BPE: merge ", rank, " ('", left, "', '",
                                                     right,
                                                     "') names a token that is not in the vocab"));
    }
    bpe->merges_.insert_or_assign((static_cast<uint64_t>(*a) << 32) | static_cast<uint32_t>(*b),
                                  Merge{static_cast<int32_t>(rank), *merged});
  }

  bpe->fast_bytes_ = options.byte_level && bpe->prefix_.empty() && bpe->suffix_.empty();
  for (int b = 0; b < 256; ++b) {
    std::optional<int32_t> id =
        options.byte_level ? bpe->ModelSpaceId(std::string(1, static_cast<char>(b))) : std::nullopt;
    bpe->byte_ids_[b] = id.value_or(-1);
    if (!id.has_value()) bpe->fast_bytes_ = false;
  }
  bpe->cache_shard_capacity_ = options.cache_capacity / kCacheShards;
  return bpe;
}

std::optional<int32_t> BpeModel::ModelSpaceId(absl::string_view key) const {
  auto it = vocab_.find(key);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

std::optional<int32_t> BpeModel::JsonSpaceId(absl::string_view token) const {
  if (!options_.byte_level) return ModelSpaceId(token);
  std::optional<std::string> bytes = ByteLevelToBytes(token);
  if (bytes.has_value()) return ModelSpaceId(*bytes);
  auto it = unconvertible_.find(token);
  if (it == unconvertible_.end()) return std::nullopt;
  return it->second;
}

std::optional<int32_t> BpeModel::TokenToId(absl::string_view token) const {
  return JsonSpaceId(token);
}

const std::string* BpeModel::IdToToken(int32_t id) const {
  if (id < 0 || id >= id_limit() || !id_used_[id]) return nullptr;
  return &id_to_token_[id];
}

void BpeModel::InitialSymbols(absl::string_view word, Symbols* symbols) const {
  if (fast_bytes_) {
    for (unsigned char b : word) symbols->push_back(byte_ids_[b]);
    return;
  }
  // The general path of Hugging Face's BPE::merge_word: one unit per character (per byte in
  // byte-level mode), with prefix / suffix, byte fallback and unknown-token handling.
  std::optional<std::pair<int32_t, size_t>> pending_unk;
  std::string key;
  size_t pos = 0;
  while (pos < word.size()) {
    const size_t begin = pos;
    if (options_.byte_level) {
      ++pos;
    } else {
      NextCodePoint(word, &pos);
    }
    const absl::string_view unit = word.substr(begin, pos - begin);
    key.clear();
    if (begin != 0) key += prefix_;
    key.append(unit.data(), unit.size());
    if (pos == word.size()) key += suffix_;
    std::optional<int32_t> id = ModelSpaceId(key);
    if (id.has_value()) {
      if (pending_unk.has_value()) symbols->push_back(pending_unk->first);
      pending_unk.reset();
      symbols->push_back(*id);
      continue;
    }
    if (byte_fallback_) {
      const std::string spelled = options_.byte_level ? BytesToByteLevel(key) : key;
      Symbols bytes;
      bool all = true;
      for (unsigned char b : spelled) {
        char name[8];
        std::snprintf(name, sizeof(name), "<0x%02X>", b);
        std::optional<int32_t> byte_id = JsonSpaceId(name);
        if (!byte_id.has_value()) {
          all = false;
          break;
        }
        bytes.push_back(*byte_id);
      }
      if (all) {
        symbols->insert(symbols->end(), bytes.begin(), bytes.end());
        continue;
      }
    }
    if (unk_id_.has_value()) {
      if (pending_unk.has_value() && !fuse_unk_) symbols->push_back(pending_unk->first);
      if (!pending_unk.has_value() || !fuse_unk_) pending_unk.emplace(*unk_id_, unit.size());
    }
  }
  if (pending_unk.has_value()) symbols->push_back(pending_unk->first);
}

void BpeModel::MergeSmall(Symbols* symbols) const {
  Symbols& s = *symbols;
  // ranks[i] / ids[i]: the merge of s[i] and s[i+1], INT_MAX when none.
  absl::InlinedVector<int32_t, 32> ranks(s.size() > 0 ? s.size() - 1 : 0);
  absl::InlinedVector<int32_t, 32> ids(ranks.size());
  auto refresh = [&](size_t i) {
    const Merge* m = FindMerge(s[i], s[i + 1]);
    ranks[i] = m ? m->rank : INT_MAX;
    ids[i] = m ? m->id : -1;
  };
  for (size_t i = 0; i < ranks.size(); ++i) refresh(i);
  while (!ranks.empty()) {
    size_t best = 0;
    for (size_t i = 1; i < ranks.size(); ++i) {
      if (ranks[i] < ranks[best]) best = i;
    }
    if (ranks[best] == INT_MAX) break;
    s[best] = ids[best];
    s.erase(s.begin() + best + 1);
    ranks.erase(ranks.begin() + best);
    ids.erase(ids.begin() + best);
    if (best < ranks.size()) refresh(best);
    if (best > 0) refresh(best - 1);
  }
}

void BpeModel::MergeLarge(Symbols* symbols) const {
  // Hugging Face's Word::merge_all: a linked list of symbols and a min-heap of candidate merges
  // ordered by (rank, position); stale candidates are skipped when popped.
  struct Node {
    int32_t id;
    int32_t prev;
    int32_t next;
    bool alive;
  };
  struct Candidate {
    int32_t rank;
    int32_t pos;
    int32_t new_id;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  const int32_t n = static_cast<int32_t>(symbols->size());
  std::vector<Node> nodes(n);
  for (int32_t i = 0; i < n; ++i) nodes[i] = {(*symbols)[i], i - 1, i + 1 < n ? i + 1 : -1, true};
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> heap;
  for (int32_t i = 0; i + 1 < n; ++i) {
    if (const Merge* m = FindMerge(nodes[i].id, nodes[i + 1].id)) heap.push({m->rank, i, m->id});
  }
  while (!heap.empty()) {
    const Candidate top = heap.top();
    heap.pop();
    Node& left = nodes[top.pos];
    if (!left.alive || left.next < 0) continue;
    Node& right = nodes[left.next];
    const Merge* m = FindMerge(left.id, right.id);
    if (m == nullptr || m->id != top.new_id) continue;
    left.id = top.new_id;
    right.alive = false;
    left.next = right.next;
    if (right.next >= 0) nodes[right.next].prev = top.pos;
    if (left.prev >= 0) {
      if (const Merge* pm = FindMerge(nodes[left.prev].id, left.id)) {
        heap.push({pm->rank, left.prev, pm->id});
      }
    }
    if (left.next >= 0) {
      if (const Merge* nm = FindMerge(left.id, nodes[left.next].id)) {
        heap.push({nm->rank, top.pos, nm->id});
      }
    }
  }
  symbols->clear();
  for (int32_t i = 0; i >= 0 && i < n; i = nodes[i].next) symbols->push_back(nodes[i].id);
}

void BpeModel::Encode(absl::string_view word, std::vector<int32_t>* out) const {
  if (word.empty()) return;
  if (fast_bytes_ && word.size() == 1) {
    out->push_back(byte_ids_[static_cast<unsigned char>(word[0])]);
    return;
  }
  const HashedKey key{word, absl::HashOf(word)};
  const bool cacheable = cache_shard_capacity_ > 0 && word.size() <= kMaxCachedWordBytes;
  CacheShard& shard = cache_[(key.hash >> 7) % kCacheShards];
  if (cacheable) {
    std::lock_guard<std::mutex> lock(shard.mu);
    auto it = shard.map.find(key);
    if (it != shard.map.end()) {
      out->insert(out->end(), it->second.begin(), it->second.end());
      return;
    }
  }
  Symbols symbols;
  // ignore_merges: a word that is itself in the vocab is that one token.
  auto whole = ignore_merges_ ? vocab_.find(key) : vocab_.end();
  if (whole != vocab_.end()) {
    symbols.push_back(whole->second);
  } else {
    InitialSymbols(word, &symbols);
    if (symbols.size() <= kSmallWordSymbols) {
      MergeSmall(&symbols);
    } else {
      MergeLarge(&symbols);
    }
  }
  out->insert(out->end(), symbols.begin(), symbols.end());
  if (cacheable) {
    std::lock_guard<std::mutex> lock(shard.mu);
    // Bounded: a full shard starts over rather than tracking recency.
    if (shard.map.size() >= cache_shard_capacity_ ||
        shard.key_bytes + word.size() > kCacheShardBytes) {
      shard.map.clear();
      shard.key_bytes = 0;
    }
    if (shard.map.try_emplace(word, symbols.begin(), symbols.end()).second) {
      shard.key_bytes += word.size();
    }
  }
}

}  // namespace ringserve::tokenizer_internal
