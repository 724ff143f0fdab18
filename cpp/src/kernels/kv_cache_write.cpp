// reshape_and_cache on the CPU: each token's keys and values written into its slot of the paged
// cache (kv_cache_layout.h).
#include <cstdint>

#include "corellm/check.h"
#include "corellm/kernels/paged_attention.h"
#include "fp8_codec.h"
#include "kv_cache_layout.h"

namespace corellm {

namespace {

template <class T>
void reshape_and_cache_impl(const T* key, int64_t key_stride, const T* value, int64_t value_stride,
                            T* key_cache, T* value_cache, const int32_t* slot_mapping, int64_t num_tokens,
                            const KVCacheShape& s) {
  constexpr int64_t x = kPack<T>;
  const int64_t hd = s.head_size, bs = s.block_size, nkv = s.num_kv_heads;
  // Parallel from a few tokens on: the key writes are scattered (keys are stored transposed), so
  // even a decode step's writes are worth two threads.
#pragma omp parallel for schedule(static) if (num_tokens >= 8)
  for (int64_t t = 0; t < num_tokens; ++t) {
    const int64_t slot = slot_mapping[t];
    if (slot < 0) continue;
    const int64_t block = slot / bs, o = slot % bs;
    for (int64_t h = 0; h < nkv; ++h) {
      const T* k = key + t * key_stride + h * hd;
      const T* v = value + t * value_stride + h * hd;
      T* kc = key_cache + block_offset(s, block, h);    // [hd / x, bs, x]
      T* vc = value_cache + block_offset(s, block, h);  // [bs / x, hd, x]
      for (int64_t d = 0; d < hd; ++d) kc[((d / x) * bs + o) * x + d % x] = k[d];
      for (int64_t d = 0; d < hd; ++d) vc[((o / x) * hd + d) * x + o % x] = v[d];
    }
  }
}

// The bf16 cache written a 32-bit word at a time, its unit: a key's dim pair (d, d + 1) is one
// word of the key layout ([hd / 2, bs] words), and a value word holds one dim of a slot pair (o, o +
// 1) ([bs / 2, hd] words). A token whose slot starts a pair and whose successor in the batch takes
// the pair's other slot (a prefill's consecutive tokens) writes both tokens' values as whole words,
// and the successor only its key; a lone token writes its half of each value word. Per token and KV
// head that is hd / 2 key stores and hd / 2 value stores (vectorized) instead of 2 hd 16-bit stores.
// Measured on the Intel Xeon VM (2 threads, SmolLM2's 30 layers, a 2048-token prefill step of ~330
// ms): 10.0 -> 6.1 ms in this op; a decode step's lone tokens are bound by fetching the lines they
// write (0.53-0.57 ms at 32 sequences, either way). Its own loop over the tokens, not one shared
// with the fp32 writer through a callable: read through a closure, the sizes were loaded again
// after each may-alias word store, and the writes ran slower.
void reshape_and_cache_bf16(const uint16_t* key, int64_t key_stride, const uint16_t* value, int64_t value_stride,
                            uint16_t* key_cache, uint16_t* value_cache, const int32_t* slot_mapping,
                            int64_t num_tokens, const KVCacheShape& s) {
  using Word = uint32_t __attribute__((may_alias, aligned(2)));  // a bf16 pair, wherever it starts
  const int64_t hd = s.head_size, bs = s.block_size, nkv = s.num_kv_heads;
#pragma omp parallel for schedule(static) if (num_tokens >= 8)
  for (int64_t t = 0; t < num_tokens; ++t) {
    const int64_t slot = slot_mapping[t];
    if (slot < 0) continue;
    const int64_t block = slot / bs, o = slot % bs;
    const bool pair_first = o % 2 == 0 && t + 1 < num_tokens && slot_mapping[t + 1] == slot + 1;
    const bool pair_second = o % 2 == 1 && t > 0 && slot_mapping[t - 1] == slot - 1;
    for (int64_t h = 0; h < nkv; ++h) {
      const auto* k = reinterpret_cast<const Word*>(key + t * key_stride + h * hd);
      auto* kc = reinterpret_cast<Word*>(key_cache + block_offset(s, block, h));
      for (int64_t p = 0; p < hd / 2; ++p) kc[p * bs + o] = k[p];
      if (pair_second) continue;  // its values went out with its predecessor's
      const uint16_t* v = value + t * value_stride + h * hd;
      uint16_t* vc = value_cache + block_offset(s, block, h) + (o / 2) * hd * 2;
      if (pair_first) {
        const uint16_t* next = v + value_stride;
        auto* words = reinterpret_cast<Word*>(vc);
#pragma omp simd
        for (int64_t d = 0; d < hd; ++d) words[d] = static_cast<uint32_t>(v[d]) | static_cast<uint32_t>(next[d]) << 16;
      } else {
        for (int64_t d = 0; d < hd; ++d) vc[d * 2 + o % 2] = v[d];
      }
    }
  }
}

// The fp8 cache (bf16's layout, a byte an element): each token's K and V of a head narrowed into
// a local row (fp8_codec.h, vectorized), then stored: a key's dim pair as one 16-bit word of the
// key layout, a value's dims a byte each.
constexpr int64_t kMaxFp8HeadSize = 1024;

void reshape_and_cache_fp8(const uint16_t* key, int64_t key_stride, const uint16_t* value, int64_t value_stride,
                           uint8_t* key_cache, uint8_t* value_cache, const int32_t* slot_mapping, int64_t num_tokens,
                           const KVCacheShape& s) {
  using Word = uint16_t __attribute__((may_alias, aligned(1)));  // an fp8 pair
  const int64_t hd = s.head_size, bs = s.block_size, nkv = s.num_kv_heads;
  const fp8::Format& fmt = fp8::format_of(s.element);
#pragma omp parallel for schedule(static) if (num_tokens >= 8)
  for (int64_t t = 0; t < num_tokens; ++t) {
    const int64_t slot = slot_mapping[t];
    if (slot < 0) continue;
    const int64_t block = slot / bs, o = slot % bs;
    uint8_t k[kMaxFp8HeadSize], v[kMaxFp8HeadSize];
    for (int64_t h = 0; h < nkv; ++h) {
      fp8::narrow_bf16(key + t * key_stride + h * hd, k, hd, fmt);
      fp8::narrow_bf16(value + t * value_stride + h * hd, v, hd, fmt);
      auto* kc = reinterpret_cast<Word*>(key_cache + block_offset(s, block, h));  // [hd / 2, bs] pairs
      for (int64_t p = 0; p < hd / 2; ++p) kc[p * bs + o] = static_cast<uint16_t>(k[2 * p] | k[2 * p + 1] << 8);
      uint8_t* vc = value_cache + block_offset(s, block, h) + (o / 2) * hd * 2 + o % 2;  // [bs / 2, hd, 2]
      for (int64_t d = 0; d < hd; ++d) vc[d * 2] = v[d];
    }
  }
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
  if (is_fp8(shape.element)) {
    CORELLM_CHECK_ARG(dtype == DType::BF16, "an fp8 KV cache is written from bf16 keys and values");
    CORELLM_CHECK_ARG(shape.block_size % 2 == 0 && shape.head_size % 2 == 0 && shape.head_size <= kMaxFp8HeadSize,
                      "fp8 KV caches need an even block_size and an even head_size of at most ", kMaxFp8HeadSize,
                      ", got ", shape.block_size, " and ", shape.head_size);
    reshape_and_cache_fp8(static_cast<const uint16_t*>(key), key_stride, static_cast<const uint16_t*>(value),
                          value_stride, static_cast<uint8_t*>(key_cache), static_cast<uint8_t*>(value_cache),
                          slot_mapping, num_tokens, shape);
  } else if (dtype == DType::F32) {
    reshape_and_cache_impl(static_cast<const float*>(key), key_stride, static_cast<const float*>(value),
                           value_stride, static_cast<float*>(key_cache), static_cast<float*>(value_cache),
                           slot_mapping, num_tokens, shape);
  } else {
    CORELLM_CHECK_ARG(shape.block_size % 2 == 0 && shape.head_size % 2 == 0,
                      "bf16 KV caches need an even block_size and head_size, got ", shape.block_size, " and ",
                      shape.head_size);
    reshape_and_cache_bf16(static_cast<const uint16_t*>(key), key_stride, static_cast<const uint16_t*>(value),
                           value_stride, static_cast<uint16_t*>(key_cache), static_cast<uint16_t*>(value_cache),
                           slot_mapping, num_tokens, shape);
  }
}

}  // namespace corellm
