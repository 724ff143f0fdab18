// The CUTLASS sm_90a kernels behind corellm::cuda::scaled_gemm (scaled_gemm_sm90.cuh, one
// translation unit per type), called by scaled_gemm.cu once it has checked the problem and the device.
#pragma once

#include <cuda_runtime.h>

#include "kernels.h"

namespace corellm::cuda::sm90 {

void scaled_gemm_fp8(const ScaledGemmProblem& problem, cudaStream_t stream);
void scaled_gemm_int8(const ScaledGemmProblem& problem, cudaStream_t stream);

}  // namespace corellm::cuda::sm90
