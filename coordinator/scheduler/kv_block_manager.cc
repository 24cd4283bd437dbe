#include "coordinator/scheduler/kv_block_manager.h"

#include <algorithm>
#include <cstdlib>

#include "fmt/format.h"

namespace ringserve {

KvBlockManager::KvBlockManager(int num_blocks, int block_size)
    : num_blocks_(num_blocks), block_size_(block_size), in_use_(num_blocks, 0) {
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
  std::vector<int32_t> blocks(free_.end() - count, free_.end());
  free_.resize(free_.size() - count);
  // Hand them out in the order they would have been popped one by one.
  std::reverse(blocks.begin(), blocks.end());
  for (int32_t id : blocks) in_use_[id] = 1;
  return blocks;
}

void KvBlockManager::Free(std::span<const int32_t> blocks) {
  for (int32_t id : blocks) {
    if (id < 0 || id >= num_blocks_ || !in_use_[id]) {
      fmt::print(stderr, "KvBlockManager: freeing block {} that is not allocated\n", id);
      std::abort();
    }
    in_use_[id] = 0;
    free_.push_back(id);
  }
}

bool KvBlockManager::IsAllocated(int32_t block) const {
  return block >= 0 && block < num_blocks_ && in_use_[block] != 0;
}

}  // namespace ringserve
