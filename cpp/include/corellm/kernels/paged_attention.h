// The paged KV cache kernels on the CPU: writing a step's K/V into their slots, and varlen
// causal (or bidirectional) attention of the step's query tokens over each sequence's cached K/V.
#pragma once

#include <cstdint>

#include "corellm/kernels/cpu_isa.h"
#include "corellm/kernels/dtype.h"

namespace corellm {

// KV cache layout (one layer), chosen so that attention reads contiguous runs:
//   key_cache   [num_blocks, num_kv_heads, head_size, block_size]   (keys transposed per block)
//   value_cache [num_blocks, num_kv_heads, block_size, head_size]
// Slot s is token (s % block_size) of block (s / block_size).
//
// An element is the model's dtype (bf16 or fp32), or one byte of an 8-bit float (vLLM's
// kv_cache_dtype "fp8" / "fp8_e4m3", "fp8_e5m2"; per-tensor scale 1, as vLLM's without calibrated
// scales): half a bf16 cache's bytes, so twice the tokens in the same memory and half the bytes a
// decode step reads. An fp8 cache keeps the bf16 layout element for element (x = 2 below), so a
// block widens to bf16 in place of the same shape (fp8_codec.h) and every bf16 fold reads it.
// Writes round the model's bf16 values to the nearest fp8 (ties to even), saturating at the
// format's largest finite value (448 for e4m3, 57344 for e5m2).
enum class KVCacheElement : int32_t { kModelDType = 0, kFp8E4M3 = 1, kFp8E5M2 = 2 };

struct KVCacheShape {
  int64_t num_blocks;
  int64_t num_kv_heads;
  int64_t head_size;
  int64_t block_size;
  KVCacheElement element = KVCacheElement::kModelDType;
};

inline bool is_fp8(KVCacheElement e) { return e != KVCacheElement::kModelDType; }

// key/value [num_tokens, num_kv_heads, head_size] (token strides given, in `dtype`) go to their
// slots, converted to the cache's element; a negative slot (padding) is skipped. An fp8 cache
// needs bf16 keys and values.
void reshape_and_cache(const void* key, int64_t key_stride, const void* value, int64_t value_stride,
                       void* key_cache, void* value_cache, const int32_t* slot_mapping,
                       int64_t num_tokens, const KVCacheShape& shape, DType dtype);

// Sequence i owns query tokens [query_start_loc[i], query_start_loc[i+1]) of q, which are its
// last tokens: with L = seq_lens[i] and n its query length, query token j sits at position
// L - n + j and attends to the keys at positions [max(0, pos - sliding_window + 1), pos]
// (sliding_window <= 0: no window). This covers a whole prefill (n = L), a chunk after a prefix
// hit or an earlier chunk (n < L) and decode (n = 1). GQA: query head h reads KV head
// h / (num_heads / num_kv_heads); each KV block is read once per KV head and query chunk.
// q [num_tokens, num_heads, head_size] (token stride given), out [num_tokens, num_heads,
// head_size] contiguous, block_table [num_seqs, block_table_stride]; q and out in `dtype` (bf16
// where the cache is fp8).
struct PagedAttentionArgs {
  void* out;
  const void* q;
  int64_t q_stride;
  const void* key_cache;
  const void* value_cache;
  KVCacheShape cache;
  const int32_t* block_table;
  int64_t block_table_stride;
  const int32_t* seq_lens;
  const int32_t* query_start_loc;
  int64_t num_seqs;
  int64_t num_heads;
  float scale;
  int64_t sliding_window;
  DType dtype;
  CpuIsa isa = cpu_isa();  // the instruction-set path (tests and benchmarks may ask for another)
  float softcap = 0.0f;    // > 0: each scaled score s becomes softcap * tanh(s / softcap) (Gemma 2)
  // [num_heads] fp32, or null: head h's sink, a logit that joins each of its rows' softmax as one
  // more term of the denominator with no value (gpt-oss's attention sinks): a row's weights are
  // exp(s_t - M) / (sum_t exp(s_t - M) + exp(sink_h - M)), M the larger of the row's max and the sink.
  const float* sinks = nullptr;
  // false: bidirectional (an encoder's): every query token sees every key of its sequence, or,
  // with sliding_window > 0, the keys less than sliding_window positions away on either side,
  // [max(0, pos - sliding_window + 1), min(L, pos + sliding_window)).
  bool causal = true;
};

void paged_attention(const PagedAttentionArgs& args);

}  // namespace corellm
