// BlockPool and its intrusive free queue.
#include "corellm/block_pool.h"

#include "corellm/check.h"

namespace corellm {

// ---------------------------------------------------------------- FreeBlockQueue

FreeBlockQueue::FreeBlockQueue() {
  head_.next_free = &tail_;
  tail_.prev_free = &head_;
}

void FreeBlockQueue::push_back(KVBlock* block) {
  CORELLM_DCHECK(!contains(block), "block ", block->block_id, " is already free");
  KVBlock* last = tail_.prev_free;
  last->next_free = block;
  block->prev_free = last;
  block->next_free = &tail_;
  tail_.prev_free = block;
  ++size_;
}

KVBlock* FreeBlockQueue::pop_front() {
  CORELLM_CHECK(size_ > 0, "pop from an empty free queue");
  KVBlock* block = head_.next_free;
  remove(block);
  return block;
}

void FreeBlockQueue::remove(KVBlock* block) {
  CORELLM_CHECK(contains(block), "block ", block->block_id, " is not in the free queue");
  block->prev_free->next_free = block->next_free;
  block->next_free->prev_free = block->prev_free;
  block->prev_free = nullptr;
  block->next_free = nullptr;
  --size_;
}

std::vector<int32_t> FreeBlockQueue::block_ids() const {
  std::vector<int32_t> ids;
  ids.reserve(size_);
  for (const KVBlock* b = head_.next_free; b != &tail_; b = b->next_free) ids.push_back(b->block_id);
  return ids;
}

// ---------------------------------------------------------------- BlockPool

BlockPool::BlockPool(int32_t num_blocks, bool enable_caching)
    : enable_caching_(enable_caching), blocks_(static_cast<size_t>(num_blocks > 0 ? num_blocks : 0)) {
  CORELLM_CHECK_ARG(num_blocks > 0, "num_blocks must be > 0, got ", num_blocks);
  // blocks_ never grows after this point: the free queue points into it.
  if (enable_caching_) cached_blocks_.reserve(static_cast<size_t>(num_blocks));
  for (int32_t i = 0; i < num_blocks; ++i) {
    blocks_[static_cast<size_t>(i)].block_id = i;
    free_queue_.push_back(&blocks_[static_cast<size_t>(i)]);
  }
}

double BlockPool::usage() const {
  return 1.0 - static_cast<double>(free_queue_.size()) / static_cast<double>(blocks_.size());
}

const KVBlock& BlockPool::block(int32_t block_id) const {
  CORELLM_CHECK_ARG(block_id >= 0 && block_id < num_blocks(), "block id ", block_id,
                    " out of range [0, ", num_blocks(), ")");
  return blocks_[static_cast<size_t>(block_id)];
}

KVBlock& BlockPool::mutable_block(int32_t block_id) {
  CORELLM_CHECK(block_id >= 0 && block_id < num_blocks(), "block id ", block_id, " out of range");
  return blocks_[static_cast<size_t>(block_id)];
}

void BlockPool::evict_hash(KVBlock& block) {
  if (!block.has_hash) return;
  auto it = cached_blocks_.find(block.hash);
  if (it != cached_blocks_.end() && it->second == block.block_id) cached_blocks_.erase(it);
  block.has_hash = false;
}

bool BlockPool::get_new_blocks(int32_t n, std::vector<int32_t>& out) {
  CORELLM_CHECK(n >= 0, "negative block count ", n);
  if (static_cast<size_t>(n) > free_queue_.size()) return false;
  for (int32_t i = 0; i < n; ++i) {
    KVBlock* block = free_queue_.pop_front();
    CORELLM_DCHECK(block->ref_cnt == 0, "free block ", block->block_id, " has refs");
    evict_hash(*block);
    block->ref_cnt = 1;
    out.push_back(block->block_id);
  }
  return true;
}

std::optional<int32_t> BlockPool::get_cached_block(const BlockHash& hash) const {
  auto it = cached_blocks_.find(hash);
  if (it == cached_blocks_.end()) return std::nullopt;
  return it->second;
}

void BlockPool::touch(const int32_t* block_ids, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    KVBlock& block = mutable_block(block_ids[i]);
    if (block.ref_cnt == 0) free_queue_.remove(&block);
    ++block.ref_cnt;
  }
}

void BlockPool::free_blocks(const int32_t* block_ids, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    KVBlock& block = mutable_block(block_ids[i]);
    CORELLM_CHECK(block.ref_cnt > 0, "freeing block ", block.block_id, " with ref count 0");
    if (--block.ref_cnt == 0) free_queue_.push_back(&block);
  }
}

void BlockPool::cache_block(int32_t block_id, const BlockHash& hash) {
  if (!enable_caching_) return;
  KVBlock& block = mutable_block(block_id);
  CORELLM_CHECK(!block.has_hash || block.hash == hash, "block ", block_id,
                " re-cached under a different hash");
  if (block.has_hash) return;
  auto inserted = cached_blocks_.emplace(hash, block_id);
  if (inserted.second) {
    block.has_hash = true;
    block.hash = hash;
  }
}

bool BlockPool::reset_prefix_cache() {
  if (free_queue_.size() != blocks_.size()) return false;
  cached_blocks_.clear();
  for (KVBlock& block : blocks_) block.has_hash = false;
  return true;
}

void BlockPool::check_integrity(const std::vector<int32_t>& expected_ref_cnt) const {
  size_t num_zero_ref = 0;
  for (const KVBlock& block : blocks_) {
    CORELLM_CHECK(block.ref_cnt >= 0, "block ", block.block_id, " has negative ref count");
    const bool in_queue = free_queue_.contains(&block);
    CORELLM_CHECK(in_queue == (block.ref_cnt == 0), "block ", block.block_id, " ref_cnt ",
                  block.ref_cnt, (in_queue ? " is" : " is not"), " in the free queue");
    if (block.ref_cnt == 0) ++num_zero_ref;
    if (!expected_ref_cnt.empty()) {
      CORELLM_CHECK(expected_ref_cnt[static_cast<size_t>(block.block_id)] == block.ref_cnt,
                    "block ", block.block_id, " has ref count ", block.ref_cnt, " but ",
                    expected_ref_cnt[static_cast<size_t>(block.block_id)], " owners");
    }
    if (block.has_hash) {
      auto it = cached_blocks_.find(block.hash);
      CORELLM_CHECK(it != cached_blocks_.end() && it->second == block.block_id, "block ",
                    block.block_id, " carries a hash the cache map does not point back from");
    }
  }
  CORELLM_CHECK(num_zero_ref == free_queue_.size(), "free queue holds ", free_queue_.size(),
                " blocks but ", num_zero_ref, " have ref count 0");
  CORELLM_CHECK(free_queue_.block_ids().size() == free_queue_.size(), "free queue links broken");
  for (const auto& entry : cached_blocks_) {
    const KVBlock& block = blocks_[static_cast<size_t>(entry.second)];
    CORELLM_CHECK(block.has_hash && block.hash == entry.first, "cache map entry for block ",
                  entry.second, " does not match the block's hash");
  }
}

}  // namespace corellm
