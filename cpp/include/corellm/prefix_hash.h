// Prefix-cache hashing: a keyed SHA-256 chain over the token ids of full KV blocks.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace corellm {

// The identity of one full block of tokens *and everything before it*:
//   hash(block i) = SHA-256( hash(block i-1) || token ids of block i (int32 LE) || extra keys )
// Block 0's parent is a per-process random root, so hashes cannot be predicted (nor collisions
// crafted) from outside the process; a collision would hand one request another's KV.
struct BlockHash {
  std::array<uint8_t, 32> bytes{};

  bool operator==(const BlockHash& other) const { return bytes == other.bytes; }
  bool operator!=(const BlockHash& other) const { return bytes != other.bytes; }
  std::string hex() const;
};

struct BlockHashHasher {
  size_t operator()(const BlockHash& h) const noexcept {
    size_t x;
    std::memcpy(&x, h.bytes.data(), sizeof(x));  // SHA-256 output is uniform already
    return x;
  }
};

class PrefixHasher {
 public:
  // Root drawn from the OS's random source: hashes differ between processes.
  PrefixHasher();
  // A fixed root, for tests and reproducible benchmarks.
  explicit PrefixHasher(const BlockHash& root);
  ~PrefixHasher();
  PrefixHasher(const PrefixHasher&) = delete;
  PrefixHasher& operator=(const PrefixHasher&) = delete;

  const BlockHash& root() const { return root_; }

  // Hash of one full block given its parent's hash. `extra_keys` (e.g. a tenant's cache salt)
  // is length-prefixed so that no two (tokens, extra) pairs serialize to the same bytes.
  // Not thread-safe: one hasher per thread (it reuses one digest context).
  BlockHash hash_block(const BlockHash& parent, const int32_t* token_ids, size_t num_tokens,
                       std::string_view extra_keys = {}) const;

 private:
  BlockHash root_;
  struct Impl;
  Impl* impl_;
};

}  // namespace corellm
