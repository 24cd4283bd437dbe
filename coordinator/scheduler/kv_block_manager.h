// The coordinator's global view of the paged KV cache. Every stage has a pool of the same number
// of blocks (capacity = min over stages); a block id names the same block on every stage, so one
// allocation serves the whole ring.
//
// Prefix caching: a block whose positions are all computed can be registered under the hash
// chain of its tokens (PrefixHash: the previous block's hash and this block's tokens). Blocks
// are reference counted; a registered block whose last holder releases it is not freed but
// kept, least recently released first to be evicted, so a later sequence with the same prefix
// can take it again (Lookup) and skip computing it. Stages only store: they never know.
//
// Not thread-safe; owned by the Scheduler.
#pragma once

#include <cstdint>
#include <list>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"

namespace ringserve {

// The chain hash of a full block: of its predecessor's hash (kPrefixRoot for the first block)
// and its tokens.
inline constexpr uint64_t kPrefixRoot = 0x9e3779b97f4a7c15ull;
uint64_t PrefixHash(uint64_t parent, std::span<const int32_t> tokens);

class KvBlockManager {
 public:
  // `num_blocks` >= 0 blocks of `block_size` >= 1 positions each, ids [0, num_blocks).
  KvBlockManager(int num_blocks, int block_size);

  int num_blocks() const { return num_blocks_; }
  int block_size() const { return block_size_; }
  // Blocks Allocate can hand out: free ones plus cached ones nobody holds (evictable).
  int num_free() const { return static_cast<int>(free_.size() + evictable_.size()); }
  // Blocks some sequence holds.
  int num_used() const { return num_blocks_ - num_free(); }
  // Cached blocks nobody holds.
  int num_cached_idle() const { return static_cast<int>(evictable_.size()); }

  // Blocks needed to hold `num_positions` positions.
  int BlocksFor(int64_t num_positions) const;

  // Takes `count` blocks (each with one holder), or nothing (nullopt) when fewer are available.
  // Free blocks first (the lowest ids after a fresh start, then the most recently freed), then
  // cached idle blocks, least recently released first (their cache entries are dropped).
  std::optional<std::vector<int32_t>> Allocate(int count);

  // Drops one holder of each block. A block without holders returns to the pool, or, when it
  // is registered, waits as cached idle. Releasing a block nobody holds (double free, foreign
  // id) is a programmer error and aborts.
  void Free(std::span<const int32_t> blocks);

  // Registers held block `block` as holding the full block of tokens `tokens` after the chain
  // `parent` (hash = PrefixHash(parent, tokens)). False (nothing changes) when that hash already
  // names another block (two sequences computed the same prefix at once) or `block` is already
  // registered.
  bool Register(int32_t block, uint64_t parent, std::span<const int32_t> tokens);

  // The registered block for `tokens` after chain `parent` (exact match, not just the hash),
  // with one more holder; nullopt when none.
  std::optional<int32_t> Lookup(uint64_t parent, std::span<const int32_t> tokens);

  bool IsAllocated(int32_t block) const;
  int holders(int32_t block) const;

 private:
  struct CacheEntry {
    int32_t block = 0;
    uint64_t parent = 0;
    std::vector<int32_t> tokens;
  };
  void Unregister(int32_t block);

  int num_blocks_;
  int block_size_;
  std::vector<int32_t> free_;                       // a stack: back() is handed out next
  std::vector<int> holders_;                        // per block id
  std::unordered_map<uint64_t, CacheEntry> cache_;  // by chain hash
  std::vector<std::optional<uint64_t>> hash_of_;    // per block id: its cache key
  std::list<int32_t> evictable_;                    // cached idle, least recently released first
  std::vector<std::list<int32_t>::iterator> evictable_pos_;  // per block id, when evictable
};

}  // namespace ringserve
