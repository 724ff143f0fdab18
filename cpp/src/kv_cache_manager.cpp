// KVCacheManager: prefix lookups, slot allocation, freeing and caching of a request's blocks.
#include "corellm/kv_cache_manager.h"

#include <algorithm>
#include <string>
#include <string_view>
#include <unordered_set>

#include "corellm/check.h"

namespace corellm {

static int32_t cdiv(int32_t a, int32_t b) { return (a + b - 1) / b; }

KVCacheManager::KVCacheManager(int32_t num_blocks, int32_t block_size, bool enable_caching,
                               std::shared_ptr<const PrefixHasher> hasher)
    : block_size_(block_size), pool_(num_blocks, enable_caching), hasher_(std::move(hasher)) {
  CORELLM_CHECK_ARG(block_size > 0, "block_size must be > 0, got ", block_size);
  if (!hasher_) hasher_ = std::make_shared<const PrefixHasher>();
}

// A block's extra keys: the cache salt in the first block (the chain carries it to every later
// one), and each image whose placeholders the block covers — its hash and where its placeholders
// start relative to the block. Every field is length-prefixed, so no two sets of keys serialize to
// the same bytes. Empty for a block of plain text (most blocks: no string is built).
static std::string block_extra_keys(const Request& request, int32_t block, int32_t block_size) {
  std::string extra;
  if (block == 0 && !request.cache_salt.empty()) {
    extra += "s" + std::to_string(request.cache_salt.size()) + ":" + request.cache_salt;
  }
  const int32_t start = block * block_size, end = start + block_size;
  for (const MultiModalRange& range : request.mm_ranges) {
    if (range.offset >= end) break;  // ranges are in prompt order
    if (range.offset + range.length <= start) continue;
    extra += "m" + std::to_string(range.hash.size()) + ":" + range.hash + "@" +
             std::to_string(range.offset - start) + ";";
  }
  return extra;
}

void KVCacheManager::update_block_hashes(Request& request) const {
  const int32_t num_full_blocks = request.num_tokens() / block_size_;
  while (static_cast<int32_t>(request.block_hashes.size()) < num_full_blocks) {
    const size_t i = request.block_hashes.size();
    const BlockHash& parent = i == 0 ? hasher_->root() : request.block_hashes[i - 1];
    const bool keyed = (i == 0 && !request.cache_salt.empty()) || !request.mm_ranges.empty();
    const std::string extra = keyed ? block_extra_keys(request, static_cast<int32_t>(i), block_size_) : std::string();
    request.block_hashes.push_back(hasher_->hash_block(
        parent, request.token_ids.data() + i * static_cast<size_t>(block_size_),
        static_cast<size_t>(block_size_), extra));
  }
}

ComputedBlocks KVCacheManager::get_computed_blocks(Request& request) {
  ComputedBlocks result;
  if (!pool_.enable_caching()) return result;
  update_block_hashes(request);
  // At least the last token is recomputed, so a hit covers at most num_tokens - 1 tokens.
  const int32_t max_hit_blocks = (request.num_tokens() - 1) / block_size_;
  for (int32_t i = 0; i < max_hit_blocks; ++i) {
    auto block_id = pool_.get_cached_block(request.block_hashes[static_cast<size_t>(i)]);
    if (!block_id) break;
    result.block_ids.push_back(*block_id);
  }
  result.num_computed_tokens = static_cast<int32_t>(result.block_ids.size()) * block_size_;
  stats_.requests += 1;
  stats_.queries += request.num_tokens();
  stats_.hits += result.num_computed_tokens;
  return result;
}

bool KVCacheManager::allocate_slots(Request& request, int32_t num_new_tokens,
                                    const ComputedBlocks* new_computed,
                                    int32_t num_lookahead_tokens,
                                    std::vector<int32_t>* new_block_ids) {
  CORELLM_CHECK_ARG(num_new_tokens >= 0 && num_lookahead_tokens >= 0,
                    "negative token count: num_new_tokens ", num_new_tokens,
                    ", num_lookahead_tokens ", num_lookahead_tokens);
  const int32_t num_new_computed_blocks =
      new_computed ? static_cast<int32_t>(new_computed->block_ids.size()) : 0;
  const int32_t num_new_computed_tokens = new_computed ? new_computed->num_computed_tokens : 0;
  CORELLM_CHECK(num_new_computed_blocks == 0 || request.block_ids.empty(),
                "prefix hit for request ", *request.request_id, " that already holds blocks");

  const int32_t num_computed = request.num_computed_tokens + num_new_computed_tokens;
  const int32_t num_required_blocks =
      cdiv(num_computed + num_new_tokens + num_lookahead_tokens, block_size_);
  const int32_t num_held = static_cast<int32_t>(request.block_ids.size()) + num_new_computed_blocks;
  const int32_t num_to_allocate = std::max(0, num_required_blocks - num_held);

  // Cached blocks that are currently free leave the free queue when touched: they count
  // against the blocks available for fresh allocation.
  int32_t num_evictable_computed = 0;
  for (int32_t i = 0; i < num_new_computed_blocks; ++i) {
    if (pool_.block(new_computed->block_ids[static_cast<size_t>(i)]).ref_cnt == 0) ++num_evictable_computed;
  }
  if (num_to_allocate + num_evictable_computed > pool_.num_free_blocks()) return false;

  if (num_new_computed_blocks > 0) {
    pool_.touch(new_computed->block_ids.data(), new_computed->block_ids.size());
    request.block_ids.insert(request.block_ids.end(), new_computed->block_ids.begin(),
                             new_computed->block_ids.end());
  }
  const size_t first_new = request.block_ids.size();
  const bool ok = pool_.get_new_blocks(num_to_allocate, request.block_ids);
  CORELLM_CHECK(ok, "pool could not serve ", num_to_allocate, " blocks after the check");
  if (new_block_ids) {
    new_block_ids->insert(new_block_ids->end(), request.block_ids.begin() + static_cast<std::ptrdiff_t>(first_new),
                          request.block_ids.end());
  }
  // The blocks are not registered in the prefix cache here: their KV is written by the step's
  // forward, so they become findable only once that step succeeded (cache_full_blocks, called by
  // the scheduler's update_from_output). A failed step, or a request preempted within the step,
  // leaves nothing findable with unwritten KV.
  return true;
}

void KVCacheManager::cache_full_blocks(Request& request, int32_t num_tokens) {
  if (!pool_.enable_caching()) return;
  const int32_t num_full = std::min(num_tokens / block_size_, static_cast<int32_t>(request.block_ids.size()));
  if (num_full <= request.num_cached_blocks) return;
  update_block_hashes(request);
  CORELLM_CHECK(static_cast<int32_t>(request.block_hashes.size()) >= num_full,
                "request ", *request.request_id, " has fewer hashes than full blocks");
  for (int32_t i = request.num_cached_blocks; i < num_full; ++i) {
    pool_.cache_block(request.block_ids[static_cast<size_t>(i)], request.block_hashes[static_cast<size_t>(i)]);
  }
  request.num_cached_blocks = num_full;
}

void KVCacheManager::free(Request& request) {
  // Tail first: the end of a chain is the least likely to be shared, so it is evicted first.
  scratch_.assign(request.block_ids.rbegin(), request.block_ids.rend());
  pool_.free_blocks(scratch_.data(), scratch_.size());
  request.block_ids.clear();
  request.num_cached_blocks = 0;
}

bool KVCacheManager::reset_prefix_cache() { return pool_.reset_prefix_cache(); }

void KVCacheManager::check_integrity(const std::vector<const Request*>& owners) const {
  std::vector<int32_t> ref_cnt(static_cast<size_t>(pool_.num_blocks()), 0);
  std::unordered_set<int32_t> seen;
  for (const Request* request : owners) {
    seen.clear();
    for (int32_t block_id : request->block_ids) {
      CORELLM_CHECK(block_id >= 0 && block_id < pool_.num_blocks(), "request ",
                    *request->request_id, " holds invalid block ", block_id);
      CORELLM_CHECK(seen.insert(block_id).second, "request ", *request->request_id,
                    " holds block ", block_id, " twice");
      ++ref_cnt[static_cast<size_t>(block_id)];
    }
    CORELLM_CHECK(request->num_cached_blocks <= static_cast<int32_t>(request->block_ids.size()),
                  "request ", *request->request_id, " caches more blocks than it holds");
    const int32_t needed = cdiv(request->num_computed_tokens, block_size_);
    CORELLM_CHECK(static_cast<int32_t>(request->block_ids.size()) >= needed, "request ",
                  *request->request_id, " computed ", request->num_computed_tokens,
                  " tokens but holds only ", request->block_ids.size(), " blocks");
  }
  pool_.check_integrity(ref_cnt);
}

}  // namespace corellm
