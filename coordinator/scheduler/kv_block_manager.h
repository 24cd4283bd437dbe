// The coordinator's global view of the paged KV cache. Every stage has a pool of the same number
// of blocks (capacity = min over stages); a block id names the same block on every stage, so one
// allocation serves the whole ring. No prefix caching, hence no reference counts: a block has at
// most one owner.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "absl/status/status.h"

namespace ringserve {

// Not thread-safe; owned by the Scheduler.
class KvBlockManager {
 public:
  // `num_blocks` >= 0 blocks of `block_size` >= 1 positions each, ids [0, num_blocks).
  KvBlockManager(int num_blocks, int block_size);

  int num_blocks() const { return num_blocks_; }
  int block_size() const { return block_size_; }
  int num_free() const { return static_cast<int>(free_.size()); }
  int num_used() const { return num_blocks_ - num_free(); }

  // Blocks needed to hold `num_positions` positions.
  int BlocksFor(int64_t num_positions) const;

  // Takes `count` free blocks, or nothing (nullopt) when fewer are free. The lowest ids are
  // handed out first after a fresh start; afterwards the most recently freed come first.
  std::optional<std::vector<int32_t>> Allocate(int count);

  // Returns blocks to the pool. Freeing a block that is not allocated (double free, foreign
  // id) is a programmer error and aborts.
  void Free(std::span<const int32_t> blocks);

  bool IsAllocated(int32_t block) const;

 private:
  int num_blocks_;
  int block_size_;
  std::vector<int32_t> free_;    // a stack: back() is handed out next
  std::vector<uint8_t> in_use_;  // per block id
};

}  // namespace ringserve
