// The CPU KV cache's layout, shared by its writes (kv_cache_write.cpp) and paged attention
// (paged_attention.cpp). Per block and KV head, head_size x block_size elements in each cache:
// keys [head_size / x, block_size, x] (transposed, x elements of a key side by side in a 32-bit
// lane), values [block_size / x, head_size, x] (x keys' elements of one dim side by side). Private
// to the kernels library.
#pragma once

#include <cstdint>

#include "corellm/kernels/paged_attention.h"

namespace corellm {

// Elements per 32-bit lane of the cache layout (x above): 1 for fp32, 2 for bf16.
template <class T>
constexpr int64_t kPack = static_cast<int64_t>(4 / sizeof(T));

// Offset, in elements, of (block, kv_head) in either cache.
inline int64_t block_offset(const KVCacheShape& c, int64_t block, int64_t kv_head) {
  return (block * c.num_kv_heads + kv_head) * c.head_size * c.block_size;
}

}  // namespace corellm
