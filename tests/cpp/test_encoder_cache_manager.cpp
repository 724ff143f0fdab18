// EncoderCacheManager: allocation within capacity, sharing, freeable entries and their eviction,
// and the pending entries a preempted plan takes back.
#include <gtest/gtest.h>

#include "corellm/encoder_cache_manager.h"

namespace corellm {
namespace {

TEST(EncoderCacheManager, AllocatesWithinCapacityAndSharesEntries) {
  EncoderCacheManager cache(10);
  EXPECT_TRUE(cache.can_allocate(10));
  EXPECT_FALSE(cache.can_allocate(11));
  cache.allocate("a", 6, "r1");
  EXPECT_TRUE(cache.has("a"));
  EXPECT_FALSE(cache.can_allocate(5));
  EXPECT_TRUE(cache.acquire("a", "r2"));
  EXPECT_EQ(cache.hits(), 1);
  EXPECT_FALSE(cache.acquire("b", "r2"));
  cache.check_integrity();
}

TEST(EncoderCacheManager, UnusedEntriesStayHeldUntilTheirRoomIsNeeded) {
  EncoderCacheManager cache(10);
  cache.allocate("a", 6, "r1");
  cache.end_step();
  EXPECT_FALSE(cache.release("a", "r1"));  // freeable, still held
  EXPECT_TRUE(cache.has("a"));
  EXPECT_TRUE(cache.can_allocate(10));  // by evicting it
  EXPECT_TRUE(cache.acquire("a", "r2"));  // revived
  EXPECT_FALSE(cache.can_allocate(5));
  cache.release("a", "r2");
  cache.allocate("b", 8, "r3");  // evicts a
  EXPECT_FALSE(cache.has("a"));
  EXPECT_EQ(cache.take_freed(), std::vector<std::string>{"a"});
  EXPECT_TRUE(cache.take_freed().empty());
  cache.check_integrity();
}

TEST(EncoderCacheManager, EvictsTheLeastRecentlyFreedFirst) {
  EncoderCacheManager cache(9);
  for (const char* h : {"a", "b", "c"}) cache.allocate(h, 3, h);
  cache.end_step();
  cache.release("b", "b");
  cache.release("a", "a");
  cache.allocate("d", 3, "d");  // c is in use: b goes first
  EXPECT_EQ(cache.take_freed(), std::vector<std::string>{"b"});
  cache.check_integrity();
}

TEST(EncoderCacheManager, APendingEntryReleasedByAllItsUsersIsForgotten) {
  EncoderCacheManager cache(10);
  cache.allocate("a", 6, "r1");
  cache.acquire("a", "r2");
  EXPECT_FALSE(cache.release("a", "r1"));  // r2 still uses it: it will be encoded
  EXPECT_TRUE(cache.release("a", "r2"));   // nobody: never encoded, nothing to free
  EXPECT_FALSE(cache.has("a"));
  EXPECT_TRUE(cache.take_freed().empty());
  EXPECT_TRUE(cache.can_allocate(10));
  cache.check_integrity();
}

}  // namespace
}  // namespace corellm
