// Paged attention on CUDA: causal attention of each sequence's query tokens over its cached K/V,
// covering prefill, chunked prefill after a prefix hit, and decode, in the CPU kernels' packed
// cache layout.
//
// Algorithm. One thread block per (sequence, KV head, chunk of query tokens); its rows are the
// chunk's tokens x the query heads of that KV head (GQA: each KV block is read once per KV head
// for all of them), in tiles of kMaxRows. The block's warps take the sequence's visible KV blocks
// in turn (warp w: blocks w, w + warps, ...). Within a warp, lane j scores key j of a 32-key tile
// (a dot product over the head, q read from shared memory), the warp keeps per row a running max,
// sum and fp32 output accumulator (online softmax), each lane owning the output dims lane,
// lane + 32, ... below head_size, and adds the tile's values weighted by the probabilities
// (broadcast by shuffles). At the end the warps' states are merged through shared memory and each
// row is written once.
//
// Decode batches (one query token per sequence) in 16-bit dtypes go to decode_attention.cu, which
// splits long contexts across thread blocks, and sequences of 16 query tokens or more to the
// tensor-core kernel (prefill_attention.cu); this kernel covers the rest: short queries of mixed
// batches, fp32, other shapes.
#include <algorithm>
#include <climits>

#include "common.cuh"
#include "decode_attention.cuh"
#include "prefill_attention.cuh"

namespace corellm::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kMaxRows = 8;

// Lane l owns output dims l, l + 32, ...; the last round may run past a head size that is not a
// multiple of 32 (16, 80, 96): those lanes hold nothing there.
template <int HEAD>
__device__ __forceinline__ bool owns_dim(int d) {
  return HEAD % 32 == 0 || d < HEAD;
}

template <class T, int HEAD>
__global__ void __launch_bounds__(kWarps * 32)
paged_attention_kernel(T* out, const T* q, int64_t q_stride, const T* key_cache, const T* value_cache, int num_kv_heads,
                       int block_size, int x, const int32_t* block_table, int64_t block_table_stride,
                       const int32_t* seq_lens, const int32_t* query_start_loc, int group, int chunk_tokens,
                       float scale, int sliding_window, int skip_from) {
  constexpr int kDims = (HEAD + 31) / 32;  // output dims per lane: lane + 32 j, those below HEAD
  const int seq = blockIdx.x, kv_head = blockIdx.y;
  const int q0 = query_start_loc[seq];
  const int q_len = query_start_loc[seq + 1] - q0;
  const int tok_begin = blockIdx.z * chunk_tokens;
  if (tok_begin >= q_len || q_len >= skip_from) return;  // (skip_from: the tensor-core kernel's)
  const int tok_end = min(q_len, tok_begin + chunk_tokens);
  const int context = seq_lens[seq] - q_len;  // position of query token 0
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int32_t* table = block_table + seq * block_table_stride;
  const int64_t chunk = static_cast<int64_t>(HEAD) * block_size;  // elements of one (block, head)

  __shared__ float q_s[kMaxRows][HEAD];
  __shared__ float m_s[kWarps][kMaxRows], l_s[kWarps][kMaxRows];
  __shared__ float acc_s[kWarps][kMaxRows][HEAD];

  const int total_rows = (tok_end - tok_begin) * group;
  for (int row0 = 0; row0 < total_rows; row0 += kMaxRows) {
    const int rows = min(kMaxRows, total_rows - row0);
    // Rows: r -> (token tok_begin + (row0 + r) / group, head kv_head * group + (row0 + r) % group).
    for (int i = threadIdx.x; i < rows * HEAD; i += blockDim.x) {
      const int r = i / HEAD, d = i % HEAD;
      const int tok = tok_begin + (row0 + r) / group, head = kv_head * group + (row0 + r) % group;
      q_s[r][d] = to_f32(q[(q0 + tok) * q_stride + head * HEAD + d]) * scale;
    }
    __syncthreads();
    // The keys any row of the tile may see: [lo, hi).
    const int first_tok = tok_begin + row0 / group, last_tok = tok_begin + (row0 + rows - 1) / group;
    const int hi = context + last_tok + 1;
    const int lo = sliding_window > 0 ? max(0, context + first_tok - sliding_window + 1) : 0;

    float m[kMaxRows], l[kMaxRows], acc[kMaxRows][kDims];
#pragma unroll
    for (int r = 0; r < kMaxRows; ++r) {
      m[r] = -INFINITY;
      l[r] = 0.0f;
#pragma unroll
      for (int j = 0; j < kDims; ++j) acc[r][j] = 0.0f;
    }
    for (int blk = lo / block_size + warp; blk * block_size < hi; blk += kWarps) {
      const int64_t base = (static_cast<int64_t>(table[blk]) * num_kv_heads + kv_head) * chunk;
      const T* kb = key_cache + base;
      const T* vb = value_cache + base;
      for (int t0 = 0; t0 < block_size; t0 += 32) {
        const int t = t0 + lane;  // this lane's key within the block
        const int pos = blk * block_size + t;
        const bool in_block = t < block_size && pos >= lo && pos < hi;
        float s[kMaxRows];
#pragma unroll
        for (int r = 0; r < kMaxRows; ++r) s[r] = 0.0f;
        if (in_block) {
          for (int d = 0; d < HEAD; ++d) {
            const float kd = to_f32(kb[((d / x) * block_size + t) * x + d % x]);
#pragma unroll
            for (int r = 0; r < kMaxRows; ++r) s[r] += q_s[r][d] * kd;
          }
        }
#pragma unroll
        for (int r = 0; r < kMaxRows; ++r) {
          if (r >= rows) break;
          const int qpos = context + tok_begin + (row0 + r) / group;
          const bool visible = in_block && pos <= qpos && (sliding_window <= 0 || pos > qpos - sliding_window);
          const float score = visible ? s[r] : -INFINITY;
          float tile_max = score;
#pragma unroll
          for (int o = 16; o > 0; o >>= 1) tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, o));
          const float new_m = fmaxf(m[r], tile_max);
          if (new_m == -INFINITY) continue;  // nothing visible yet for this row
          const float p = visible ? __expf(score - new_m) : 0.0f;
          const float correction = __expf(m[r] - new_m);
          float p_sum = p;
#pragma unroll
          for (int o = 16; o > 0; o >>= 1) p_sum += __shfl_xor_sync(0xffffffffu, p_sum, o);
          l[r] = l[r] * correction + p_sum;
          m[r] = new_m;
#pragma unroll
          for (int j = 0; j < kDims; ++j) acc[r][j] *= correction;
          const int keys = min(32, block_size - t0);
          for (int k = 0; k < keys; ++k) {
            const float pk = __shfl_sync(0xffffffffu, p, k);
            if (pk == 0.0f) continue;  // also skips keys never written (zero weight, never read)
            const int tk = t0 + k;
#pragma unroll
            for (int j = 0; j < kDims; ++j) {
              const int d = lane + 32 * j;
              if (owns_dim<HEAD>(d)) acc[r][j] += pk * to_f32(vb[((tk / x) * HEAD + d) * x + tk % x]);
            }
          }
        }
      }
    }
    // Merge the warps' states, then write each row once.
    if (lane == 0) {
      for (int r = 0; r < rows; ++r) {
        m_s[warp][r] = m[r];
        l_s[warp][r] = l[r];
      }
    }
    for (int r = 0; r < rows; ++r) {
#pragma unroll
      for (int j = 0; j < kDims; ++j) {
        if (owns_dim<HEAD>(lane + 32 * j)) acc_s[warp][r][lane + 32 * j] = acc[r][j];
      }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < rows * HEAD; i += blockDim.x) {
      const int r = i / HEAD, d = i % HEAD;
      const float3 merged = merge_warp_states(m_s, l_s, acc_s, r, d);
      const float sum = merged.y, value = merged.z;
      const int tok = tok_begin + (row0 + r) / group, head = kv_head * group + (row0 + r) % group;
      out[(q0 + tok) * (static_cast<int64_t>(group) * num_kv_heads * HEAD) + head * HEAD + d] =
          from_f32<T>(sum > 0.0f ? value / sum : 0.0f);
    }
    __syncthreads();  // q_s and the merge buffers are reused by the next row tile
  }
}

}  // namespace

void paged_attention(void* out, const void* q, int64_t q_stride, const void* key_cache, const void* value_cache,
                     int64_t num_blocks, int64_t num_kv_heads, int64_t head_size, int64_t block_size,
                     const int32_t* block_table, int64_t block_table_stride, const int32_t* seq_lens,
                     const int32_t* query_start_loc, int64_t num_seqs, int64_t num_heads, float scale,
                     int64_t sliding_window, int64_t max_query_len, int64_t max_seq_len, void* workspace,
                     DType dtype, std::uintptr_t stream) {
  (void)num_blocks;  // block ids come from the engine's own tables
  CORELLM_CHECK_ARG(is_attention_head_size(head_size), "paged_attention: head_size ", head_size,
                    " is not supported on CUDA (", attention_head_sizes_text(), ")");
  if (num_seqs == 0 || max_query_len == 0) return;
  CORELLM_CHECK_ARG(num_kv_heads > 0 && num_heads % num_kv_heads == 0, "paged_attention: num_heads ", num_heads,
                    " is not a multiple of num_kv_heads ", num_kv_heads);
  const int group = static_cast<int>(num_heads / num_kv_heads);
  if (max_query_len == 1 && max_seq_len > 0 && decode_attention_applies(head_size, block_size, group, dtype)) {
    decode_attention(out, q, q_stride, key_cache, value_cache, num_kv_heads, head_size, block_size, block_table,
                     block_table_stride, seq_lens, query_start_loc, num_seqs, num_heads, scale, sliding_window,
                     max_seq_len, workspace, dtype, as_stream(stream));
    return;
  }
  // Sequences with many query tokens go to the tensor-core kernel, the rest (decode rows of a
  // mixed batch, short chunks) to this one.
  int skip_from = INT_MAX;
  if (max_query_len >= kPrefillMinQueryLen && prefill_attention_applies(head_size, block_size, dtype)) {
    prefill_attention(out, q, q_stride, key_cache, value_cache, num_kv_heads, head_size, block_size, block_table,
                      block_table_stride, seq_lens, query_start_loc, num_seqs, num_heads, scale, sliding_window,
                      max_query_len, dtype, as_stream(stream));
    skip_from = kPrefillMinQueryLen;
  }
  const int64_t longest = std::min<int64_t>(max_query_len, skip_from - 1);
  // Query tokens per thread block: enough for a tile of rows, at least one.
  const int chunk_tokens = std::max(1, kMaxRows / group);
  const dim3 grid(static_cast<unsigned>(num_seqs), static_cast<unsigned>(num_kv_heads),
                  static_cast<unsigned>((longest + chunk_tokens - 1) / chunk_tokens));
  const int x = dtype == DType::F32 ? 1 : 2;
  dispatch("paged_attention", dtype, [&](auto tag) {
    using T = decltype(tag);
    const bool launched = dispatch_head_size(head_size, [&](auto head_c) {
      paged_attention_kernel<T, decltype(head_c)::value><<<grid, kWarps * 32, 0, as_stream(stream)>>>(
          static_cast<T*>(out), static_cast<const T*>(q), q_stride, static_cast<const T*>(key_cache),
          static_cast<const T*>(value_cache), static_cast<int>(num_kv_heads), static_cast<int>(block_size), x,
          block_table, block_table_stride, seq_lens, query_start_loc, group, chunk_tokens, scale,
          static_cast<int>(sliding_window), skip_from);
    });
    CORELLM_CHECK(launched, "no paged_attention kernel for the supported head_size ", head_size);
  });
  check_launch("paged_attention");
}

bool is_attention_head_size(int64_t head_size) {
  return dispatch_head_size(head_size, [](auto) {});
}

std::string attention_head_sizes_text() {
  std::string text;
  for (const int h : kAttentionHeadSizes) text += (text.empty() ? "" : ", ") + std::to_string(h);
  return text;
}

int64_t paged_attention_workspace_size(int64_t num_seqs, int64_t num_heads, int64_t num_kv_heads, int64_t head_size,
                                       int64_t block_size, int64_t max_query_len, int64_t max_seq_len, DType dtype) {
  if (num_kv_heads < 1 || num_heads % num_kv_heads || max_query_len != 1 ||
      !decode_attention_applies(head_size, block_size, num_heads / num_kv_heads, dtype)) {
    return 0;
  }
  return static_cast<int64_t>(decode_attention_workspace_bytes(num_seqs, num_heads, num_kv_heads, head_size,
                                                                max_seq_len));
}

}  // namespace corellm::cuda
