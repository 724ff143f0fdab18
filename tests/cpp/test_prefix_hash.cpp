// Tests of the keyed SHA-256 chain hash of full blocks.
#include <gtest/gtest.h>

#include <openssl/sha.h>

#include "corellm/prefix_hash.h"

using namespace corellm;

TEST(PrefixHash, MatchesSha256OfParentTokensAndExtra) {
  BlockHash root;
  for (size_t i = 0; i < root.bytes.size(); ++i) root.bytes[i] = static_cast<uint8_t>(i);
  PrefixHasher hasher(root);
  const int32_t tokens[4] = {1, 2, 3, 0x01020304};
  BlockHash h = hasher.hash_block(root, tokens, 4);
  // Reference: SHA-256 over the same bytes, computed in one shot.
  std::vector<uint8_t> msg(root.bytes.begin(), root.bytes.end());
  const auto* tb = reinterpret_cast<const uint8_t*>(tokens);
  msg.insert(msg.end(), tb, tb + sizeof(tokens));
  BlockHash expected;
  SHA256(msg.data(), msg.size(), expected.bytes.data());
  EXPECT_EQ(h, expected);
}

TEST(PrefixHash, ChainDependsOnParentTokensAndSalt) {
  PrefixHasher hasher(BlockHash{});
  const int32_t a[2] = {5, 6};
  const int32_t b[2] = {5, 7};
  BlockHash h0 = hasher.hash_block(hasher.root(), a, 2);
  EXPECT_NE(h0, hasher.hash_block(hasher.root(), b, 2));
  EXPECT_NE(hasher.hash_block(h0, a, 2), hasher.hash_block(hasher.root(), a, 2));
  EXPECT_NE(h0, hasher.hash_block(hasher.root(), a, 2, "tenant-1"));
  EXPECT_NE(hasher.hash_block(hasher.root(), a, 2, "tenant-1"),
            hasher.hash_block(hasher.root(), a, 2, "tenant-2"));
  EXPECT_EQ(h0, hasher.hash_block(hasher.root(), a, 2));
}

TEST(PrefixHash, RandomRootDiffersPerHasher) {
  PrefixHasher x, y;
  EXPECT_NE(x.root(), y.root());
  const int32_t t[1] = {1};
  EXPECT_NE(x.hash_block(x.root(), t, 1), y.hash_block(y.root(), t, 1));
}
