// The int8 instantiation of the CUTLASS scaled GEMM (scaled_gemm_sm90.cuh): exact int32 sums.
#include "scaled_gemm_sm90.cuh"

namespace corellm::cuda::sm90 {

void scaled_gemm_int8(const ScaledGemmProblem& problem, cudaStream_t stream) {
  detail::run_for_m<int8_t, int32_t, cutlass::gemm::KernelTmaWarpSpecializedPingpong>(problem, stream);
}

}  // namespace corellm::cuda::sm90
