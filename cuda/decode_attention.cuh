// Decode attention (one query token per sequence) with split-K, for paged_attention's launcher.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

#include "kernels.h"

namespace corellm::cuda {

// Keys per partition: a sequence's context is cut into partitions of this many tokens, dealt to
// `splits` thread blocks per (sequence, KV head) in turn; a second kernel merges the splits'
// softmax states.
constexpr int kDecodePartition = 512;

// Whether the decode kernel takes this shape: 16-bit dtypes, head_size 16 / 32 / 64 / 128 (its
// lane maps need head_size to divide 128; 80, 96 and 256 take the scalar kernel), block_size 16,
// at most 8 query heads per KV head.
bool decode_attention_applies(int64_t head_size, int64_t block_size, int64_t group, DType dtype);

// Thread blocks per (sequence, KV head): enough for about 4 per multiprocessor over the batch,
// at most one per partition of the longest sequence. Depends only on host-known values, so that a
// captured graph keeps its grid.
int64_t decode_attention_splits(int64_t num_seqs, int64_t num_kv_heads, int64_t max_seq_len);

// Scratch bytes the splits' states need (0 when there is one split).
size_t decode_attention_workspace_bytes(int64_t num_seqs, int64_t num_heads, int64_t num_kv_heads,
                                        int64_t head_size, int64_t max_seq_len);

// The paged_attention launcher's arguments for a batch whose every query is one token, plus the
// longest sequence (it sizes the grid: a captured graph passes the longest it will ever see) and
// the workspace (at least decode_attention_workspace_bytes).
void decode_attention(void* out, const void* q, int64_t q_stride, const void* key_cache, const void* value_cache,
                      int64_t num_kv_heads, int64_t head_size, int64_t block_size, const int32_t* block_table,
                      int64_t block_table_stride, const int32_t* seq_lens, const int32_t* query_start_loc,
                      int64_t num_seqs, int64_t num_heads, float scale, int64_t sliding_window, int64_t max_seq_len,
                      void* workspace, DType dtype, cudaStream_t stream);

}  // namespace corellm::cuda
