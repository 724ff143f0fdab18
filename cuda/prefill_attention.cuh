// Prefill attention on tensor cores, for paged_attention's launcher.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "kernels.h"

namespace corellm::cuda {

// Sequences with at least this many query tokens take the tensor-core kernel; shorter ones (decode
// rows of a mixed batch) stay on the scalar kernel, which shares each KV block across a GQA group.
constexpr int kPrefillMinQueryLen = 16;

// Whether the tensor-core kernel takes this shape: 16-bit dtypes, block_size 16, a head size of
// kAttentionHeadSizes whose tiles fit the device's shared memory (all but 256 before sm_90).
bool prefill_attention_applies(int64_t head_size, int64_t block_size, DType dtype);

// The paged_attention launcher's arguments; attends only the sequences with at least
// kPrefillMinQueryLen query tokens.
void prefill_attention(void* out, const void* q, int64_t q_stride, const void* key_cache, const void* value_cache,
                       int64_t num_kv_heads, int64_t head_size, int64_t block_size, const int32_t* block_table,
                       int64_t block_table_stride, const int32_t* seq_lens, const int32_t* query_start_loc,
                       int64_t num_seqs, int64_t num_heads, float scale, int64_t sliding_window, int64_t max_query_len,
                       DType dtype, cudaStream_t stream);

}  // namespace corellm::cuda
