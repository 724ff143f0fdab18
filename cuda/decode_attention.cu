// Decode attention on CUDA: each sequence's one query token, for all the query heads of a KV
// head at once (GQA: each KV block is read once per KV head), over the paged cache in its packed
// 16-bit layout, with the context split across thread blocks (split-K).
//
// Kernel 1: `splits` thread blocks per (sequence, KV head); split z takes the partitions of
// kDecodePartition keys z, z + splits, ... and its 4 warps take each partition's KV blocks in
// turn. A (block, KV head) chunk of K is contiguous in the cache (HEAD x BS values,
// pairs of dims per token, tokens within a pair of dims), and so is V's (pairs of tokens per dim,
// dims within a pair of tokens): a warp reads each chunk with 16-byte loads, every lane 4 pairs
// at a time, so that a block's K and V stream in at full width.
//   Scores: the 4 pairs of a lane's K load are one pair of dims for 4 consecutive tokens; since
//   BS divides the 128 pairs a warp loads at once, a lane's 4 tokens are the same in every load
//   (t0 = 4 * lane mod BS) and only its pair of dims changes. Each lane sums q . k over its loads;
//   adding across the lanes that share t0 (xor-shuffles by BS/4 .. 16) gives every lane its 4
//   tokens' full scores. Online softmax per query head over the blocks: block max and sum across
//   the BS/4 lane classes (xor-shuffles below BS/4).
//   Values: the 4 pairs of a lane's V load are 4 consecutive dims of one pair of tokens; again
//   HEAD divides 128, so a lane's dims are the same in every load (d0 = 4 * lane mod HEAD). The
//   pair's probabilities come by shuffle from the lane holding those tokens' scores. At the end,
//   the lanes sharing d0 are summed (xor-shuffles by HEAD/4 .. 16) and the 4 warps' states merged
//   through shared memory.
//   One split: the output is written directly. Several: each split's state (max, sum,
//   unnormalised output) goes to the workspace, and
// Kernel 2: one thread block per (sequence, query head), a thread per dim, merges the splits.
#include <algorithm>
#include <string>
#include <type_traits>

#include "common.cuh"
#include "decode_attention.cuh"

namespace corellm::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kMaxGroup = 8;
constexpr int kBlockSize = 16;  // the KV block size the kernel is built for (the engine's default)

template <class T>
__device__ __forceinline__ float2 unpack_pair(uint32_t w);
template <>
__device__ __forceinline__ float2 unpack_pair<__nv_bfloat16>(uint32_t w) {
  return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xFFFF0000u));
}
template <>
__device__ __forceinline__ float2 unpack_pair<__half>(uint32_t w) {
  __half2 h;
  memcpy(&h, &w, sizeof(h));
  return __half22float2(h);
}

__device__ __forceinline__ uint32_t word(const uint4& v, int j) {
  return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w;
}

// Split states in the workspace: m and l [num_seqs, num_heads, splits], o [.., splits, HEAD].
struct Workspace {
  float* m;
  float* l;
  float* o;
};

// MG: the query heads per KV head it holds registers for (>= the model's group).
template <class T, int HEAD, int BS, int MG>
__global__ void __launch_bounds__(kWarps * 32)
decode_partition_kernel(T* out, const T* q, int64_t q_stride, const T* key_cache, const T* value_cache,
                        int num_kv_heads, const int32_t* block_table, int64_t block_table_stride,
                        const int32_t* seq_lens, const int32_t* query_start_loc, int group, float scale,
                        int sliding_window, Workspace ws) {
  constexpr int kChunk = HEAD * BS;           // values of one (block, KV head) chunk, of K and of V
  constexpr int kLoads = kChunk / 2 / 4 / 32;  // 16-byte loads per lane per chunk (4 pairs each)
  static_assert(kLoads >= 1 && (128 % BS) == 0 && (128 % HEAD) == 0, "unsupported decode shape");
  const int seq = blockIdx.x, kv_head = blockIdx.y, split = blockIdx.z, splits = gridDim.z;
  const int seq_len = seq_lens[seq];
  if (split * kDecodePartition >= seq_len) return;  // no partition here: the merge reads no state
  const int window_lo = sliding_window > 0 ? max(0, seq_len - sliding_window) : 0;
  const int token = query_start_loc[seq];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int32_t* table = block_table + seq * block_table_stride;

  __shared__ float q_s[MG][HEAD];
  __shared__ float m_s[kWarps][MG], l_s[kWarps][MG];
  __shared__ float acc_s[kWarps][MG][HEAD];
  for (int i = threadIdx.x; i < group * HEAD; i += blockDim.x) {
    const int r = i / HEAD, d = i % HEAD;
    q_s[r][d] = to_f32(q[token * q_stride + (kv_head * group + r) * HEAD + d]) * scale;
  }
  __syncthreads();

  const int t0 = (4 * lane) % BS;    // this lane's 4 tokens within a block (scores)
  const int d0 = (4 * lane) % HEAD;  // this lane's 4 dims (values)
  float m[MG], l[MG], acc[MG][4];
#pragma unroll
  for (int r = 0; r < MG; ++r) {
    m[r] = -INFINITY;
    l[r] = 0.0f;
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[r][e] = 0.0f;
  }
  for (int part = split; part * kDecodePartition < seq_len; part += splits) {
    const int lo = max(part * kDecodePartition, window_lo), hi = min(seq_len, (part + 1) * kDecodePartition);
    for (int blk = lo / BS + warp; blk * BS < hi; blk += kWarps) {
      const int64_t base = (static_cast<int64_t>(table[blk]) * num_kv_heads + kv_head) * kChunk;
      const uint4* kc = reinterpret_cast<const uint4*>(key_cache + base);
      const uint4* vc = reinterpret_cast<const uint4*>(value_cache + base);
      uint4 kv[kLoads], vv[kLoads];
#pragma unroll
      for (int i = 0; i < kLoads; ++i) {
        kv[i] = kc[i * 32 + lane];
        vv[i] = vc[i * 32 + lane];
      }
      // Scores of tokens t0 .. t0+3 for every query head.
      float s[MG][4];
#pragma unroll
      for (int r = 0; r < MG; ++r) {
#pragma unroll
        for (int j = 0; j < 4; ++j) s[r][j] = 0.0f;
      }
#pragma unroll
      for (int i = 0; i < kLoads; ++i) {
        const int dp = (i * 128 + 4 * lane) / BS;  // the pair of dims (2dp, 2dp+1) of this load
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const float2 k2 = unpack_pair<T>(word(kv[i], j));
#pragma unroll
          for (int r = 0; r < MG; ++r) {
            if (r < group) s[r][j] += q_s[r][2 * dp] * k2.x + q_s[r][2 * dp + 1] * k2.y;
          }
        }
      }
#pragma unroll
      for (int off = BS / 4; off < 32; off <<= 1) {
#pragma unroll
        for (int r = 0; r < MG; ++r) {
#pragma unroll
          for (int j = 0; j < 4; ++j) s[r][j] += __shfl_xor_sync(0xffffffffu, s[r][j], off);
        }
      }
      // Online softmax over this block, per query head.
      bool valid[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int pos = blk * BS + t0 + j;
        valid[j] = pos >= lo && pos < hi;
      }
      float p[MG][4];
#pragma unroll
      for (int r = 0; r < MG; ++r) {
        float bmax = -INFINITY;
#pragma unroll
        for (int j = 0; j < 4; ++j) bmax = fmaxf(bmax, valid[j] ? s[r][j] : -INFINITY);
#pragma unroll
        for (int off = 1; off < BS / 4; off <<= 1) bmax = fmaxf(bmax, __shfl_xor_sync(0xffffffffu, bmax, off));
        const float new_m = fmaxf(m[r], bmax);
        float bsum = 0.0f;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          p[r][j] = (valid[j] && new_m != -INFINITY) ? __expf(s[r][j] - new_m) : 0.0f;
          bsum += p[r][j];
        }
#pragma unroll
        for (int off = 1; off < BS / 4; off <<= 1) bsum += __shfl_xor_sync(0xffffffffu, bsum, off);
        const float correction = new_m == -INFINITY ? 1.0f : __expf(m[r] - new_m);
        l[r] = l[r] * correction + bsum;
        m[r] = new_m;
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[r][e] *= correction;
      }
      // Values: this lane's dims d0 .. d0+3 of the token pair of each load.
#pragma unroll
      for (int i = 0; i < kLoads; ++i) {
        const int tp = (i * 128 + 4 * lane) / HEAD;  // tokens 2tp, 2tp+1
        const int src = (2 * tp) / 4;                 // the lane whose t0 covers them
        const bool upper = (tp & 1) != 0;             // they are its tokens 2, 3 (else 0, 1)
        float2 v2[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) v2[e] = unpack_pair<T>(word(vv[i], e));
#pragma unroll
        for (int r = 0; r < MG; ++r) {
          const float p0 = __shfl_sync(0xffffffffu, p[r][0], src), p1 = __shfl_sync(0xffffffffu, p[r][1], src);
          const float p2 = __shfl_sync(0xffffffffu, p[r][2], src), p3 = __shfl_sync(0xffffffffu, p[r][3], src);
          const float pa = upper ? p2 : p0, pb = upper ? p3 : p1;
#pragma unroll
          for (int e = 0; e < 4; ++e) {  // a zero weight never multiplies a (possibly stale) value
            acc[r][e] += (pa != 0.0f ? pa * v2[e].x : 0.0f) + (pb != 0.0f ? pb * v2[e].y : 0.0f);
          }
        }
      }
    }
  }  // partitions
  // Lanes sharing d0 hold parts of the same dims.
#pragma unroll
  for (int off = HEAD / 4; off < 32; off <<= 1) {
#pragma unroll
    for (int r = 0; r < MG; ++r) {
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[r][e] += __shfl_xor_sync(0xffffffffu, acc[r][e], off);
    }
  }
  if (lane == 0) {
    for (int r = 0; r < group; ++r) {
      m_s[warp][r] = m[r];
      l_s[warp][r] = l[r];
    }
  }
  if (lane < HEAD / 4) {
    for (int r = 0; r < group; ++r) {
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_s[warp][r][d0 + e] = acc[r][e];
    }
  }
  __syncthreads();
  const int num_heads = group * num_kv_heads;
  for (int i = threadIdx.x; i < group * HEAD; i += blockDim.x) {
    const int r = i / HEAD, d = i % HEAD;
    const float3 merged = merge_warp_states(m_s, l_s, acc_s, r, d);
    const float mm = merged.x, sum = merged.y, value = merged.z;
    const int head = kv_head * group + r;
    if (splits == 1) {
      out[static_cast<int64_t>(token) * num_heads * HEAD + head * HEAD + d] =
          from_f32<T>(sum > 0.0f ? value / sum : 0.0f);
    } else {
      const int64_t state = (static_cast<int64_t>(seq) * num_heads + head) * splits + split;
      if (d == 0) {
        ws.m[state] = mm;
        ws.l[state] = sum;
      }
      ws.o[state * HEAD + d] = value;
    }
  }
}

template <class T, int HEAD>
__global__ void __launch_bounds__(HEAD)
decode_merge_kernel(T* out, const int32_t* seq_lens, const int32_t* query_start_loc, int splits, Workspace ws) {
  const int seq = blockIdx.x, head = blockIdx.y, num_heads = gridDim.y, d = threadIdx.x;
  const int used = min(splits, (seq_lens[seq] + kDecodePartition - 1) / kDecodePartition);
  const int64_t first = (static_cast<int64_t>(seq) * num_heads + head) * splits;
  float mm = -INFINITY;
  for (int p = 0; p < used; ++p) mm = fmaxf(mm, ws.m[first + p]);
  float sum = 0.0f, value = 0.0f;
  for (int p = 0; p < used; ++p) {
    const float mp = ws.m[first + p];
    if (mp == -INFINITY) continue;  // a split wholly outside the sliding window
    const float weight = __expf(mp - mm);
    sum += ws.l[first + p] * weight;
    value += ws.o[(first + p) * HEAD + d] * weight;
  }
  out[static_cast<int64_t>(query_start_loc[seq]) * num_heads * HEAD + head * HEAD + d] =
      from_f32<T>(sum > 0.0f ? value / sum : 0.0f);
}

template <class T, int HEAD, int BS, int MG>
void launch(void* out, const void* q, int64_t q_stride, const void* key_cache, const void* value_cache,
            int num_kv_heads, const int32_t* block_table, int64_t block_table_stride, const int32_t* seq_lens,
            const int32_t* query_start_loc, int64_t num_seqs, int group, float scale, int sliding_window, int splits,
            Workspace ws, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(num_seqs), static_cast<unsigned>(num_kv_heads), static_cast<unsigned>(splits));
  decode_partition_kernel<T, HEAD, BS, MG><<<grid, kWarps * 32, 0, stream>>>(
      static_cast<T*>(out), static_cast<const T*>(q), q_stride, static_cast<const T*>(key_cache),
      static_cast<const T*>(value_cache), num_kv_heads, block_table, block_table_stride, seq_lens, query_start_loc,
      group, scale, sliding_window, ws);
  check_launch("paged_attention (decode)");
  if (splits > 1) {
    const dim3 merge_grid(static_cast<unsigned>(num_seqs), static_cast<unsigned>(group * num_kv_heads));
    decode_merge_kernel<T, HEAD><<<merge_grid, HEAD, 0, stream>>>(static_cast<T*>(out), seq_lens, query_start_loc,
                                                                  splits, ws);
    check_launch("paged_attention (decode merge)");
  }
}

}  // namespace

int64_t decode_attention_splits(int64_t num_seqs, int64_t num_kv_heads, int64_t max_seq_len) {
  int device = 0, sms = 0;
  if (cudaGetDevice(&device) != cudaSuccess || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) !=
                                                   cudaSuccess) {
    cudaGetLastError();  // (no device to ask: not an error for later launches to report)
    sms = 132;          // an H100's / H200's count: the split count only affects speed
  }
  const int64_t partitions = std::max<int64_t>(1, (max_seq_len + kDecodePartition - 1) / kDecodePartition);
  const int64_t blocks = std::max<int64_t>(1, num_seqs * num_kv_heads);
  return std::clamp<int64_t>((4 * sms + blocks - 1) / blocks, 1, partitions);
}

size_t decode_attention_workspace_bytes(int64_t num_seqs, int64_t num_heads, int64_t num_kv_heads, int64_t head_size,
                                        int64_t max_seq_len) {
  const int64_t splits = decode_attention_splits(num_seqs, num_kv_heads, max_seq_len);
  if (splits <= 1) return 0;
  return static_cast<size_t>(num_seqs * num_heads * splits * (head_size + 2)) * sizeof(float);
}

bool decode_attention_applies(int64_t head_size, int64_t block_size, int64_t group, DType dtype) {
  return dtype != DType::F32 && (head_size == 16 || head_size == 32 || head_size == 64 || head_size == 128) &&
         block_size == kBlockSize && group >= 1 && group <= kMaxGroup;
}

void decode_attention(void* out, const void* q, int64_t q_stride, const void* key_cache, const void* value_cache,
                      int64_t num_kv_heads, int64_t head_size, int64_t block_size, const int32_t* block_table,
                      int64_t block_table_stride, const int32_t* seq_lens, const int32_t* query_start_loc,
                      int64_t num_seqs, int64_t num_heads, float scale, int64_t sliding_window, int64_t max_seq_len,
                      void* workspace, DType dtype, cudaStream_t stream) {
  const int group = static_cast<int>(num_heads / num_kv_heads);
  CORELLM_CHECK(decode_attention_applies(head_size, block_size, group, dtype),
                "paged_attention chose the decode kernel for a shape it does not take");
  const int splits = static_cast<int>(decode_attention_splits(num_seqs, num_kv_heads, max_seq_len));
  CORELLM_CHECK_ARG(splits == 1 || workspace != nullptr, "paged_attention (decode): max_seq_len ", max_seq_len,
                    " needs a workspace of ",
                    decode_attention_workspace_bytes(num_seqs, num_heads, num_kv_heads, head_size, max_seq_len),
                    " bytes");
  const int64_t states = num_seqs * num_heads * splits;
  float* base = static_cast<float*>(workspace);
  const Workspace ws{base, base ? base + states : nullptr, base ? base + 2 * states : nullptr};
  const int kvh = static_cast<int>(num_kv_heads), window = static_cast<int>(sliding_window);
  auto run = [&](auto tag, auto head_c, auto group_c) {
    using T = decltype(tag);
    launch<T, decltype(head_c)::value, kBlockSize, decltype(group_c)::value>(
        out, q, q_stride, key_cache, value_cache, kvh, block_table, block_table_stride, seq_lens, query_start_loc,
        num_seqs, group, scale, window, splits, ws, stream);
  };
  auto by_group = [&](auto tag, auto head_c) {  // registers for 2, 4 or 8 query heads
    if (group <= 2) run(tag, head_c, std::integral_constant<int, 2>{});
    else if (group <= 4) run(tag, head_c, std::integral_constant<int, 4>{});
    else run(tag, head_c, std::integral_constant<int, 8>{});
  };
  auto by_head = [&](auto tag) {
    if (head_size == 16) by_group(tag, std::integral_constant<int, 16>{});
    else if (head_size == 32) by_group(tag, std::integral_constant<int, 32>{});
    else if (head_size == 64) by_group(tag, std::integral_constant<int, 64>{});
    else by_group(tag, std::integral_constant<int, 128>{});
  };
  if (dtype == DType::BF16) by_head(__nv_bfloat16{});
  else by_head(__half{});
}

}  // namespace corellm::cuda
