// Tests of KVCacheManager: prefix lookups, allocate_slots layout and exhaustion, freeing.
#include <gtest/gtest.h>

#include <numeric>

#include "corellm/check.h"
#include "corellm/kv_cache_manager.h"

using namespace corellm;

static Request make_request(const std::string& id, int32_t num_tokens, int32_t first = 0) {
  Request r;
  r.request_id = std::make_shared<const std::string>(id);
  r.token_ids.resize(static_cast<size_t>(num_tokens));
  std::iota(r.token_ids.begin(), r.token_ids.end(), first);
  r.num_prompt_tokens = num_tokens;
  return r;
}

static std::shared_ptr<const PrefixHasher> fixed_hasher() {
  return std::make_shared<const PrefixHasher>(BlockHash{});
}

TEST(KVCacheManager, AllocatesCeilOfTokensOverBlockSize) {
  KVCacheManager kv(10, 4, true, fixed_hasher());
  Request r = make_request("a", 10);
  std::vector<int32_t> fresh;
  ASSERT_TRUE(kv.allocate_slots(r, 10, nullptr, 0, &fresh));
  EXPECT_EQ(r.block_ids.size(), 3u);
  EXPECT_EQ(fresh, r.block_ids);
  // Lookahead slots need one more block; decode of token 10 fits the third block.
  r.num_computed_tokens = 10;
  r.token_ids.push_back(99);
  fresh.clear();
  ASSERT_TRUE(kv.allocate_slots(r, 1, nullptr, 2, &fresh));
  EXPECT_EQ(r.block_ids.size(), 4u);  // ceil((10 + 1 + 2) / 4)
  EXPECT_EQ(fresh.size(), 1u);
  kv.check_integrity({&r});
}

TEST(KVCacheManager, ReturnsFalseAndChangesNothingWhenShort) {
  KVCacheManager kv(2, 4, true, fixed_hasher());
  Request r = make_request("a", 12);
  EXPECT_FALSE(kv.allocate_slots(r, 12));
  EXPECT_TRUE(r.block_ids.empty());
  EXPECT_EQ(kv.num_free_blocks(), 2);
}

TEST(KVCacheManager, AllocatedBlocksAreFindableOnlyOnceCached) {
  KVCacheManager kv(16, 4, true, fixed_hasher());
  Request a = make_request("a", 12);
  ASSERT_TRUE(kv.allocate_slots(a, 12));  // the step that writes their KV has not run yet
  Request b = make_request("b", 12);
  EXPECT_EQ(kv.get_computed_blocks(b).num_computed_tokens, 0);
  a.num_computed_tokens = 12;
  kv.cache_full_blocks(a, 12);  // the step succeeded
  EXPECT_EQ(kv.get_computed_blocks(b).num_computed_tokens, 8);
  kv.free(a);  // a failed request's blocks, never cached, leave nothing findable
  Request c = make_request("c", 9, 100);
  ASSERT_TRUE(kv.allocate_slots(c, 9));
  kv.free(c);
  Request d = make_request("d", 9, 100);
  EXPECT_EQ(kv.get_computed_blocks(d).num_computed_tokens, 0);
}

TEST(KVCacheManager, PrefixHitCoversFullBlocksButNeverTheWholePrompt) {
  KVCacheManager kv(16, 4, true, fixed_hasher());
  Request a = make_request("a", 12);
  ASSERT_TRUE(kv.allocate_slots(a, 12));
  a.num_computed_tokens = 12;
  kv.cache_full_blocks(a, 12);

  // Same 12 tokens: 3 full blocks cached, but the last token must be recomputed -> 2 blocks hit.
  Request b = make_request("b", 12);
  ComputedBlocks hit = kv.get_computed_blocks(b);
  EXPECT_EQ(hit.num_computed_tokens, 8);
  EXPECT_EQ(hit.block_ids, (std::vector<int32_t>{a.block_ids[0], a.block_ids[1]}));
  EXPECT_EQ(kv.prefix_cache_stats().hits, 8);

  // A longer prompt sharing the prefix hits all three blocks.
  Request c = make_request("c", 14);
  ComputedBlocks hit_c = kv.get_computed_blocks(c);
  EXPECT_EQ(hit_c.num_computed_tokens, 12);
  ASSERT_TRUE(kv.allocate_slots(c, 2, &hit_c));
  EXPECT_EQ(c.block_ids.size(), 4u);
  EXPECT_EQ(kv.pool().block(a.block_ids[0]).ref_cnt, 2);
  c.num_computed_tokens = 14;
  kv.check_integrity({&a, &c});

  // A different first token shares nothing (chain hash).
  Request d = make_request("d", 14, 1);
  EXPECT_EQ(kv.get_computed_blocks(d).num_computed_tokens, 0);
  EXPECT_EQ(kv.prefix_cache_stats().hits, 8 + 12);
}

TEST(KVCacheManager, FreedBlocksStayCachedUntilEvicted) {
  KVCacheManager kv(4, 4, true, fixed_hasher());
  Request a = make_request("a", 9);
  ASSERT_TRUE(kv.allocate_slots(a, 9));
  kv.cache_full_blocks(a, 9);
  kv.free(a);
  EXPECT_EQ(kv.num_free_blocks(), 4);
  Request b = make_request("b", 9);
  ComputedBlocks hit = kv.get_computed_blocks(b);
  EXPECT_EQ(hit.num_computed_tokens, 8);
  // Touching free cached blocks counts against the free pool: 2 hit + 1 new = 3 of 4.
  ASSERT_TRUE(kv.allocate_slots(b, 1, &hit));
  EXPECT_EQ(kv.num_free_blocks(), 1);
  kv.check_integrity({&b});
}

TEST(KVCacheManager, EvictableHitBlocksCountAgainstCapacity) {
  KVCacheManager kv(3, 4, true, fixed_hasher());
  Request a = make_request("a", 9);
  ASSERT_TRUE(kv.allocate_slots(a, 9));
  kv.cache_full_blocks(a, 9);  // 3 blocks, 2 full ones cached
  kv.free(a);
  Request b = make_request("b", 20);  // shares 8 tokens, needs 5 blocks in total
  ComputedBlocks hit = kv.get_computed_blocks(b);
  EXPECT_EQ(hit.num_computed_tokens, 8);
  EXPECT_FALSE(kv.allocate_slots(b, 12, &hit));
  EXPECT_EQ(kv.num_free_blocks(), 3);
  EXPECT_TRUE(b.block_ids.empty());
}

TEST(KVCacheManager, CacheSaltIsolatesTenants) {
  KVCacheManager kv(8, 4, true, fixed_hasher());
  Request a = make_request("a", 9);
  a.cache_salt = "tenant-a";
  ASSERT_TRUE(kv.allocate_slots(a, 9));
  kv.cache_full_blocks(a, 9);
  Request b = make_request("b", 9);
  b.cache_salt = "tenant-b";
  EXPECT_EQ(kv.get_computed_blocks(b).num_computed_tokens, 0);
  Request c = make_request("c", 9);
  c.cache_salt = "tenant-a";
  EXPECT_EQ(kv.get_computed_blocks(c).num_computed_tokens, 8);
}

// Blocks covering an image's placeholders are keyed by its hash: another image never hits them,
// the same image does, and the text blocks before the image are shared either way.
TEST(KVCacheManager, ImageHashesKeyTheBlocksThatCoverThem) {
  KVCacheManager kv(16, 4, true, fixed_hasher());
  auto with_image = [](const char* id, const char* hash) {
    Request r = make_request(id, 17);
    r.mm_ranges.push_back({6, 5, hash});  // placeholders 6..10: blocks 1 and 2
    return r;
  };
  Request a = with_image("a", "cafe01");
  ASSERT_TRUE(kv.allocate_slots(a, 17));
  kv.cache_full_blocks(a, 17);
  Request other = with_image("b", "beef02");
  EXPECT_EQ(kv.get_computed_blocks(other).num_computed_tokens, 4);  // block 0 only
  Request same = with_image("c", "cafe01");
  EXPECT_EQ(kv.get_computed_blocks(same).num_computed_tokens, 16);
  Request moved = make_request("d", 17);
  moved.mm_ranges.push_back({7, 4, "cafe01"});  // the same image's placeholders elsewhere
  EXPECT_EQ(kv.get_computed_blocks(moved).num_computed_tokens, 4);
  Request text = make_request("e", 17);  // the same token ids, no image
  EXPECT_EQ(kv.get_computed_blocks(text).num_computed_tokens, 4);
}

TEST(KVCacheManager, DisabledCachingNeverHits) {
  KVCacheManager kv(8, 4, false, fixed_hasher());
  Request a = make_request("a", 9);
  ASSERT_TRUE(kv.allocate_slots(a, 9));
  kv.cache_full_blocks(a, 9);
  Request b = make_request("b", 9);
  EXPECT_EQ(kv.get_computed_blocks(b).num_computed_tokens, 0);
}

TEST(KVCacheManager, ResetPrefixCache) {
  KVCacheManager kv(8, 4, true, fixed_hasher());
  Request a = make_request("a", 9);
  ASSERT_TRUE(kv.allocate_slots(a, 9));
  kv.cache_full_blocks(a, 9);
  EXPECT_FALSE(kv.reset_prefix_cache());
  kv.free(a);
  EXPECT_TRUE(kv.reset_prefix_cache());
  Request b = make_request("b", 9);
  EXPECT_EQ(kv.get_computed_blocks(b).num_computed_tokens, 0);
}
