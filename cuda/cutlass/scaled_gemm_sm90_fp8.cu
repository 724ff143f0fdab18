// The fp8 e4m3 instantiation of the CUTLASS scaled GEMM (scaled_gemm_sm90.cuh).
#include "scaled_gemm_sm90.cuh"

namespace corellm::cuda::sm90 {

void scaled_gemm_fp8(const ScaledGemmProblem& problem, cudaStream_t stream) {
  // Fast accumulation: the tensor cores' own fp32 sums, not promoted every few k-blocks (as
  // cuBLAS and vLLM run fp8 inference); the tests bound the error it brings.
  detail::run_for_m<cutlass::float_e4m3_t, float, cutlass::gemm::KernelTmaWarpSpecializedPingpongFP8FastAccum>(
      problem, stream);
}

}  // namespace corellm::cuda::sm90
