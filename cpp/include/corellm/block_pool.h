// BlockPool: every KV block, their reference counts, the free queue (eviction order) and the
// map from prefix hash to cached block.
#pragma once

#include <cstdint>
#include <optional>
#include <unordered_map>
#include <vector>

#include "corellm/prefix_hash.h"

namespace corellm {

// One KV block: `block_size` token slots in every layer's K and V cache.
struct KVBlock {
  int32_t block_id = -1;
  int32_t ref_cnt = 0;  // number of requests whose block table holds this block
  bool has_hash = false;
  BlockHash hash;  // valid when has_hash: the block is full and findable by prefix lookups
  // Intrusive links of the free queue; both null when the block is not in the queue.
  KVBlock* prev_free = nullptr;
  KVBlock* next_free = nullptr;
};

// Doubly-linked list of the blocks with ref_cnt == 0, threaded through the blocks themselves,
// with head and tail sentinels. The head is evicted first. O(1) push, pop and removal from the
// middle (a prefix hit on a free cached block takes it out of the queue).
class FreeBlockQueue {
 public:
  FreeBlockQueue();
  FreeBlockQueue(const FreeBlockQueue&) = delete;
  FreeBlockQueue& operator=(const FreeBlockQueue&) = delete;

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  bool contains(const KVBlock* block) const { return block->next_free != nullptr; }
  void push_back(KVBlock* block);
  KVBlock* pop_front();  // requires !empty()
  void remove(KVBlock* block);
  // Blocks from head to tail (tests and integrity checks).
  std::vector<int32_t> block_ids() const;

 private:
  KVBlock head_;  // sentinel: head_.next_free is the first block
  KVBlock tail_;  // sentinel: tail_.prev_free is the last block
  size_t size_ = 0;
};

class BlockPool {
 public:
  BlockPool(int32_t num_blocks, bool enable_caching);
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  int32_t num_blocks() const { return static_cast<int32_t>(blocks_.size()); }
  int32_t num_free_blocks() const { return static_cast<int32_t>(free_queue_.size()); }
  bool enable_caching() const { return enable_caching_; }
  // Fraction of blocks held by requests, in [0, 1].
  double usage() const;
  const KVBlock& block(int32_t block_id) const;

  // Takes `n` blocks from the head of the free queue (evicting their cached hashes), sets their
  // ref count to 1 and appends their ids to `out`. Returns false, changing nothing, when fewer
  // than `n` blocks are free.
  bool get_new_blocks(int32_t n, std::vector<int32_t>& out);

  // The cached block holding this prefix hash, if any (it may be in use or free).
  std::optional<int32_t> get_cached_block(const BlockHash& hash) const;

  // A request takes a reference to blocks it found in the prefix cache: ref_cnt += 1, and a block
  // that was free leaves the free queue.
  void touch(const int32_t* block_ids, size_t n);

  // A request drops its references. Pass the blocks in eviction order (a request's blocks
  // reversed: the tail of a chain is the least likely to be shared, so it is evicted first).
  // Blocks whose ref count reaches 0 go to the tail of the free queue, keeping their hash.
  void free_blocks(const int32_t* block_ids, size_t n);

  // Marks a full block as holding the given prefix hash. If another block already holds that
  // hash (two requests computed the same prefix concurrently) the first one stays the cached
  // copy and this block remains un-hashed.
  void cache_block(int32_t block_id, const BlockHash& hash);

  // Forgets every cached hash. Only possible when no block is in use; returns false otherwise.
  bool reset_prefix_cache();

  // Free queue size == number of blocks with ref_cnt 0, every free block is in the queue once,
  // the hash map points only at blocks that carry that hash. `expected_ref_cnt[b]` is the number
  // of owners the caller counted for block b (empty vector: skip that comparison).
  void check_integrity(const std::vector<int32_t>& expected_ref_cnt) const;

 private:
  KVBlock& mutable_block(int32_t block_id);
  void evict_hash(KVBlock& block);

  bool enable_caching_;
  std::vector<KVBlock> blocks_;
  FreeBlockQueue free_queue_;
  std::unordered_map<BlockHash, int32_t, BlockHashHasher> cached_blocks_;
};

}  // namespace corellm
