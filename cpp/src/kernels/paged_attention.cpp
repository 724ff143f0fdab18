// reshape_and_cache and varlen causal paged attention on the CPU.
//
// Attention algorithm. The work is cut into items: (sequence, KV head, chunk of up to
// kQueryChunk query tokens[, range of KV blocks]). One item gathers the chunk's queries of every
// query head sharing the KV head (rows = tokens x group size), then walks the sequence's blocks
// once: each block's K (stored transposed, [head_size, block_size]) and V ([block_size,
// head_size]) are converted to fp32 scratch once and used by all rows. Per row it keeps the
// online-softmax state (running max m, running sum l, accumulator acc[head_size]):
//   s = q . K^T (masked to the row's causal / sliding-window range)
//   m' = max(m, max s);  acc = acc * e^(m - m') + sum_t e^(s_t - m') V_t;  l likewise
// and writes acc / l. When there are fewer items than threads can share (a few long decodes),
// the KV range is split and the partial (m, l, acc) of the splits are combined at the end.
#include "corellm/kernels/paged_attention.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "corellm/check.h"
#include "corellm/kernels/fast_math.h"

namespace corellm {

namespace {

constexpr int64_t kQueryChunk = 16;
constexpr int64_t kMinBlocksPerSplit = 8;

template <class T>
void reshape_and_cache_impl(const T* key, int64_t key_stride, const T* value, int64_t value_stride,
                            T* key_cache, T* value_cache, const int32_t* slot_mapping, int64_t num_tokens,
                            const KVCacheShape& s) {
  const int64_t hd = s.head_size, bs = s.block_size, nkv = s.num_kv_heads;
#pragma omp parallel for schedule(static) if (num_tokens * nkv * hd >= (1 << 15))
  for (int64_t t = 0; t < num_tokens; ++t) {
    const int64_t slot = slot_mapping[t];
    if (slot < 0) continue;
    const int64_t block = slot / bs, offset = slot % bs;
    for (int64_t h = 0; h < nkv; ++h) {
      const T* k = key + t * key_stride + h * hd;
      const T* v = value + t * value_stride + h * hd;
      T* kc = key_cache + ((block * nkv + h) * hd) * bs + offset;  // [head_size, block_size]
      T* vc = value_cache + ((block * nkv + h) * bs + offset) * hd;  // [block_size, head_size]
      for (int64_t d = 0; d < hd; ++d) kc[d * bs] = k[d];
      std::copy(v, v + hd, vc);
    }
  }
}

struct WorkItem {
  int64_t seq;
  int64_t kv_head;
  int64_t q_begin, q_end;          // query tokens of the sequence, relative to its first
  int64_t block_begin, block_end;  // KV blocks this item reads
  int64_t partial;                 // index of its partial-result slot, or -1: write `out`
};

// Per-thread scratch, reused across items.
struct Scratch {
  std::vector<float> q, k, v, s, m, l, acc;
};

template <class T>
void run_item(const PagedAttentionArgs& a, const WorkItem& w, Scratch& sc, float* partials) {
  const KVCacheShape& c = a.cache;
  const int64_t hd = c.head_size, bs = c.block_size, nkv = c.num_kv_heads;
  const int64_t group = a.num_heads / nkv;
  const int64_t q0 = a.query_start_loc[w.seq];
  const int64_t q_len = a.query_start_loc[w.seq + 1] - q0;
  const int64_t context = a.seq_lens[w.seq] - q_len;  // position of query token 0
  const int64_t rows = (w.q_end - w.q_begin) * group;
  const T* q = static_cast<const T*>(a.q);
  const T* key_cache = static_cast<const T*>(a.key_cache);
  const T* value_cache = static_cast<const T*>(a.value_cache);
  const int32_t* table = a.block_table + w.seq * a.block_table_stride;

  sc.q.resize(static_cast<size_t>(rows * hd));
  sc.k.resize(static_cast<size_t>(hd * bs));
  sc.v.resize(static_cast<size_t>(bs * hd));
  sc.s.resize(static_cast<size_t>(bs));
  sc.m.assign(static_cast<size_t>(rows), -std::numeric_limits<float>::infinity());
  sc.l.assign(static_cast<size_t>(rows), 0.0f);
  sc.acc.assign(static_cast<size_t>(rows * hd), 0.0f);

  // Gather the rows: row r = (token i, head g of the group), query pre-multiplied by the scale.
  for (int64_t i = w.q_begin; i < w.q_end; ++i) {
    for (int64_t g = 0; g < group; ++g) {
      const T* src = q + (q0 + i) * a.q_stride + (w.kv_head * group + g) * hd;
      float* dst = &sc.q[static_cast<size_t>(((i - w.q_begin) * group + g) * hd)];
      for (int64_t d = 0; d < hd; ++d) dst[d] = load_f32(src + d) * a.scale;
    }
  }

  for (int64_t blk = w.block_begin; blk < w.block_end; ++blk) {
    const int64_t phys = table[blk];
    const int64_t t0 = blk * bs;
    const T* kb = key_cache + (phys * nkv + w.kv_head) * hd * bs;
    const T* vb = value_cache + (phys * nkv + w.kv_head) * bs * hd;
    float* kf = sc.k.data();
    float* vf = sc.v.data();
#pragma omp simd
    for (int64_t e = 0; e < hd * bs; ++e) kf[e] = load_f32(kb + e);
#pragma omp simd
    for (int64_t e = 0; e < bs * hd; ++e) vf[e] = load_f32(vb + e);

    for (int64_t r = 0; r < rows; ++r) {
      const int64_t pos = context + w.q_begin + r / group;
      const int64_t lo_pos = a.sliding_window > 0 ? std::max<int64_t>(0, pos - a.sliding_window + 1) : 0;
      const int64_t lo = std::max<int64_t>(lo_pos - t0, 0);
      const int64_t hi = std::min<int64_t>(pos + 1 - t0, bs);  // keys [t0 + lo, t0 + hi)
      if (hi <= lo) continue;
      float* s = sc.s.data();
      const float* qr = &sc.q[static_cast<size_t>(r * hd)];
      std::fill(s, s + bs, 0.0f);
      for (int64_t d = 0; d < hd; ++d) {
        const float qd = qr[d];
        const float* kd = kf + d * bs;
#pragma omp simd
        for (int64_t t = 0; t < bs; ++t) s[t] += qd * kd[t];
      }
      float block_max = -std::numeric_limits<float>::infinity();
      for (int64_t t = lo; t < hi; ++t) block_max = std::max(block_max, s[t]);
      const float m_old = sc.m[static_cast<size_t>(r)];
      const float m_new = std::max(m_old, block_max);
      const float correction = fast_exp(m_old - m_new);  // 0 on the first block (m_old = -inf clamps)
      float* acc = &sc.acc[static_cast<size_t>(r * hd)];
      float sum = 0.0f;
      for (int64_t t = lo; t < hi; ++t) {
        s[t] = fast_exp(s[t] - m_new);
        sum += s[t];
      }
      if (m_old == -std::numeric_limits<float>::infinity()) {
        sc.l[static_cast<size_t>(r)] = sum;
      } else {
        sc.l[static_cast<size_t>(r)] = sc.l[static_cast<size_t>(r)] * correction + sum;
#pragma omp simd
        for (int64_t d = 0; d < hd; ++d) acc[d] *= correction;
      }
      for (int64_t t = lo; t < hi; ++t) {
        const float p = s[t];
        const float* vt = vf + t * hd;
#pragma omp simd
        for (int64_t d = 0; d < hd; ++d) acc[d] += p * vt[d];
      }
      sc.m[static_cast<size_t>(r)] = m_new;
    }
  }

  for (int64_t r = 0; r < rows; ++r) {
    const int64_t i = w.q_begin + r / group, g = r % group;
    const float* acc = &sc.acc[static_cast<size_t>(r * hd)];
    if (w.partial >= 0) {
      // Partial result: [m, l, acc...] for the combine step.
      float* p = partials + (w.partial * kQueryChunk * group + r) * (hd + 2);
      p[0] = sc.m[static_cast<size_t>(r)];
      p[1] = sc.l[static_cast<size_t>(r)];
      std::copy(acc, acc + hd, p + 2);
      continue;
    }
    const float inv = sc.l[static_cast<size_t>(r)] > 0.0f ? 1.0f / sc.l[static_cast<size_t>(r)] : 0.0f;
    T* o = static_cast<T*>(a.out) + ((q0 + i) * a.num_heads + w.kv_head * group + g) * hd;
    for (int64_t d = 0; d < hd; ++d) store_f32(o + d, acc[d] * inv);
  }
}

// Merges the splits of one (sequence, KV head, chunk): rescale every split to the global max.
template <class T>
void combine(const PagedAttentionArgs& a, const WorkItem& first, int64_t num_splits, const float* partials) {
  const int64_t hd = a.cache.head_size;
  const int64_t group = a.num_heads / a.cache.num_kv_heads;
  const int64_t rows = (first.q_end - first.q_begin) * group;
  const int64_t q0 = a.query_start_loc[first.seq];
  std::vector<float> acc(static_cast<size_t>(hd));
  for (int64_t r = 0; r < rows; ++r) {
    float m = -std::numeric_limits<float>::infinity();
    const int64_t stride = kQueryChunk * group;  // rows per partial slot
    for (int64_t sp = 0; sp < num_splits; ++sp) m = std::max(m, partials[((first.partial + sp) * stride + r) * (hd + 2)]);
    std::fill(acc.begin(), acc.end(), 0.0f);
    float l = 0.0f;
    for (int64_t sp = 0; sp < num_splits; ++sp) {
      const float* p = partials + ((first.partial + sp) * stride + r) * (hd + 2);
      if (p[1] == 0.0f) continue;  // a split with no visible key
      const float w = fast_exp(p[0] - m);
      l += p[1] * w;
      for (int64_t d = 0; d < hd; ++d) acc[static_cast<size_t>(d)] += p[2 + d] * w;
    }
    const int64_t i = first.q_begin + r / group, g = r % group;
    T* o = static_cast<T*>(a.out) + ((q0 + i) * a.num_heads + first.kv_head * group + g) * hd;
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    for (int64_t d = 0; d < hd; ++d) store_f32(o + d, acc[static_cast<size_t>(d)] * inv);
  }
}

template <class T>
void paged_attention_impl(const PagedAttentionArgs& a) {
  const int64_t bs = a.cache.block_size;
  // Plan the items.
  std::vector<WorkItem> items;
  for (int64_t s = 0; s < a.num_seqs; ++s) {
    const int64_t q_len = a.query_start_loc[s + 1] - a.query_start_loc[s];
    const int64_t context = a.seq_lens[s] - q_len;
    for (int64_t h = 0; h < a.cache.num_kv_heads; ++h) {
      for (int64_t qb = 0; qb < q_len; qb += kQueryChunk) {
        const int64_t qe = std::min(q_len, qb + kQueryChunk);
        const int64_t last_pos = context + qe - 1;
        const int64_t first_pos = a.sliding_window > 0 ? std::max<int64_t>(0, context + qb - a.sliding_window + 1) : 0;
        items.push_back({s, h, qb, qe, first_pos / bs, last_pos / bs + 1, -1});
      }
    }
  }
  // Split long KV ranges when there are too few items to keep every thread busy.
  const int64_t threads = omp_get_max_threads();
  int64_t num_partials = 0;
  std::vector<std::pair<size_t, int64_t>> split_groups;  // (first item index, number of splits)
  if (threads > 1 && static_cast<int64_t>(items.size()) < 2 * threads) {
    std::vector<WorkItem> split_items;
    const int64_t want = (4 * threads + static_cast<int64_t>(items.size()) - 1) / static_cast<int64_t>(items.size());
    for (const WorkItem& w : items) {
      const int64_t num_blocks = w.block_end - w.block_begin;
      const int64_t splits = std::min(want, std::max<int64_t>(1, num_blocks / kMinBlocksPerSplit));
      if (splits <= 1) {
        split_items.push_back(w);
        continue;
      }
      split_groups.emplace_back(split_items.size(), splits);
      for (int64_t sp = 0; sp < splits; ++sp) {
        WorkItem part = w;
        part.block_begin = w.block_begin + num_blocks * sp / splits;
        part.block_end = w.block_begin + num_blocks * (sp + 1) / splits;
        part.partial = num_partials++;
        split_items.push_back(part);
      }
    }
    items.swap(split_items);
  }
  const int64_t group = a.num_heads / a.cache.num_kv_heads;
  std::vector<float> partials(static_cast<size_t>(num_partials * kQueryChunk * group * (a.cache.head_size + 2)));
  const auto n = static_cast<int64_t>(items.size());
#pragma omp parallel if (n > 1)
  {
    Scratch scratch;
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < n; ++i) run_item<T>(a, items[static_cast<size_t>(i)], scratch, partials.data());
  }
  for (const auto& [first, splits] : split_groups) combine<T>(a, items[first], splits, partials.data());
}

}  // namespace

void reshape_and_cache(const void* key, int64_t key_stride, const void* value, int64_t value_stride,
                       void* key_cache, void* value_cache, const int32_t* slot_mapping,
                       int64_t num_tokens, const KVCacheShape& shape, DType dtype) {
  const int64_t num_slots = shape.num_blocks * shape.block_size;
  for (int64_t t = 0; t < num_tokens; ++t) {
    CORELLM_CHECK_ARG(slot_mapping[t] < num_slots, "slot_mapping[", t, "] = ", slot_mapping[t],
                      " is outside the cache's ", num_slots, " slots");
  }
  if (dtype == DType::F32) {
    reshape_and_cache_impl(static_cast<const float*>(key), key_stride, static_cast<const float*>(value),
                           value_stride, static_cast<float*>(key_cache), static_cast<float*>(value_cache),
                           slot_mapping, num_tokens, shape);
  } else {
    reshape_and_cache_impl(static_cast<const uint16_t*>(key), key_stride, static_cast<const uint16_t*>(value),
                           value_stride, static_cast<uint16_t*>(key_cache), static_cast<uint16_t*>(value_cache),
                           slot_mapping, num_tokens, shape);
  }
}

void paged_attention(const PagedAttentionArgs& a) {
  const KVCacheShape& c = a.cache;
  CORELLM_CHECK_ARG(a.num_heads > 0 && c.num_kv_heads > 0 && a.num_heads % c.num_kv_heads == 0,
                    "num_heads (", a.num_heads, ") must be a multiple of num_kv_heads (", c.num_kv_heads, ")");
  // Validate the metadata before any thread reads the cache through it.
  CORELLM_CHECK_ARG(a.query_start_loc[0] == 0, "query_start_loc[0] must be 0");
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
