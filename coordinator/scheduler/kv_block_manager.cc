#include "coordinator/scheduler/kv_block_manager.h"

#include <algorithm>
#include <cstdlib>

#include "fmt/format.h"

namespace ringserve {
namespace {

uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

uint64_t PrefixHash(uint64_t parent, std::span<const int32_t> tokens) {
  uint64_t h = Mix(parent ^ 0x2545f4914f6cdd1dull);
  for (int32_t t : tokens) h = Mix(h ^ static_cast<uint32_t>(t));
  return Mix(h ^ tokens.size());
}

KvBlockManager::KvBlockManager(int num_blocks, int block_size)
    : num_blocks_(num_blocks),
      block_size_(block_size),
      holders_(std::max(num_blocks, 0), 0),
      hash_of_(std::max(num_blocks, 0)),
      evictable_pos_(std::max(num_blocks, 0)) {
  if (num_blocks < 0 || block_size < 1) {
    fmt::print(stderr, "KvBlockManager: bad num_blocks {} / block_size {}\n", num_blocks,
               block_size);
    std::abort();
  }
  free_.reserve(num_blocks);
  for (int id = num_blocks - 1; id >= 0; --id) free_.push_back(id);
}

int KvBlockManager::BlocksFor(int64_t num_positions) const {
  if (num_positions <= 0) return 0;
  return static_cast<int>((num_positions + block_size_ - 1) / block_size_);
}

std::optional<std::vector<int32_t>> KvBlockManager::Allocate(int count) {
  if (count < 0 || count > num_free()) return std::nullopt;
  std::vector<int32_t> blocks;
  blocks.reserve(count);
  while (static_cast<int>(blocks.size()) < count && !free_.empty()) {
    blocks.push_back(free_.back());
    free_.pop_back();
  }
  while (static_cast<int>(blocks.size()) < count) {
    const int32_t id = evictable_.front();
    evictable_.pop_front();
    Unregister(id);
    blocks.push_back(id);
  }
  for (int32_t id : blocks) holders_[id] = 1;
  return blocks;
}

void KvBlockManager::Free(std::span<const int32_t> blocks) {
  for (int32_t id : blocks) {
    if (id < 0 || id >= num_blocks_ || holders_[id] == 0) {
      fmt::print(stderr, "KvBlockManager: freeing block {} that is not allocated\n", id);
      std::abort();
    }
    if (--holders_[id] > 0) continue;
    if (hash_of_[id].has_value()) {
      evictable_.push_back(id);
      evictable_pos_[id] = std::prev(evictable_.end());
    } else {
      free_.push_back(id);
    }
  }
}

bool KvBlockManager::Register(int32_t block, uint64_t parent, std::span<const int32_t> tokens) {
  if (!IsAllocated(block) || hash_of_[block].has_value()) return false;
  const uint64_t hash = PrefixHash(parent, tokens);
  if (cache_.count(hash)) return false;
  cache_.emplace(hash, CacheEntry{.block = block,
                                  .parent = parent,
                                  .tokens = std::vector<int32_t>(tokens.begin(), tokens.end())});
  hash_of_[block] = hash;
  return true;
}

std::optional<int32_t> KvBlockManager::Lookup(uint64_t parent, std::span<const int32_t> tokens) {
  auto it = cache_.find(PrefixHash(parent, tokens));
  if (it == cache_.end()) return std::nullopt;
  const CacheEntry& entry = it->second;
  if (entry.parent != parent ||
      !std::equal(tokens.begin(), tokens.end(), entry.tokens.begin(), entry.tokens.end())) {
    return std::nullopt;  // a hash collision: treat as a miss
  }
  const int32_t id = entry.block;
  if (holders_[id]++ == 0) evictable_.erase(evictable_pos_[id]);
  return id;
}

void KvBlockManager::Unregister(int32_t block) {
  if (!hash_of_[block].has_value()) return;
  cache_.erase(*hash_of_[block]);
  hash_of_[block].reset();
}

bool KvBlockManager::IsAllocated(int32_t block) const {
  return block >= 0 && block < num_blocks_ && holders_[block] != 0;
}

int KvBlockManager::holders(int32_t block) const {
  return block >= 0 && block < num_blocks_ ? holders_[block] : 0;
}

}  // namespace ringserve
