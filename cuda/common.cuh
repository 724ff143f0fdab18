// Device helpers shared by the CUDA kernels: dtype conversions, block reductions, dispatch on the
// dtype tag and on the head size, and the launch check that turns a CUDA error into an exception
// naming the op.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <iterator>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

#include "corellm/check.h"
#include "kernels.h"

namespace corellm::cuda {

template <class T>
__device__ __forceinline__ float to_f32(T v);
template <>
__device__ __forceinline__ float to_f32<float>(float v) { return v; }
template <>
__device__ __forceinline__ float to_f32<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }
template <>
__device__ __forceinline__ float to_f32<__half>(__half v) { return __half2float(v); }

template <class T>
__device__ __forceinline__ T from_f32(float v);
template <>
__device__ __forceinline__ float from_f32<float>(float v) { return v; }
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <>
__device__ __forceinline__ __half from_f32<__half>(float v) { return __float2half_rn(v); }

// v rounded to T and back: the value a T-typed intermediate would hold.
template <class T>
__device__ __forceinline__ float round_to(float v) { return to_f32<T>(from_f32<T>(v)); }

struct SumOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return a + b; }
};
struct MaxOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

// v reduced by `op` over the warp; every lane gets it.
template <class Op>
__device__ __forceinline__ float warp_reduce(float v, Op op) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

__device__ __forceinline__ float warp_sum(float v) { return warp_reduce(v, SumOp{}); }

// v reduced by `op` over the block (blockDim.x a multiple of 32, at most 1024; the second pass's
// lanes past the block's warps hold `identity`); every thread gets it.
template <class Op>
__device__ __forceinline__ float block_reduce(float v, Op op, float identity) {
  __shared__ float partial[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  v = warp_reduce(v, op);
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  const int warps = blockDim.x / 32;
  v = lane < warps ? partial[lane] : identity;
  v = warp_reduce(v, op);
  __syncthreads();  // partial[] may be reused by the caller's next reduction
  return v;
}

// The sum of v over the block; every thread gets it.
__device__ __forceinline__ float block_sum(float v) { return block_reduce(v, SumOp{}, 0.0f); }

// The maximum of v (>= 0) over the block; every thread gets it.
__device__ __forceinline__ float block_max_nonnegative(float v) { return block_reduce(v, MaxOp{}, 0.0f); }

// Online-softmax states kept per warp in shared memory (max m, sum l, unnormalised output acc
// over dims), merged for row r at dim d: {the merged max, the sum and the output at d relative to
// it}. A warp that saw no key (m = -inf) adds nothing.
template <int WARPS, int ROWS, int HEAD>
__device__ __forceinline__ float3 merge_warp_states(const float (&m_s)[WARPS][ROWS], const float (&l_s)[WARPS][ROWS],
                                                    const float (&acc_s)[WARPS][ROWS][HEAD], int r, int d) {
  float mm = -INFINITY;
  for (int w = 0; w < WARPS; ++w) mm = fmaxf(mm, m_s[w][r]);
  float sum = 0.0f, value = 0.0f;
  for (int w = 0; w < WARPS; ++w) {
    if (m_s[w][r] == -INFINITY) continue;
    const float weight = __expf(m_s[w][r] - mm);
    sum += l_s[w][r] * weight;
    value += acc_s[w][r][d] * weight;
  }
  return make_float3(mm, sum, value);
}

inline void check_launch(const char* op) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) throw std::runtime_error(std::string(op) + ": CUDA launch failed: " + cudaGetErrorString(err));
}

// Calls f(T{}) with T the C++ type of the dtype tag.
template <class F>
void dispatch(const char* op, DType dtype, F&& f) {
  switch (dtype) {
    case DType::F32: f(float{}); return;
    case DType::BF16: f(__nv_bfloat16{}); return;
    case DType::F16: f(__half{}); return;
  }
  CORELLM_CHECK_ARG(false, op, ": unknown dtype tag ", static_cast<int>(dtype));
}

// Calls f(std::integral_constant<int, H>{}) for the H of kAttentionHeadSizes equal to head_size;
// false when there is none.
template <class F, size_t... I>
bool dispatch_head_size_in(int64_t head_size, F&& f, std::index_sequence<I...>) {
  return ((head_size == kAttentionHeadSizes[I] ? (f(std::integral_constant<int, kAttentionHeadSizes[I]>{}), true)
                                               : false) ||
          ...);
}
template <class F>
bool dispatch_head_size(int64_t head_size, F&& f) {
  return dispatch_head_size_in(head_size, f, std::make_index_sequence<std::size(kAttentionHeadSizes)>{});
}

inline cudaStream_t as_stream(std::uintptr_t stream) { return reinterpret_cast<cudaStream_t>(stream); }

}  // namespace corellm::cuda
