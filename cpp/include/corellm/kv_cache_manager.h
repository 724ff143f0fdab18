// KVCacheManager: which KV blocks each request holds, prefix-cache lookups and registration.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "corellm/block_pool.h"
#include "corellm/prefix_hash.h"
#include "corellm/request.h"

namespace corellm {

// Result of a prefix-cache lookup: cached blocks covering the first num_computed_tokens tokens.
struct ComputedBlocks {
  std::vector<int32_t> block_ids;
  int32_t num_computed_tokens = 0;
};

struct PrefixCacheStats {
  int64_t queries = 0;  // tokens looked up
  int64_t hits = 0;     // tokens found cached
  int64_t requests = 0; // lookups made
};

class KVCacheManager {
 public:
  // `hasher` may be null: a hasher with a per-process random root is made.
  KVCacheManager(int32_t num_blocks, int32_t block_size, bool enable_caching,
                 std::shared_ptr<const PrefixHasher> hasher = nullptr);

  int32_t block_size() const { return block_size_; }
  int32_t num_blocks() const { return pool_.num_blocks(); }
  int32_t num_free_blocks() const { return pool_.num_free_blocks(); }
  double usage() const { return pool_.usage(); }
  bool enable_caching() const { return pool_.enable_caching(); }
  const BlockPool& pool() const { return pool_; }
  const PrefixCacheStats& prefix_cache_stats() const { return stats_; }

  // Longest run of leading full blocks of `request` found in the prefix cache. Never the whole
  // prompt: at least the last token must be computed to produce logits, so a hit stops one
  // token short of request.num_tokens(). Does not take references (allocate_slots does).
  ComputedBlocks get_computed_blocks(Request& request);

  // Adds the blocks `request` needs for this step. Token layout of the request:
  //
  //   | computed | new computed | new            | lookahead |
  //   |<- request.num_computed_tokens            |
  //              |<- new_computed (prefix hit, this call)
  //                             |<- num_new_tokens (scheduled now)
  //                                              |<- num_lookahead_tokens (slots only)
  //   |<------------------ blocks needed after this call ------------------>|
  //
  // On success the new-computed blocks are referenced and appended to request.block_ids, then
  // fresh blocks follow; their ids are appended to `new_block_ids` (if given). Nothing is
  // registered in the prefix cache: a block becomes findable by cache_full_blocks once the step
  // that writes its KV has succeeded.
  // Returns false, changing nothing, when the pool cannot provide the blocks: an expected
  // outcome the scheduler answers with preemption (running) or by waiting (new requests).
  bool allocate_slots(Request& request, int32_t num_new_tokens,
                      const ComputedBlocks* new_computed = nullptr,
                      int32_t num_lookahead_tokens = 0,
                      std::vector<int32_t>* new_block_ids = nullptr);

  // Drops the request's references to all its blocks (tail first into the free queue).
  void free(Request& request);

  // Registers the request's full blocks covering its first `num_tokens` tokens, whose KV must be
  // written (the scheduler calls it for each request of a step that succeeded).
  void cache_full_blocks(Request& request, int32_t num_tokens);

  // Forgets all cached prefixes; false when some block is still in use.
  bool reset_prefix_cache();

  // Pool integrity plus: each block's ref count equals the number of given requests holding it,
  // and no request holds a block twice.
  void check_integrity(const std::vector<const Request*>& owners) const;

 private:
  // Extends request.block_hashes to cover every full block of request.token_ids.
  void update_block_hashes(Request& request) const;

  int32_t block_size_;
  BlockPool pool_;
  std::shared_ptr<const PrefixHasher> hasher_;
  PrefixCacheStats stats_;
  std::vector<int32_t> scratch_;
};

}  // namespace corellm
