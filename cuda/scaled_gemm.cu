// The scaled low-precision GEMM's launcher (the problem and the device checked, then the CUTLASS
// sm_90a kernels of cutlass/scaled_gemm_sm90.cuh when this build holds them) and the dynamic
// per-row quantization that makes its activations: one block per row finds max |x|, then writes
// x / scale rounded to the type.
#include <cuda_fp8.h>

#include <algorithm>
#include <atomic>
#include <string>

#include "common.cuh"
#ifdef CORELLM_CUTLASS_SM90
#include "cutlass/scaled_gemm_sm90.h"
#endif

namespace corellm::cuda {
namespace {

const char* scaled_type_name(ScaledType type) { return type == ScaledType::FP8_E4M3 ? "fp8 e4m3" : "int8"; }

float scaled_type_max(ScaledType type) { return type == ScaledType::FP8_E4M3 ? 448.0f : 127.0f; }

template <class T, ScaledType TYPE>
__global__ void quantize_rows_kernel(void* q, float* scales, const T* x, int64_t x_stride, int64_t k, float type_max) {
  const T* row = x + blockIdx.x * x_stride;
  float amax = 0.0f;
  for (int64_t i = threadIdx.x; i < k; i += blockDim.x) amax = fmaxf(amax, fabsf(to_f32(row[i])));
  amax = block_max_nonnegative(amax);
  const float scale = amax > 0.0f ? amax / type_max : 1.0f;
  if (threadIdx.x == 0) scales[blockIdx.x] = scale;
  for (int64_t i = threadIdx.x; i < k; i += blockDim.x) {
    const float v = to_f32(row[i]) / scale;
    if constexpr (TYPE == ScaledType::FP8_E4M3) {
      static_cast<__nv_fp8_storage_t*>(q)[blockIdx.x * k + i] = __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
    } else {
      static_cast<int8_t*>(q)[blockIdx.x * k + i] =
          static_cast<int8_t>(max(-127, min(127, __float2int_rn(v))));
    }
  }
}

bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

#ifdef CORELLM_CUTLASS_SM90
// The current device's compute capability (major * 10 + minor), asked of the driver once per
// device (a call inside a CUDA graph capture then only reads the thread's current device).
int device_capability() {
  static std::atomic<int> known[64] = {};
  int device = 0;
  cudaGetDevice(&device);
  if (device < 0 || device >= 64) device = 63;
  int value = known[device].load(std::memory_order_relaxed);
  if (value == 0) {
    int major = 0, minor = 0;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
    value = major * 10 + minor;
    known[device].store(value, std::memory_order_relaxed);
  }
  return value;
}
#endif

}  // namespace

bool scaled_gemm_built() {
#ifdef CORELLM_CUTLASS_SM90
  return true;
#else
  return false;
#endif
}

void scaled_gemm(const ScaledGemmProblem& p, std::uintptr_t stream) {
  CORELLM_CHECK_ARG(p.type == ScaledType::FP8_E4M3 || p.type == ScaledType::INT8, "scaled_gemm: unknown type tag ",
                    static_cast<int>(p.type));
  CORELLM_CHECK_ARG(p.m >= 0 && p.n > 0 && p.k > 0, "scaled_gemm: bad shape m ", p.m, ", n ", p.n, ", k ", p.k);
  CORELLM_CHECK_ARG(p.k % 16 == 0 && p.n % 8 == 0 && p.out_stride % 8 == 0 && p.out_stride >= p.n,
                    "scaled_gemm (", scaled_type_name(p.type), "): needs k a multiple of 16 and n, out_stride ",
                    "multiples of 8 (got n ", p.n, ", k ", p.k, ", out_stride ", p.out_stride, ")");
  CORELLM_CHECK_ARG(aligned16(p.a) && aligned16(p.b) && aligned16(p.out),
                    "scaled_gemm: a, b and out must be 16-byte aligned");
  CORELLM_CHECK_ARG(p.a_scales != nullptr && p.b_scales != nullptr, "scaled_gemm: missing scales");
#ifdef CORELLM_CUTLASS_SM90
  const int capability = device_capability();
  CORELLM_CHECK_ARG(capability == 90, "scaled_gemm: the ", scaled_type_name(p.type),
                    " kernels are built for Hopper (sm_90a); this GPU has compute capability ", capability / 10, ".",
                    capability % 10);
  if (p.m == 0) return;
  if (p.type == ScaledType::FP8_E4M3) {
    sm90::scaled_gemm_fp8(p, as_stream(stream));
  } else {
    sm90::scaled_gemm_int8(p, as_stream(stream));
  }
  check_launch("scaled_gemm");
#else
  CORELLM_CHECK_ARG(false, "scaled_gemm: this corellm._cuda was built without CUTLASS's sm_90a kernels (CUTLASS's ",
                    "headers were not found, or sm_90a was not among CMAKE_CUDA_ARCHITECTURES); install ",
                    "nvidia-cutlass (pip install --no-deps nvidia-cutlass) and rebuild");
  (void)stream;
#endif
}

void quantize_rows(void* q, float* scales, const void* x, int64_t x_stride, int64_t m, int64_t k, ScaledType type,
                   DType dtype, std::uintptr_t stream) {
  CORELLM_CHECK_ARG(type == ScaledType::FP8_E4M3 || type == ScaledType::INT8, "quantize_rows: unknown type tag ",
                    static_cast<int>(type));
  CORELLM_CHECK_ARG(m >= 0 && k > 0 && x_stride >= k, "quantize_rows: bad shape m ", m, ", k ", k, ", x_stride ",
                    x_stride);
  if (m == 0) return;
  const int threads = static_cast<int>(std::min<int64_t>(1024, std::max<int64_t>(32, (k / 4 + 31) / 32 * 32)));
  dispatch("quantize_rows", dtype, [&](auto zero) {
    using T = decltype(zero);
    const auto* xt = static_cast<const T*>(x);
    if (type == ScaledType::FP8_E4M3) {
      quantize_rows_kernel<T, ScaledType::FP8_E4M3><<<static_cast<unsigned>(m), threads, 0, as_stream(stream)>>>(
          q, scales, xt, x_stride, k, scaled_type_max(type));
    } else {
      quantize_rows_kernel<T, ScaledType::INT8><<<static_cast<unsigned>(m), threads, 0, as_stream(stream)>>>(
          q, scales, xt, x_stride, k, scaled_type_max(type));
    }
  });
  check_launch("quantize_rows");
}

}  // namespace corellm::cuda
