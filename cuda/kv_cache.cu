// Writing a step's K and V into the paged cache, in the CPU kernels' packed layout: one block per
// token, a thread per (kv head, dim) element.
#include <algorithm>

#include "common.cuh"

namespace corellm::cuda {
namespace {

template <class T>
__global__ void reshape_and_cache_kernel(const T* key, int64_t key_stride, const T* value, int64_t value_stride,
                                         T* key_cache, T* value_cache, const int32_t* slot_mapping, int64_t num_slots,
                                         int num_kv_heads, int head_size, int block_size, int x) {
  const int64_t t = blockIdx.x;
  const int64_t slot = slot_mapping[t];
  if (slot < 0 || slot >= num_slots) return;  // a padded token (or a slot outside the cache)
  const int64_t block = slot / block_size;
  const int o = static_cast<int>(slot % block_size);
  for (int j = threadIdx.x; j < num_kv_heads * head_size; j += blockDim.x) {
    const int h = j / head_size, d = j % head_size;
    const int64_t base = (block * num_kv_heads + h) * static_cast<int64_t>(head_size) * block_size;
    key_cache[base + (static_cast<int64_t>(d / x) * block_size + o) * x + d % x] = key[t * key_stride + j];
    value_cache[base + (static_cast<int64_t>(o / x) * head_size + d) * x + o % x] = value[t * value_stride + j];
  }
}

}  // namespace

void reshape_and_cache(const void* key, int64_t key_stride, const void* value, int64_t value_stride,
                       void* key_cache, void* value_cache, const int32_t* slot_mapping, int64_t num_tokens,
                       int64_t num_blocks, int64_t num_kv_heads, int64_t head_size, int64_t block_size, DType dtype,
                       std::uintptr_t stream) {
  if (num_tokens == 0) return;
  const int x = dtype == DType::F32 ? 1 : 2;
  CORELLM_CHECK_ARG(head_size % x == 0 && block_size % x == 0,
                    "reshape_and_cache: head_size and block_size must be multiples of ", x);
  const int threads = static_cast<int>(std::min<int64_t>(1024, (num_kv_heads * head_size + 31) / 32 * 32));
  dispatch("reshape_and_cache", dtype, [&](auto tag) {
    using T = decltype(tag);
    reshape_and_cache_kernel<T><<<num_tokens, threads, 0, as_stream(stream)>>>(
        static_cast<const T*>(key), key_stride, static_cast<const T*>(value), value_stride, static_cast<T*>(key_cache),
        static_cast<T*>(value_cache), slot_mapping, num_blocks * block_size, static_cast<int>(num_kv_heads), static_cast<int>(head_size),
        static_cast<int>(block_size), x);
  });
  check_launch("reshape_and_cache");
}

}  // namespace corellm::cuda
