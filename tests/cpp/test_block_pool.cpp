// Tests of BlockPool and FreeBlockQueue: ref counts, eviction order, cached-block map.
#include <gtest/gtest.h>

#include "corellm/block_pool.h"
#include "corellm/check.h"

using namespace corellm;

static BlockHash hash_of(uint8_t x) {
  BlockHash h;
  h.bytes.fill(x);
  return h;
}

TEST(FreeBlockQueue, PushPopRemoveKeepOrder) {
  std::vector<KVBlock> blocks(5);
  FreeBlockQueue q;
  for (int i = 0; i < 5; ++i) {
    blocks[i].block_id = i;
    q.push_back(&blocks[i]);
  }
  EXPECT_EQ(q.size(), 5u);
  q.remove(&blocks[2]);  // O(1) removal from the middle
  EXPECT_EQ(q.block_ids(), (std::vector<int32_t>{0, 1, 3, 4}));
  EXPECT_FALSE(q.contains(&blocks[2]));
  EXPECT_EQ(q.pop_front()->block_id, 0);
  q.push_back(&blocks[2]);
  EXPECT_EQ(q.block_ids(), (std::vector<int32_t>{1, 3, 4, 2}));
  q.remove(&blocks[2]);  // the tail
  q.remove(&blocks[1]);  // the head
  EXPECT_EQ(q.block_ids(), (std::vector<int32_t>{3, 4}));
}

TEST(BlockPool, AllocateAndFreeWithRefCounts) {
  BlockPool pool(4, true);
  std::vector<int32_t> got;
  ASSERT_TRUE(pool.get_new_blocks(3, got));
  EXPECT_EQ(got, (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(pool.num_free_blocks(), 1);
  EXPECT_DOUBLE_EQ(pool.usage(), 0.75);
  // Not enough blocks: nothing changes.
  std::vector<int32_t> more;
  EXPECT_FALSE(pool.get_new_blocks(2, more));
  EXPECT_TRUE(more.empty());
  EXPECT_EQ(pool.num_free_blocks(), 1);

  pool.touch(got.data(), 1);  // block 0 now has two owners
  EXPECT_EQ(pool.block(0).ref_cnt, 2);
  std::vector<int32_t> reversed{2, 1, 0};
  pool.free_blocks(reversed.data(), reversed.size());
  EXPECT_EQ(pool.block(0).ref_cnt, 1);
  EXPECT_EQ(pool.num_free_blocks(), 3);
  pool.check_integrity({1, 0, 0, 0});
}

TEST(BlockPool, EvictionOrderIsLruTailFirst) {
  BlockPool pool(4, true);
  std::vector<int32_t> a;
  ASSERT_TRUE(pool.get_new_blocks(4, a));
  // A request frees its chain tail first: 3, 2, then later another frees 1, 0.
  std::vector<int32_t> first{3, 2};
  pool.free_blocks(first.data(), first.size());
  std::vector<int32_t> second{1, 0};
  pool.free_blocks(second.data(), second.size());
  std::vector<int32_t> got;
  ASSERT_TRUE(pool.get_new_blocks(4, got));
  EXPECT_EQ(got, (std::vector<int32_t>{3, 2, 1, 0}));
}

TEST(BlockPool, CachedBlockFoundAndTouchedOutOfFreeQueue) {
  BlockPool pool(3, true);
  std::vector<int32_t> got;
  ASSERT_TRUE(pool.get_new_blocks(2, got));
  pool.cache_block(0, hash_of(7));
  pool.free_blocks(got.data(), got.size());
  ASSERT_EQ(pool.get_cached_block(hash_of(7)), std::optional<int32_t>(0));
  // A prefix hit on the free cached block takes it out of the free queue in O(1).
  int32_t hit = 0;
  pool.touch(&hit, 1);
  EXPECT_EQ(pool.block(0).ref_cnt, 1);
  EXPECT_EQ(pool.num_free_blocks(), 2);
  pool.check_integrity({1, 0, 0});
}

TEST(BlockPool, ReusingAFreeCachedBlockEvictsItsHash) {
  BlockPool pool(1, true);
  std::vector<int32_t> got;
  ASSERT_TRUE(pool.get_new_blocks(1, got));
  pool.cache_block(0, hash_of(1));
  pool.free_blocks(got.data(), 1);
  got.clear();
  ASSERT_TRUE(pool.get_new_blocks(1, got));
  EXPECT_FALSE(pool.get_cached_block(hash_of(1)).has_value());
  EXPECT_FALSE(pool.block(0).has_hash);
}

TEST(BlockPool, DuplicateHashKeepsFirstCopy) {
  BlockPool pool(2, true);
  std::vector<int32_t> got;
  ASSERT_TRUE(pool.get_new_blocks(2, got));
  pool.cache_block(0, hash_of(5));
  pool.cache_block(1, hash_of(5));
  EXPECT_EQ(pool.get_cached_block(hash_of(5)), std::optional<int32_t>(0));
  EXPECT_FALSE(pool.block(1).has_hash);
  pool.check_integrity({1, 1});
}

TEST(BlockPool, ResetPrefixCacheOnlyWhenIdle) {
  BlockPool pool(2, true);
  std::vector<int32_t> got;
  ASSERT_TRUE(pool.get_new_blocks(1, got));
  pool.cache_block(0, hash_of(9));
  EXPECT_FALSE(pool.reset_prefix_cache());
  pool.free_blocks(got.data(), 1);
  EXPECT_TRUE(pool.reset_prefix_cache());
  EXPECT_FALSE(pool.get_cached_block(hash_of(9)).has_value());
}

TEST(BlockPool, InvalidInputAndBrokenInvariants) {
  EXPECT_THROW(BlockPool(0, true), InvalidArgument);
  BlockPool pool(2, true);
  EXPECT_THROW(pool.block(5), InvalidArgument);
  int32_t b = 0;
  EXPECT_THROW(pool.free_blocks(&b, 1), InternalError);  // ref count already 0
  EXPECT_THROW(pool.check_integrity({1, 0}), InternalError);
}
