// The rejection sampler on CUDA (see corellm/kernels/rejection_sampler.h for the rule): one thread
// per request; each finds where its rows and drafts start from the exclusive prefix sum of the
// draft counts, computed by the block over shared memory (one block of up to 1024 threads walks
// the requests in chunks).
#include <cuda_runtime.h>

#include "common.cuh"
#include "kernels.h"

namespace corellm::cuda {
namespace {

constexpr int kThreads = 1024;

__global__ void rejection_sample_kernel(RejectionBatch b) {
  __shared__ int32_t scan[kThreads];
  int64_t base_draft = 0;  // drafts of the requests before this chunk
  for (int64_t chunk = 0; chunk < b.num_reqs; chunk += kThreads) {
    const int64_t i = chunk + threadIdx.x;
    const int32_t d = i < b.num_reqs ? b.num_draft_tokens[i] : 0;
    scan[threadIdx.x] = d;
    __syncthreads();
    for (int offset = 1; offset < kThreads; offset <<= 1) {  // inclusive Hillis-Steele scan
      const int32_t add = threadIdx.x >= offset ? scan[threadIdx.x - offset] : 0;
      __syncthreads();
      scan[threadIdx.x] += add;
      __syncthreads();
    }
    if (i < b.num_reqs) {
      const int64_t draft = base_draft + scan[threadIdx.x] - d;  // exclusive
      const int64_t row = draft + i;                             // each request before has d + 1 rows
      accept_drafts(b.target_token_ids + row, b.draft_token_ids + draft, d, b.output_token_ids + i * b.width,
                    b.width);
    }
    base_draft += scan[kThreads - 1];
    __syncthreads();
  }
}

}  // namespace

void rejection_sample(const RejectionBatch& batch, std::uintptr_t stream) {
  CORELLM_CHECK_ARG(batch.num_reqs >= 0 && batch.width >= 1, "rejection_sample: num_reqs ", batch.num_reqs,
                    ", width ", batch.width);
  if (batch.num_reqs == 0) return;
  rejection_sample_kernel<<<1, kThreads, 0, reinterpret_cast<cudaStream_t>(stream)>>>(batch);
  check_launch("rejection_sample");
}

}  // namespace corellm::cuda
