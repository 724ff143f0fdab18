// The CUDA kernels' launchers, on raw device addresses (no CUDA or torch types), for the binding
// module corellm._cuda. Layouts are those of the CPU kernels (cpp/include/corellm/kernels/), so
// that corellm.ops passes the same arguments whichever device holds the tensors. Every launcher
// enqueues on `stream` (a cudaStream_t as an integer) and throws std::runtime_error on a failed
// launch, corellm::InvalidArgument (check.h's CORELLM_CHECK_ARG: a ValueError) on a bad argument.
#pragma once

#include <cstdint>
#include <string>

#include "corellm/kernels/rejection_sampler.h"
#include "corellm/kernels/sampler.h"

namespace corellm::cuda {

enum class DType : int32_t { F32 = 0, BF16 = 1, F16 = 2 };

// The head sizes paged_attention is built for: those of the supported architectures' models
// (64, 80, 96, 128, 256) and of the tests' tiny ones (16, 32). corellm._cuda exports the list, so
// that a model is checked against it when it loads.
inline constexpr int kAttentionHeadSizes[] = {16, 32, 64, 80, 96, 128, 256};

bool is_attention_head_size(int64_t head_size);
std::string attention_head_sizes_text();  // "16, 32, ..., 256"

// out[t] = w * round(x[t] / rms(x[t])) (HF's order), one block per token.
void rms_norm(void* out, int64_t out_stride, const void* x, int64_t x_stride, const void* weight,
              int64_t num_tokens, int64_t hidden, float eps, DType dtype, std::uintptr_t stream);

// residual = x + residual (rounded to the dtype); x = rms_norm(residual). In place.
void fused_add_rms_norm(void* x, int64_t x_stride, void* residual, int64_t residual_stride, const void* weight,
                        int64_t num_tokens, int64_t hidden, float eps, DType dtype, std::uintptr_t stream);

// out[t, i] = silu(x[t, i]) * x[t, d + i].
void silu_and_mul(void* out, int64_t out_stride, const void* x, int64_t x_stride, int64_t num_tokens, int64_t d,
                  DType dtype, std::uintptr_t stream);

// out[t, i] = gelu_tanh(x[t, i]) * x[t, d + i] (GeGLU: GELU's tanh approximation).
void gelu_tanh_and_mul(void* out, int64_t out_stride, const void* x, int64_t x_stride, int64_t num_tokens,
                       int64_t d, DType dtype, std::uintptr_t stream);

// In place on the first rot_dim dims of every q and k head; cache [max_position, rot_dim] fp32
// (cos then sin). NeoX (halves) or GPT-J (interleaved pairs) style.
void rotary_embedding(const int32_t* positions, void* q, int64_t q_stride, void* k, int64_t k_stride,
                      const float* cos_sin_cache, int64_t max_position, int64_t num_tokens, int64_t num_heads,
                      int64_t num_kv_heads, int64_t head_size, int64_t rot_dim, bool is_neox, DType dtype,
                      std::uintptr_t stream);

// Writes token t's K and V into slot slot_mapping[t] of the paged cache (K [blocks, kv heads,
// head_size / x, block_size, x], V [blocks, kv heads, block_size / x, head_size, x], x = 2 for
// 16-bit dtypes, 1 for fp32). A negative slot (a padded token) is skipped, and so is one past the
// cache's num_blocks x block_size slots (a kernel cannot raise; the engine never produces one).
void reshape_and_cache(const void* key, int64_t key_stride, const void* value, int64_t value_stride,
                       void* key_cache, void* value_cache, const int32_t* slot_mapping, int64_t num_tokens,
                       int64_t num_blocks, int64_t num_kv_heads, int64_t head_size, int64_t block_size, DType dtype,
                       std::uintptr_t stream);

// Causal attention of each sequence's query tokens (its last ones) over its cached K/V (the CPU
// kernel's arguments, plus max_query_len: the grid's extent, known to the caller without reading
// device memory). out [num_tokens, num_heads * head_size] contiguous; head_size one of
// kAttentionHeadSizes (std::invalid_argument otherwise).
// A batch of one query token per sequence (max_query_len 1) in a 16-bit dtype takes the decode
// kernel, split over partitions of the context: max_seq_len sizes its grid (a captured graph
// passes the longest sequence it will see) and the workspace holds the partitions' states
// (paged_attention_workspace_size bytes; null when that is 0).
void paged_attention(void* out, const void* q, int64_t q_stride, const void* key_cache, const void* value_cache,
                     int64_t num_blocks, int64_t num_kv_heads, int64_t head_size, int64_t block_size,
                     const int32_t* block_table, int64_t block_table_stride, const int32_t* seq_lens,
                     const int32_t* query_start_loc, int64_t num_seqs, int64_t num_heads, float scale,
                     int64_t sliding_window, int64_t max_query_len, int64_t max_seq_len, void* workspace,
                     DType dtype, std::uintptr_t stream);

// Workspace bytes paged_attention needs for this batch (0: none).
int64_t paged_attention_workspace_size(int64_t num_seqs, int64_t num_heads, int64_t num_kv_heads, int64_t head_size,
                                       int64_t block_size, int64_t max_query_len, int64_t max_seq_len, DType dtype);

// The scaled low-precision GEMM (W8A8): out[i, j] = bf16(a_scales[i] * b_scales[j] * sum_k a[i, k] b[j, k]),
// the sum exact in int32 for int8, in the tensor cores' fp32 for fp8 e4m3. a holds the activations
// (quantize_rows makes them), b the weight's rows; a scale vector has a value per row (column) or
// one for all (a per-tensor scale). Built on CUTLASS 3.x for Hopper (sm_90a); needs k a multiple of
// 16, n and out_stride multiples of 8, 16-byte aligned a and b, and a device of compute capability
// 9.0 (corellm::InvalidArgument naming what is wrong otherwise).
enum class ScaledType : int32_t { FP8_E4M3 = 0, INT8 = 1 };

struct ScaledGemmProblem {
  ScaledType type = ScaledType::FP8_E4M3;
  const void* a = nullptr;  // [m, k] row-major, contiguous
  const void* b = nullptr;  // [n, k] row-major, contiguous
  const float* a_scales = nullptr;
  bool a_scales_per_row = true;  // a_scales [m], else [1]
  const float* b_scales = nullptr;
  bool b_scales_per_column = true;  // b_scales [n], else [1]
  void* out = nullptr;              // bf16 [m, n] with row stride out_stride
  int64_t out_stride = 0;
  int64_t m = 0, n = 0, k = 0;
};

// Whether this build holds the CUTLASS kernels (CUTLASS's headers were found and sm_90a was built).
bool scaled_gemm_built();
void scaled_gemm(const ScaledGemmProblem& problem, std::uintptr_t stream);

// Dynamic per-row quantization of activations for scaled_gemm: scales[i] = max_k |x[i, k]| / R
// (R = 448 for fp8 e4m3, 127 for int8; 1 for a row of zeros), q[i, k] = x[i, k] / scales[i]
// rounded to the type (fp8: to nearest, saturating; int8: to nearest even, in [-127, 127]).
// x [m, k] with row stride x_stride in dtype; q [m, k] contiguous.
void quantize_rows(void* q, float* scales, const void* x, int64_t x_stride, int64_t m, int64_t k, ScaledType type,
                   DType dtype, std::uintptr_t stream);

// The CPU sampler's contract (cpp/include/corellm/kernels/sampler.h) with every array in device
// memory: one row per request, logits processed in place. Parameter values are validated before
// they reach the device (the engine's InputProcessor); token ids outside the vocabulary are
// ignored. num_logprobs is at most 1024 here. Scratch (the raw rows for logprobs, the marks for
// penalties) comes from the stream-ordered allocator and is freed on the stream.
void sample(const SamplingBatch& batch, std::uintptr_t stream);

// The CPU rejection sampler's contract (cpp/include/corellm/kernels/rejection_sampler.h) with every
// array in device memory; the arrays' values are the model runner's, not checked on the device.
void rejection_sample(const RejectionBatch& batch, std::uintptr_t stream);

}  // namespace corellm::cuda
