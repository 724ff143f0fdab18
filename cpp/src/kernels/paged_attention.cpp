// Varlen causal (or, for encoders, bidirectional) paged attention on the CPU (the cache's layout:
// kv_cache_layout.h; its writes: kv_cache_write.cpp).
//
// Attention algorithm. The work is cut into items: (sequence, KV head, chunk of up to
// kQueryChunk query tokens[, range of KV blocks]). One item gathers the chunk's queries of every
// query head sharing the KV head (rows = tokens x group size), then walks the sequence's blocks
// once, so each block is read once per KV head and chunk. Per row it keeps the online-softmax
// state (running max m, running sum l, accumulator acc[head_size]):
//   s = q . K^T (masked to the row's range: causal or bidirectional, within the sliding window)
//   m' = max(m, max s);  acc = acc * e^(m - m') + sum_t e^(s_t - m') V_t;  l likewise
// and writes acc / l (attention_block.h has the per-block fold; attention_tile.h and
// attention_amx.h fold a span of keys into many rows at once). Every row's KV range is split at
// fixed points (kSplitKeys), whatever the batch, each split folded from a fresh state, and the
// partial (m, l, acc) of the splits are merged in order (attention_split_merge.h): by separate items, so that one
// long decode keeps every thread busy, or by the chunk's own item where the batch has work enough
// (paged_attention_impl). A row's arithmetic depends on its own token only, not on the item, chunk
// or batch it came in.
#include "corellm/kernels/paged_attention.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <tuple>
#include <utility>
#include <vector>

#include "attention_amx.h"
#include "attention_block.h"
#include "attention_split_merge.h"
#include "attention_tile.h"
#include "attention_work_plan.h"
#include "fp8_codec.h"
#include "kv_cache_layout.h"
#include "corellm/aligned_vector.h"
#include "corellm/check.h"

namespace corellm {

namespace {

using attention::first_visible;
using attention::visible_end;
using attention::kQueryChunk;
using attention::RowState;
using attention::WorkItem;
// Blocks prefetched ahead, into L2: the L1 has too few miss buffers for a block's 64 lines, and
// dropped prefetches slow decode from memory; 3-4 ahead measured no faster than 2 (bench/kernels.py,
// "paged_attention decode").
constexpr int64_t kPrefetchBlocks = 2;

// Asks for `bytes` from p into L2 (locality hint 2): the L1 has too few miss buffers for a block.
void prefetch_l2(const void* p, int64_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (int64_t off = 0; off < bytes; off += 64) __builtin_prefetch(c + off, 0, 2);
}

// Per-thread scratch, reused across items. The span fold's row buffers (qb, acc, tile_s,
// tile_p) hold attention::tile_padded_rows(rows) rows.
struct Scratch {
  std::vector<float> q, k, v, s, m, l;
  AlignedVector<float> acc;
  AlignedVector<uint32_t> qb;
  std::vector<int64_t> lo, hi;  // the span fold's rows: visible key positions
  AlignedVector<float> tile_s;
  std::vector<float> tile_correction;
  AlignedVector<uint32_t> tile_p;
  AlignedVector<uint16_t> wide_k, wide_v;  // an fp8 cache's blocks widened to bf16 (CacheBlocks)
  std::vector<float> own_partials;         // the splits an item folds itself (run_item)
};

// Where a thread's folds read the cache's blocks: in place (bf16), or, for an fp8 cache, widened
// to bf16 into the thread's scratch first (fp8_codec.h), slot i of the span holding its i-th block,
// in the same layout. Widened at once: half the bytes come from memory, and the fold, for every
// path, stays the bf16 one.
class CacheBlocks {
 public:
  CacheBlocks(const PagedAttentionArgs& a, Scratch& sc, int64_t slots)
      : a_(a), sc_(sc), fp8_(is_fp8(a.cache.element)), element_bytes_(fp8_ ? 1 : a.dtype == DType::F32 ? 4 : 2),
        block_elements_(a.cache.head_size * a.cache.block_size),
        fmt_(fp8::format_of(fp8_ ? a.cache.element : KVCacheElement::kFp8E4M3)),
        widen_(isa_at_least(a.isa, CpuIsa::kAvx512) ? fp8::widen_to_bf16_avx512 : fp8::widen_to_bf16) {
    if (fp8_) {
      sc.wide_k.resize(static_cast<size_t>(slots * block_elements_));
      sc.wide_v.resize(static_cast<size_t>(slots * block_elements_));
    }
  }
  int64_t block_bytes() const { return block_elements_ * element_bytes_; }
  const void* key(int64_t block, int64_t kv_head) const { return at(a_.key_cache, block, kv_head); }
  const void* value(int64_t block, int64_t kv_head) const { return at(a_.value_cache, block, kv_head); }
  // Block `block`'s K and V of `kv_head` in bf16 (a bf16 or fp8 cache), as slot `slot` (fp8) or
  // in place.
  std::pair<const uint16_t*, const uint16_t*> bf16(int64_t block, int64_t kv_head, int64_t slot) const {
    if (!fp8_) {
      return {static_cast<const uint16_t*>(key(block, kv_head)), static_cast<const uint16_t*>(value(block, kv_head))};
    }
    uint16_t* k = sc_.wide_k.data() + slot * block_elements_;
    uint16_t* v = sc_.wide_v.data() + slot * block_elements_;
    widen_(static_cast<const uint8_t*>(key(block, kv_head)), k, block_elements_, fmt_);
    widen_(static_cast<const uint8_t*>(value(block, kv_head)), v, block_elements_, fmt_);
    return {k, v};
  }

 private:
  const void* at(const void* cache, int64_t block, int64_t kv_head) const {
    return static_cast<const char*>(cache) + block_offset(a_.cache, block, kv_head) * element_bytes_;
  }
  const PagedAttentionArgs& a_;
  Scratch& sc_;
  bool fp8_;
  int64_t element_bytes_, block_elements_;
  const fp8::Format& fmt_;
  void (*widen_)(const uint8_t*, uint16_t*, int64_t, const fp8::Format&);
};

// The end of the item's first span: its first block's span boundary, or its own end.
int64_t first_span_end(const WorkItem& w, int64_t blocks_per_span) {
  return std::min(w.block_end, (w.block_begin / blocks_per_span + 1) * blocks_per_span);
}

// The keys and values of the item's blocks [b0, b1), for `lines` to fetch.
void add_span_blocks(const PagedAttentionArgs& a, const CacheBlocks& cache, const WorkItem& w, int64_t b0, int64_t b1,
                     attention::NextSpanLines& lines) {
  const int32_t* table = a.block_table + w.seq * a.block_table_stride;
  for (int64_t b = b0; b < b1; ++b) {
    lines.add(cache.key(table[b], w.kv_head));
    lines.add(cache.value(table[b], w.kv_head));
  }
}

// The item's blocks folded a span (up to kSpanKeys keys) at a time into all its rows at once.
// Spans start at multiples of kSpanKeys from position 0, whatever the item's first block (a
// sliding window's), so that a row's spans, like its arithmetic, do not depend on its item.
// The thread's next item (null: none) has its first span fetched during this item's last.
void run_spans(const PagedAttentionArgs& a, const WorkItem& w, const WorkItem* next_item, Scratch& sc,
               attention::SpanFoldFn fold_span) {
  using attention::kSpanKeys;
  const KVCacheShape& c = a.cache;
  const int64_t hd = c.head_size, bs = c.block_size;
  const int64_t group = a.num_heads / c.num_kv_heads;
  const int64_t q_len = a.query_start_loc[w.seq + 1] - a.query_start_loc[w.seq];
  const int64_t seq_len = a.seq_lens[w.seq];
  const int64_t context = seq_len - q_len;
  const int64_t rows = (w.q_end - w.q_begin) * group;
  sc.lo.resize(static_cast<size_t>(rows));
  sc.hi.resize(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t pos = context + w.q_begin + r / group;
    sc.lo[static_cast<size_t>(r)] = first_visible(pos, a.sliding_window);
    sc.hi[static_cast<size_t>(r)] = visible_end(pos, seq_len, a.sliding_window, a.causal);
  }
  const int64_t padded_rows = attention::tile_padded_rows(rows);
  sc.tile_s.resize(static_cast<size_t>(padded_rows * kSpanKeys));
  sc.tile_p.resize(static_cast<size_t>(padded_rows * kSpanKeys / 2));
  sc.tile_correction.resize(static_cast<size_t>(rows));
  const attention::TileRows tile{sc.qb.data(), sc.m.data(), sc.l.data(), sc.acc.data(), sc.lo.data(), sc.hi.data(),
                                 rows};
  const attention::TileScratch scratch{sc.tile_s.data(), sc.tile_p.data(), sc.tile_correction.data()};
  const int32_t* table = a.block_table + w.seq * a.block_table_stride;
  const int64_t blocks_per_span = kSpanKeys / bs;
  const CacheBlocks cache(a, sc, blocks_per_span);
  const int64_t tile_row_blocks = (rows + attention::kTileRows - 1) / attention::kTileRows;
  const bool amx = a.isa == CpuIsa::kAmx;
  for (int64_t blk = w.block_begin, end = 0; blk < w.block_end; blk = end) {
    attention::Span span{};
    span.t0 = blk * bs;
    span.valid_end = seq_len;
    end = std::min(w.block_end, (blk / blocks_per_span + 1) * blocks_per_span);
    // Into L2 (the blocks are scattered): this span's values (needed after its scores) at once
    // when it is the item's first; and the blocks folded after it (the next span's keys and
    // values, or after the item's last span the first span of the thread's next item), a line
    // at a time while this span is folded (NextSpanLines). The amx fold asks for them at once
    // instead: spread over its tile products, 64 decodes x 192 keys x 30 layers took 22.1-23.0 ms
    // against 20.7-22.8 (Intel Xeon VM, 2 threads); and asking for the next item's first span too
    // (it had waited on its first keys) took 21.4-23.3 against 22.3-23.7 ms.
    if (blk == w.block_begin) {
      for (int64_t b = blk; b < end; ++b) prefetch_l2(cache.value(table[b], w.kv_head), cache.block_bytes());
    }
    attention::NextSpanLines next(cache.block_bytes());
    if (end < w.block_end) {
      add_span_blocks(a, cache, w, end, std::min(w.block_end, end + blocks_per_span), next);
    } else if (next_item != nullptr) {
      add_span_blocks(a, cache, *next_item, next_item->block_begin, first_span_end(*next_item, blocks_per_span),
                      next);
    }
    if (amx) {
      next.fetch_all();
    } else if (a.isa == CpuIsa::kAvx2) {
      next.spread_over(attention::avx2::fold_steps(rows, (end - blk) * bs, hd));
      span.next = &next;
    } else if (a.isa == CpuIsa::kAvx512) {
      next.spread_over(attention::avx512f::fold_steps(rows, (end - blk) * bs, hd));
      span.next = &next;
    } else {  // the fold's steps: per block of rows and 16 keys, one for the scores and HD / 16 for P V
      next.spread_over(tile_row_blocks * (end - blk) * bs / 16 * (1 + hd / 16));
      span.next = &next;
    }
    for (int64_t b = blk; b < end; ++b) {
      const auto [kb, vb] = cache.bf16(table[b], w.kv_head, b - blk);
      for (int64_t o = 0; o < bs; o += 16) {
        const int64_t kv = span.keys / 16;
        span.k[kv] = kb + o * 2;
        span.v[kv] = vb + (o / 2) * hd * 2;
        span.keys += 16;
      }
    }
    fold_span(tile, span, bs, attention::ScoreScaling{a.scale, a.softcap}, scratch);
  }
}

// The item's blocks one at a time, each folded into the rows of every query token that sees it
// (attention_block.h), with the blocks kPrefetchBlocks ahead asked for meanwhile.
template <class T>
void run_blocks(const PagedAttentionArgs& a, const WorkItem& w, Scratch& sc, attention::FoldFn<T> fold) {
  constexpr int64_t x = kPack<T>;
  const KVCacheShape& c = a.cache;
  const int64_t hd = c.head_size, bs = c.block_size;
  const int64_t group = a.num_heads / c.num_kv_heads;
  const int64_t q_len = a.query_start_loc[w.seq + 1] - a.query_start_loc[w.seq];
  const int64_t context = a.seq_lens[w.seq] - q_len;  // position of query token 0
  const int32_t* table = a.block_table + w.seq * a.block_table_stride;
  const CacheBlocks cache(a, sc, 1);
  for (int64_t blk = w.block_begin; blk < w.block_end; ++blk) {
    const int64_t t0 = blk * bs;
    // Blocks are scattered in memory: ask for the block kPrefetchBlocks ahead (and, at the start,
    // for all blocks up to it) while this one is computed.
    for (int64_t ahead = blk == w.block_begin ? blk + 1 : blk + kPrefetchBlocks;
         ahead <= blk + kPrefetchBlocks && ahead < w.block_end; ++ahead) {
      prefetch_l2(cache.key(table[ahead], w.kv_head), cache.block_bytes());
      prefetch_l2(cache.value(table[ahead], w.kv_head), cache.block_bytes());
    }
    const T* kb;
    const T* vb;
    if constexpr (sizeof(T) == 2) {
      std::tie(kb, vb) = cache.bf16(table[blk], w.kv_head, 0);
    } else {
      kb = static_cast<const T*>(cache.key(table[blk], w.kv_head));
      vb = static_cast<const T*>(cache.value(table[blk], w.kv_head));
    }
    if (fold == nullptr) {  // unpack to fp32 [hd, bs] keys and [bs, hd] values
      for (int64_t d = 0; d < hd; ++d)
        for (int64_t t = 0; t < bs; ++t) sc.k[static_cast<size_t>(d * bs + t)] = load_f32(kb + ((d / x) * bs + t) * x + d % x);
      for (int64_t t = 0; t < bs; ++t)
        for (int64_t d = 0; d < hd; ++d) sc.v[static_cast<size_t>(t * hd + d)] = load_f32(vb + ((t / x) * hd + d) * x + t % x);
    }
    for (int64_t i = w.q_begin; i < w.q_end; ++i) {  // the rows of token i share their visible keys
      const int64_t pos = context + i;
      const int64_t lo = std::max<int64_t>(first_visible(pos, a.sliding_window) - t0, 0);
      const int64_t end = visible_end(pos, a.seq_lens[w.seq], a.sliding_window, a.causal);
      const int64_t hi = std::min<int64_t>(end - t0, bs);  // keys [t0 + lo, t0 + hi)
      if (hi <= lo) continue;
      for (int64_t g0 = 0; g0 < group; g0 += attention::kMaxRows) {
        const int num_rows = static_cast<int>(std::min<int64_t>(attention::kMaxRows, group - g0));
        RowState states[attention::kMaxRows];
        for (int k = 0; k < num_rows; ++k) {
          const auto r = static_cast<size_t>((i - w.q_begin) * group + g0 + k);
          states[k] = {&sc.q[r * static_cast<size_t>(hd)], &sc.qb[r * static_cast<size_t>(hd / 2)], &sc.m[r],
                       &sc.l[r], &sc.acc[r * static_cast<size_t>(hd)]};
        }
        if (fold != nullptr) {
          fold(states, num_rows, kb, vb, lo, hi, attention::ScoreScaling{a.scale, a.softcap});
        } else {
          for (int k = 0; k < num_rows; ++k) {
            attention::fold_block_generic(states[k], sc.k.data(), sc.v.data(), hd, bs, lo, hi, sc.s.data(),
                                          a.softcap);
          }
        }
      }
    }
  }
}

// One item; next_item: the one this thread runs after it (null: none), whose first blocks the
// span fold fetches while it folds this item's last span. An item with partial slot -1 whose
// blocks reach over several splits (a batch with work enough: paged_attention_impl) folds them one
// after the other, each from a fresh state into a slot of the thread's own, and merges them
// (merge_splits).
template <class T>
void run_item(const PagedAttentionArgs& a, const WorkItem& w, const WorkItem* next_item, Scratch& sc,
              float* partials, int64_t split_blocks) {
  constexpr bool is_bf16 = sizeof(T) == 2;
  const KVCacheShape& c = a.cache;
  const int64_t hd = c.head_size, bs = c.block_size;
  const int64_t group = a.num_heads / c.num_kv_heads;
  const int64_t q0 = a.query_start_loc[w.seq];
  const int64_t rows = (w.q_end - w.q_begin) * group;
  const T* q = static_cast<const T*>(a.q);
  // The path's span fold serves every item where it has one, decodes included: a token gets the
  // same arithmetic in a prefill, in a chunk of any size, as a decode and when recomputed after
  // a preemption. Elsewhere the per-token fold, or the generic one (null).
  const attention::SpanFoldFn fold_span = is_bf16 ? attention::select_span_fold(hd, bs, a.isa) : nullptr;
  const attention::FoldFn<T> fold = fold_span != nullptr ? nullptr : attention::select_fold<T>(hd, bs, a.isa);
  const bool bf16_path = is_bf16 && (fold_span != nullptr || fold != nullptr);  // q kept as bf16 pairs

  const int64_t padded_rows = attention::tile_padded_rows(rows);
  sc.q.resize(static_cast<size_t>(rows * hd));
  sc.qb.resize(static_cast<size_t>(padded_rows * hd / 2));
  sc.k.resize(static_cast<size_t>(hd * bs));
  sc.v.resize(static_cast<size_t>(bs * hd));
  sc.s.resize(static_cast<size_t>(bs));

  // Gather the rows: row r = (token i, head g of the group).
  for (int64_t i = w.q_begin; i < w.q_end; ++i) {
    for (int64_t g = 0; g < group; ++g) {
      const int64_t r = (i - w.q_begin) * group + g;
      const T* src = q + (q0 + i) * a.q_stride + (w.kv_head * group + g) * hd;
      if (bf16_path) {
        std::memcpy(&sc.qb[static_cast<size_t>(r * hd / 2)], src, static_cast<size_t>(hd) * sizeof(T));
      } else {
        float* dst = &sc.q[static_cast<size_t>(r * hd)];
        for (int64_t d = 0; d < hd; ++d) dst[d] = load_f32(src + d) * a.scale;
      }
    }
  }

  // Folds blocks [part.block_begin, part.block_end) into the rows from a fresh state.
  auto fold_part = [&](const WorkItem& part, const WorkItem* after) {
    sc.m.assign(static_cast<size_t>(rows), attention::kNegInf);
    sc.l.assign(static_cast<size_t>(rows), 0.0f);
    sc.acc.assign(static_cast<size_t>(padded_rows * hd), 0.0f);
    if (fold_span != nullptr) {
      run_spans(a, part, after, sc, fold_span);
    } else {
      run_blocks<T>(a, part, sc, fold);
    }
  };
  auto store_partial = [&](float* slots, int64_t slot) {
    for (int64_t r = 0; r < rows; ++r) {
      float* p = attention::partial_row(slots, slot, group, r, hd);
      p[0] = sc.m[static_cast<size_t>(r)];
      p[1] = sc.l[static_cast<size_t>(r)];
      std::copy(&sc.acc[static_cast<size_t>(r * hd)], &sc.acc[static_cast<size_t>((r + 1) * hd)], p + 2);
    }
  };
  const int64_t first_split = w.block_begin / split_blocks, last_split = (w.block_end - 1) / split_blocks;
  if (w.partial >= 0) {  // one split of several, merged by merge_splits after every item has run
    fold_part(w, next_item);
    store_partial(partials, w.partial);
    return;
  }
  if (last_split > first_split) {  // its splits folded here, one after the other
    const int64_t splits = last_split - first_split + 1;
    sc.own_partials.resize(static_cast<size_t>(splits * kQueryChunk * group * (hd + 2)));
    auto split = [&](int64_t k) {  // its k-th split, slot k
      WorkItem part = w;
      part.block_begin = std::max(w.block_begin, (first_split + k) * split_blocks);
      part.block_end = std::min(w.block_end, (first_split + k + 1) * split_blocks);
      part.partial = k;
      return part;
    };
    for (int64_t sp = 0; sp < splits; ++sp) {
      const WorkItem next_split = split(sp + 1);
      fold_part(split(sp), sp + 1 < splits ? &next_split : next_item);
      store_partial(sc.own_partials.data(), sp);
    }
    WorkItem first = w;
    first.partial = 0;
    attention::merge_splits<T>(a, first, splits, sc.own_partials.data());
    return;
  }
  fold_part(w, next_item);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t i = w.q_begin + r / group, g = r % group;
    const float* acc = &sc.acc[static_cast<size_t>(r * hd)];
    const int64_t head = w.kv_head * group + g;
    const float inv = attention::output_factor(sc.m[static_cast<size_t>(r)], sc.l[static_cast<size_t>(r)],
                                               a.sinks == nullptr ? nullptr : a.sinks + head);
    T* o = static_cast<T*>(a.out) + ((q0 + i) * a.num_heads + head) * hd;
    for (int64_t d = 0; d < hd; ++d) store_f32(o + d, acc[d] * inv);
  }
}

template <class T>
void paged_attention_impl(const PagedAttentionArgs& a) {
  const int64_t nkv = a.cache.num_kv_heads;
  const attention::WorkPlan plan = attention::plan_work(a);
  const std::vector<WorkItem>& items = plan.items;
  const int64_t group = a.num_heads / nkv;
  // Not zeroed (a batch of long decodes has megabytes of slots): merge_splits reads only the rows
  // each split wrote.
  const std::unique_ptr<float[]> partials(
      new float[static_cast<size_t>(plan.num_partials * kQueryChunk * group * (a.cache.head_size + 2))]);
  const auto n = static_cast<int64_t>(items.size());
  // Units go to whichever thread is free (uneven lengths balance out), each thread knowing its
  // next item when it starts one, so that it can fetch that item's first blocks meanwhile. With
  // fewer units than threads (one short decode: one unit), an item is the unit: one decode of 192
  // keys 0.63 ms against 0.72 with its heads on one thread; from two decodes on, or one of 1024
  // keys (four splits), the heads together are faster (2 x 192: 0.77 -> 0.72 ms, 1 x 1024: 1.42 ->
  // 1.30, 16 x 1024: 26.1 -> 23.1).
  const int64_t unit = n / nkv >= omp_get_max_threads() ? nkv : 1;
  std::atomic<int64_t> next_unit{0};
#pragma omp parallel if (n > 1)
  {
    Scratch scratch;
    int64_t next = next_unit.fetch_add(1, std::memory_order_relaxed) * unit;
    while (next < n) {
      const int64_t i = next;
      next = (i + 1) % unit != 0 ? i + 1 : next_unit.fetch_add(1, std::memory_order_relaxed) * unit;
      run_item<T>(a, items[static_cast<size_t>(i)], next < n ? &items[static_cast<size_t>(next)] : nullptr, scratch,
                  partials.get(), plan.split_blocks);
    }
  }
  const auto groups = static_cast<int64_t>(plan.split_groups.size());
#pragma omp parallel for schedule(dynamic, 4) if (groups > 1)
  for (int64_t g = 0; g < groups; ++g) {
    const auto& [first, splits] = plan.split_groups[static_cast<size_t>(g)];
    attention::merge_splits<T>(a, first, splits, partials.get());
  }
}

}  // namespace

void paged_attention(const PagedAttentionArgs& a) {
  const KVCacheShape& c = a.cache;
  check_cpu_runs(a.isa, "paged_attention");
  CORELLM_CHECK_ARG(a.num_heads > 0 && c.num_kv_heads > 0 && a.num_heads % c.num_kv_heads == 0,
                    "num_heads (", a.num_heads, ") must be a multiple of num_kv_heads (", c.num_kv_heads, ")");
  CORELLM_CHECK_ARG(a.softcap >= 0.0f && std::isfinite(a.softcap), "softcap must be 0 (none) or positive, got ",
                    a.softcap);
  for (int64_t h = 0; a.sinks != nullptr && h < a.num_heads; ++h) {
    CORELLM_CHECK_ARG(std::isfinite(a.sinks[h]), "attention sink of head ", h, " is not finite: ", a.sinks[h]);
  }
  CORELLM_CHECK_ARG(a.dtype == DType::F32 || c.block_size % 2 == 0,
                    "bf16 KV caches need an even block_size, got ", c.block_size);
  CORELLM_CHECK_ARG(!is_fp8(c.element) || a.dtype == DType::BF16, "an fp8 KV cache is read with bf16 queries");
  // Validate the metadata before any thread reads the cache through it.
  CORELLM_CHECK_ARG(a.num_seqs == 0 || a.query_start_loc[0] == 0, "query_start_loc[0] must be 0");
  for (int64_t s = 0; s < a.num_seqs; ++s) {
    const int64_t q_len = a.query_start_loc[s + 1] - a.query_start_loc[s];
    const int64_t seq_len = a.seq_lens[s];
    CORELLM_CHECK_ARG(q_len >= 0 && q_len <= seq_len, "sequence ", s, ": ", q_len,
                      " query tokens but seq_len ", seq_len);
    const int64_t num_blocks = (seq_len + c.block_size - 1) / c.block_size;
    CORELLM_CHECK_ARG(num_blocks <= a.block_table_stride, "sequence ", s, ": seq_len ", seq_len,
                      " needs ", num_blocks, " blocks, the block table has ", a.block_table_stride);
    for (int64_t b = 0; b < num_blocks; ++b) {
      const int32_t id = a.block_table[s * a.block_table_stride + b];
      CORELLM_CHECK_ARG(id >= 0 && id < c.num_blocks, "sequence ", s, ": block_table[", b, "] = ", id,
                        " is outside the cache's ", c.num_blocks, " blocks");
    }
  }
  if (a.dtype == DType::F32) {
    paged_attention_impl<float>(a);
  } else {
    paged_attention_impl<uint16_t>(a);
  }
}

}  // namespace corellm
