// How paged attention's work is cut into items (paged_attention.cpp): (sequence, KV head, chunk
// of up to kQueryChunk query tokens[, one split of its KV range]), in the order threads claim
// them. Internal to paged_attention.cpp.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "attention_tile.h"
#include "corellm/kernels/paged_attention.h"

namespace corellm::attention {

constexpr int64_t kQueryChunk = 16;
// Keys per split of an item's KV range: at 256, a decode alone over a few hundred keys gives the
// two threads of a small machine work, and a batch of decodes short of that is not split at all.
// A multiple of the span fold's kSpanKeys.
constexpr int64_t kSplitKeys = 256;
static_assert(kSplitKeys % kSpanKeys == 0, "a split boundary must be a span boundary");
// Below this many (sequence, query chunk) units per thread, a unit's splits are items of their own.
constexpr int64_t kUnitsPerThreadToKeepSplits = 4;

// The first key position a query at `pos` sees (sliding_window <= 0: no window).
inline int64_t first_visible(int64_t pos, int64_t sliding_window) {
  return sliding_window > 0 ? std::max<int64_t>(0, pos - sliding_window + 1) : 0;
}

// One past the last key position a query at `pos` of a sequence of `seq_len` keys sees: itself
// when causal; else its sequence's end, or the window's (sliding_window <= 0: no window).
inline int64_t visible_end(int64_t pos, int64_t seq_len, int64_t sliding_window, bool causal) {
  if (causal) return pos + 1;
  return sliding_window > 0 ? std::min<int64_t>(seq_len, pos + sliding_window) : seq_len;
}

struct WorkItem {
  int64_t seq;
  int64_t kv_head;
  int64_t q_begin, q_end;          // query tokens of the sequence, relative to its first
  int64_t block_begin, block_end;  // KV blocks this item reads
  int64_t partial;                 // index of its partial-result slot, or -1: write `out`
};

struct WorkPlan {
  int64_t split_blocks;  // KV blocks per split
  std::vector<WorkItem> items;
  // Per unit folded as split items: its first split (whose partial slots follow on) and the
  // number of splits, for the merge after the items.
  std::vector<std::pair<WorkItem, int64_t>> split_groups;
  int64_t num_partials = 0;  // partial slots of kQueryChunk x group rows
};

// Every item's KV range is split at fixed points (every kSplitKeys keys, from position 0), so
// that one long decode keeps every thread busy; fixed, so that the split, and with it a row's
// arithmetic, is the same alone, in any batch, in any chunk and on any number of threads.
//
// Items in the order (sequence, query chunk, split, KV head), claimed a unit of nkv at a time: a
// thread reads every KV head of the blocks it goes through. A block's heads lie side by side
// (block_offset), and the hardware prefetcher, which fetches ahead within a page, brings the
// neighbouring heads' lines with each head's: with the heads of a block spread over the threads,
// those lines were fetched from memory twice or arrived in the wrong core. Intel Xeon VM, 2
// threads, 64 decodes x 192 keys x 30 layers with the blocks scattered: 18.0-18.5 -> 14.6-15.7 ms
// (x 256 keys: 23.4-25.3 -> 20.1-21.1 ms).
//
// Who folds the splits of a (sequence, query chunk, KV head): with few such units (one long
// decode, a handful), an item each, on whichever thread is free, their partial results merged
// afterwards (attention_split_merge.h); with many (a prefill's chunks, a batch of decodes), which
// keep the threads busy as they are, the unit's one item, one split after the other (run_item),
// merged the same way. The same arithmetic either way, and so the same bits, alone or in any
// batch. Split items for every unit had needed a slot per (chunk, split, head): a chunk of 2048
// queries over 16k keys (32 heads, 8 KV heads of 128) grew the process by 1.9 GiB and took 1.24 s,
// now nothing and 0.74 s (Intel Xeon, AMX, 2 threads); SmolLM2-sized prefills and decodes are as
// fast as before.
//
// The units with the most work first (keys x query tokens; a prefill's later chunks see more
// keys), so that the last ones to finish are small: the one thread still working at the end
// waits less (with a unit of three items that wait had grown). Intel Xeon VM, 2 threads, 30
// layers, three alternating runs: one prompt of 512 tokens 23.8-24.8 ms in chunk order, 23.2-24.5
// largest first; four of 128 7.8-8.1 -> 7.6-7.7 ms. A unit's items keep their order.
inline WorkPlan plan_work(const PagedAttentionArgs& a) {
  const int64_t bs = a.cache.block_size, nkv = a.cache.num_kv_heads;
  WorkPlan plan{std::max<int64_t>(1, kSplitKeys / bs), {}, {}, 0};
  const int64_t split_blocks = plan.split_blocks;
  int64_t chunk_units = 0;
  for (int64_t s = 0; s < a.num_seqs; ++s) {
    chunk_units += (a.query_start_loc[s + 1] - a.query_start_loc[s] + kQueryChunk - 1) / kQueryChunk;
  }
  const bool split_items = chunk_units < kUnitsPerThreadToKeepSplits * omp_get_max_threads();
  std::vector<WorkItem>& items = plan.items;
  for (int64_t s = 0; s < a.num_seqs; ++s) {
    const int64_t q_len = a.query_start_loc[s + 1] - a.query_start_loc[s];
    const int64_t context = a.seq_lens[s] - q_len;
    for (int64_t qb = 0; qb < q_len; qb += kQueryChunk) {
      const int64_t qe = std::min(q_len, qb + kQueryChunk);
      const int64_t block_begin = first_visible(context + qb, a.sliding_window) / bs;
      const int64_t last_key = visible_end(context + qe - 1, a.seq_lens[s], a.sliding_window, a.causal) - 1;
      const int64_t block_end = last_key / bs + 1;
      const int64_t first_segment = block_begin / split_blocks, last_segment = (block_end - 1) / split_blocks;
      const int64_t splits = last_segment - first_segment + 1;
      if (!split_items || splits == 1) {
        for (int64_t h = 0; h < nkv; ++h) items.push_back(WorkItem{s, h, qb, qe, block_begin, block_end, -1});
        continue;
      }
      for (int64_t seg = first_segment; seg <= last_segment; ++seg) {
        for (int64_t h = 0; h < nkv; ++h) {
          const WorkItem w{s, h, qb, qe, std::max(block_begin, seg * split_blocks),
                           std::min(block_end, (seg + 1) * split_blocks),
                           plan.num_partials + h * splits + (seg - first_segment)};
          if (seg == first_segment) plan.split_groups.emplace_back(w, splits);
          items.push_back(w);
        }
      }
      plan.num_partials += nkv * splits;  // each head's splits in consecutive slots
    }
  }
  const auto units = static_cast<int64_t>(items.size()) / nkv;
  std::vector<int64_t> order(static_cast<size_t>(units));
  for (int64_t u = 0; u < units; ++u) order[static_cast<size_t>(u)] = u;
  auto work = [&](int64_t u) {
    const WorkItem& w = items[static_cast<size_t>(u * nkv)];
    return (w.block_end - w.block_begin) * (w.q_end - w.q_begin);
  };
  std::stable_sort(order.begin(), order.end(), [&](int64_t x, int64_t y) { return work(x) > work(y); });
  std::vector<WorkItem> sorted;
  sorted.reserve(items.size());
  for (int64_t u : order) sorted.insert(sorted.end(), items.begin() + u * nkv, items.begin() + (u + 1) * nkv);
  items.swap(sorted);
  return plan;
}

}  // namespace corellm::attention
