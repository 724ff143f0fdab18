// Prefill attention on tensor cores (FlashAttention-2's loop, with WMMA 16x16x16 bf16/fp16 tiles and
// fp32 accumulators): causal attention of a sequence's query tokens over its paged K/V.
//
// One thread block per (sequence, tile of 64 query tokens, query head); its 4 warps own 16 query
// rows each. For each tile of 64 keys the row may see (causal, sliding window):
//   1. the block copies the tile's K and V from the paged cache into shared memory, token-major
//      (K's pairs of dims and V's pairs of tokens are 32-bit words of the cache; keys past the
//      last visible one are zero, so that no stale value reaches a product);
//   2. each warp computes S = Q K^T for its rows (4 fragments of 16 keys);
//   3. online softmax per row in shared memory (two lanes per row): masked scores, the running
//      max and sum, P = exp(S - max) rounded to the dtype, and the rescaling of the row's output;
//   4. O += P V on tensor cores, O kept in shared memory (fp32) between tiles.
// At the end each row is divided by its sum and written once. Sequences with fewer than
// kPrefillMinQueryLen query tokens are left to the scalar kernel.
#include <mma.h>

#include <string>
#include <type_traits>

#include "common.cuh"
#include "prefill_attention.cuh"

namespace corellm::cuda {
namespace {

using namespace nvcuda;

constexpr int kWarps = 4;
constexpr int kRows = 16 * kWarps;  // query tokens per thread block
constexpr int kKeys = 64;           // keys per tile
constexpr int kBlockSize = 16;      // the KV block size the kernel is built for

// Shared-memory layout (every array 32-byte aligned, as WMMA's loads and stores want; rows padded
// against bank conflicts).
template <class T, int HEAD>
struct Layout {
  static_assert(HEAD % 16 == 0, "WMMA tiles are 16 dims wide");
  static constexpr int kLd = HEAD + 8;        // Q, K, V rows (16-bit)
  static constexpr int kLdS = kKeys + 4;      // scores (fp32)
  static constexpr int kLdP = kKeys + 8;      // probabilities (16-bit)
  static constexpr int kLdO = HEAD + 4;       // outputs (fp32)
  static constexpr size_t kQ = 0;
  static constexpr size_t kK = kQ + sizeof(T) * kRows * kLd;
  static constexpr size_t kV = kK + sizeof(T) * kKeys * kLd;
  static constexpr size_t kS = kV + sizeof(T) * kKeys * kLd;
  static constexpr size_t kP = kS + sizeof(float) * kRows * kLdS;
  static constexpr size_t kO = kP + sizeof(T) * kRows * kLdP;
  static constexpr size_t kM = kO + sizeof(float) * kRows * kLdO;
  static constexpr size_t kL = kM + sizeof(float) * kRows;
  static constexpr size_t kBytes = kL + sizeof(float) * kRows;
  static_assert(kK % 32 == 0 && kV % 32 == 0 && kS % 32 == 0 && kP % 32 == 0 && kO % 32 == 0, "alignment");
};

// acc[N/16] (16 x N, fp32) += A (16 x K, row-major, lda) x B (K x N, ldb, in BLayout: col_major
// for a token-major K read as K^T, row_major for a token-major V), on one warp's tensor cores.
template <class T, int K, int N, class BLayout>
__device__ __forceinline__ void warp_mma(wmma::fragment<wmma::accumulator, 16, 16, 16, float> (&acc)[N / 16],
                                         const T* a, int lda, const T* b, int ldb) {
  constexpr bool kColMajor = std::is_same_v<BLayout, wmma::col_major>;
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk) {
    wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> fa;
    wmma::load_matrix_sync(fa, a + kk * 16, lda);
#pragma unroll
    for (int j = 0; j < N / 16; ++j) {
      wmma::fragment<wmma::matrix_b, 16, 16, 16, T, BLayout> fb;
      wmma::load_matrix_sync(fb, kColMajor ? b + j * 16 * ldb + kk * 16 : b + kk * 16 * ldb + j * 16, ldb);
      wmma::mma_sync(acc[j], fa, fb, acc[j]);
    }
  }
}

template <class T, int HEAD>
__global__ void __launch_bounds__(kWarps * 32)
prefill_attention_kernel(T* out, const T* q, int64_t q_stride, const T* key_cache, const T* value_cache,
                         int num_kv_heads, int group, const int32_t* block_table, int64_t block_table_stride,
                         const int32_t* seq_lens, const int32_t* query_start_loc, float scale, int sliding_window) {
  using L = Layout<T, HEAD>;
  constexpr int kLd = L::kLd, kLdS = L::kLdS, kLdP = L::kLdP, kLdO = L::kLdO;
  constexpr int kChunk = HEAD * kBlockSize;  // values of one (block, KV head) chunk
  const int seq = blockIdx.x, head = blockIdx.z;
  const int q0 = query_start_loc[seq];
  const int q_len = query_start_loc[seq + 1] - q0;
  const int row_begin = blockIdx.y * kRows;
  if (q_len < kPrefillMinQueryLen || row_begin >= q_len) return;
  const int rows = min(kRows, q_len - row_begin);
  const int seq_len = seq_lens[seq], context = seq_len - q_len;
  const int kv_head = head / group, num_heads = group * num_kv_heads;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int32_t* table = block_table + seq * block_table_stride;

  extern __shared__ __align__(128) unsigned char smem[];
  T* q_s = reinterpret_cast<T*>(smem + L::kQ);
  T* k_s = reinterpret_cast<T*>(smem + L::kK);
  T* v_s = reinterpret_cast<T*>(smem + L::kV);
  float* s_w = reinterpret_cast<float*>(smem + L::kS) + warp * 16 * kLdS;  // this warp's rows
  T* p_w = reinterpret_cast<T*>(smem + L::kP) + warp * 16 * kLdP;
  float* o_w = reinterpret_cast<float*>(smem + L::kO) + warp * 16 * kLdO;
  float* m_s = reinterpret_cast<float*>(smem + L::kM);
  float* l_s = reinterpret_cast<float*>(smem + L::kL);

  for (int i = threadIdx.x; i < kRows * HEAD; i += blockDim.x) {
    const int r = i / HEAD, d = i % HEAD;
    q_s[r * kLd + d] = r < rows ? q[(q0 + row_begin + r) * q_stride + head * HEAD + d] : from_f32<T>(0.0f);
  }
  for (int i = threadIdx.x; i < kRows * kLdO; i += blockDim.x) reinterpret_cast<float*>(smem + L::kO)[i] = 0.0f;
  for (int i = threadIdx.x; i < kRows; i += blockDim.x) {
    m_s[i] = -INFINITY;
    l_s[i] = 0.0f;
  }
  __syncthreads();

  // This lane's row (two lanes per row) and half of the columns, in steps 3 and at the end.
  const int r = lane / 2, half = lane % 2;
  const int row = warp * 16 + r;  // within the tile
  const bool row_valid = row < rows;
  const int qpos = context + row_begin + row;
  // The keys any row of the tile may see: [lo, hi).
  const int hi = context + row_begin + rows;
  const int lo = sliding_window > 0 ? max(0, context + row_begin - sliding_window + 1) : 0;

  for (int key0 = (lo / kKeys) * kKeys; key0 < hi; key0 += kKeys) {
    // 1. K and V of keys key0 .. key0+63 (4 KV blocks), token-major.
    for (int w = threadIdx.x; w < kKeys * HEAD / 2; w += blockDim.x) {
      const int kb = w / (HEAD * 8), rem = w % (HEAD * 8);
      uint32_t kword = 0, vword = 0;
      const int first_key = key0 + kb * kBlockSize;
      const int dp = rem / kBlockSize, t = rem % kBlockSize;  // K: dims 2dp, 2dp+1 of token t
      const int tp = rem / HEAD, d = rem % HEAD;              // V: tokens 2tp, 2tp+1 at dim d
      if (first_key < hi) {
        const int64_t base = (static_cast<int64_t>(table[first_key / kBlockSize]) * num_kv_heads + kv_head) * kChunk;
        if (first_key + t < hi) kword = reinterpret_cast<const uint32_t*>(key_cache + base)[dp * kBlockSize + t];
        if (first_key + 2 * tp < hi) {
          vword = reinterpret_cast<const uint32_t*>(value_cache + base)[tp * HEAD + d];
          if (first_key + 2 * tp + 1 >= hi) vword &= 0xFFFFu;  // the pair's second token is past the end
        }
      }
      *reinterpret_cast<uint32_t*>(k_s + (kb * kBlockSize + t) * kLd + 2 * dp) = kword;
      reinterpret_cast<uint16_t*>(v_s)[(kb * kBlockSize + 2 * tp) * kLd + d] = static_cast<uint16_t>(vword & 0xFFFFu);
      reinterpret_cast<uint16_t*>(v_s)[(kb * kBlockSize + 2 * tp + 1) * kLd + d] = static_cast<uint16_t>(vword >> 16);
    }
    __syncthreads();

    // 2. S = Q K^T for this warp's 16 rows x 64 keys.
    {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[kKeys / 16];
#pragma unroll
      for (int j = 0; j < kKeys / 16; ++j) wmma::fill_fragment(acc[j], 0.0f);
      warp_mma<T, HEAD, kKeys, wmma::col_major>(acc, q_s + warp * 16 * kLd, kLd, k_s, kLd);  // K^T: (dim, key)
#pragma unroll
      for (int j = 0; j < kKeys / 16; ++j) wmma::store_matrix_sync(s_w + j * 16, acc[j], kLdS, wmma::mem_row_major);
    }
    __syncwarp();

    // 3. Online softmax of row r over columns half*32 .. +32, with its partner lane.
    {
      float* s_row = s_w + r * kLdS;
      T* p_row = p_w + r * kLdP;
      float mx = -INFINITY;
      for (int c = half * 32; c < half * 32 + 32; ++c) {
        const int key = key0 + c;
        const bool visible = row_valid && key <= qpos && (sliding_window <= 0 || key > qpos - sliding_window);
        const float v = visible ? s_row[c] * scale : -INFINITY;
        s_row[c] = v;
        mx = fmaxf(mx, v);
      }
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      const float m_old = m_s[row];
      const float m_new = fmaxf(m_old, mx);
      float sum = 0.0f;
      for (int c = half * 32; c < half * 32 + 32; ++c) {
        const float v = s_row[c];
        const T pv = from_f32<T>(m_new == -INFINITY || v == -INFINITY ? 0.0f : __expf(v - m_new));
        p_row[c] = pv;
        sum += to_f32(pv);  // the sum of what P V multiplies
      }
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      const float correction = m_new == -INFINITY ? 1.0f : __expf(m_old - m_new);
      __syncwarp();
      if (half == 0) {
        m_s[row] = m_new;
        l_s[row] = l_s[row] * correction + sum;
      }
      for (int d = half * (HEAD / 2); d < (half + 1) * (HEAD / 2); ++d) o_w[r * kLdO + d] *= correction;
    }
    __syncwarp();

    // 4. O += P V for this warp's rows.
    {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[HEAD / 16];
#pragma unroll
      for (int j = 0; j < HEAD / 16; ++j) wmma::load_matrix_sync(acc[j], o_w + j * 16, kLdO, wmma::mem_row_major);
      warp_mma<T, kKeys, HEAD, wmma::row_major>(acc, p_w, kLdP, v_s, kLd);  // V: (key, dim)
#pragma unroll
      for (int j = 0; j < HEAD / 16; ++j) wmma::store_matrix_sync(o_w + j * 16, acc[j], kLdO, wmma::mem_row_major);
    }
    __syncthreads();  // every warp is done with this K/V tile before the next one is copied in
  }

  if (row_valid) {
    const float l = l_s[row];
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    T* out_row = out + static_cast<int64_t>(q0 + row_begin + row) * num_heads * HEAD + head * HEAD;
    for (int d = half * (HEAD / 2); d < (half + 1) * (HEAD / 2); ++d) out_row[d] = from_f32<T>(o_w[r * kLdO + d] * inv);
  }
}

template <class T, int HEAD>
void launch(void* out, const void* q, int64_t q_stride, const void* key_cache, const void* value_cache,
            int num_kv_heads, int group, const int32_t* block_table, int64_t block_table_stride,
            const int32_t* seq_lens, const int32_t* query_start_loc, int64_t num_seqs, int64_t num_heads,
            int64_t max_query_len, float scale, int sliding_window, cudaStream_t stream) {
  constexpr size_t bytes = Layout<T, HEAD>::kBytes;
  auto kernel = prefill_attention_kernel<T, HEAD>;
  const cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               static_cast<int>(bytes));
  if (err != cudaSuccess) {
    throw std::runtime_error(std::string("paged_attention (prefill): ") + std::to_string(bytes) +
                             " bytes of shared memory: " + cudaGetErrorString(err));
  }
  const dim3 grid(static_cast<unsigned>(num_seqs), static_cast<unsigned>((max_query_len + kRows - 1) / kRows),
                  static_cast<unsigned>(num_heads));
  kernel<<<grid, kWarps * 32, bytes, stream>>>(static_cast<T*>(out), static_cast<const T*>(q), q_stride,
                                               static_cast<const T*>(key_cache), static_cast<const T*>(value_cache),
                                               num_kv_heads, group, block_table, block_table_stride, seq_lens,
                                               query_start_loc, scale, sliding_window);
  check_launch("paged_attention (prefill)");
}

}  // namespace

// Shared memory a thread block may opt in to on the current device (0 when there is none to ask).
int max_shared_memory_optin() {
  int device = 0, bytes = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess) {
    cudaGetLastError();  // (no device to ask: not an error for later launches to report)
    return 0;
  }
  return bytes;
}

bool prefill_attention_applies(int64_t head_size, int64_t block_size, DType dtype) {
  if (dtype == DType::F32 || block_size != kBlockSize) return false;
  size_t bytes = 0;  // (every dtype here is 16-bit: bf16's layout is fp16's)
  if (!dispatch_head_size(head_size, [&](auto head_c) { bytes = Layout<__half, decltype(head_c)::value>::kBytes; })) {
    return false;
  }
  return bytes <= static_cast<size_t>(max_shared_memory_optin());  // head 256 fits on sm_90, not on sm_80
}

void prefill_attention(void* out, const void* q, int64_t q_stride, const void* key_cache, const void* value_cache,
                       int64_t num_kv_heads, int64_t head_size, int64_t block_size, const int32_t* block_table,
                       int64_t block_table_stride, const int32_t* seq_lens, const int32_t* query_start_loc,
                       int64_t num_seqs, int64_t num_heads, float scale, int64_t sliding_window, int64_t max_query_len,
                       DType dtype, cudaStream_t stream) {
  CORELLM_CHECK(prefill_attention_applies(head_size, block_size, dtype),
                "paged_attention chose the prefill kernel for a shape it does not take");
  const int kvh = static_cast<int>(num_kv_heads), group = static_cast<int>(num_heads / num_kv_heads);
  const int window = static_cast<int>(sliding_window);
  auto run = [&](auto tag, auto head_c) {
    launch<decltype(tag), decltype(head_c)::value>(out, q, q_stride, key_cache, value_cache, kvh, group, block_table,
                                                   block_table_stride, seq_lens, query_start_loc, num_seqs, num_heads,
                                                   max_query_len, scale, window, stream);
  };
  auto by_head = [&](auto tag) { dispatch_head_size(head_size, [&](auto head_c) { run(tag, head_c); }); };
  if (dtype == DType::BF16) by_head(__nv_bfloat16{});
  else by_head(__half{});
}

}  // namespace corellm::cuda
