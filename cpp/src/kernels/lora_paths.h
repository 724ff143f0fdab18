// The LoRA update's paths (lora.h): one block of tokens of one adapter on AVX2 (lora.cpp) or
// AVX-512 (lora_avx512.cpp), the same sums on either (lora_tiles.h). Private to the kernels library.
#pragma once

#include <cstdint>

#include "corellm/kernels/dtype.h"
#include "corellm/kernels/lora.h"

namespace corellm {

// The rows being updated: y [*, y_stride] += the update of x [*, x_stride], both of `dtype`.
struct LoraRows {
  void* y;
  int64_t y_stride;
  const void* x;
  int64_t x_stride;
  DType dtype;
};

// Rows tokens[0 .. count) (count <= 4) updated by `lora`; u: [4, its largest rank] and xf: [4, lora.k]
// fp32 scratch.
using LoraBlockFn = void (*)(const LoraRows& rows, const int64_t* tokens, int64_t count, const LoraLinear& lora,
                             float* u, float* xf);
void lora_block_avx2(const LoraRows& rows, const int64_t* tokens, int64_t count, const LoraLinear& lora, float* u,
                     float* xf);
void lora_block_avx512(const LoraRows& rows, const int64_t* tokens, int64_t count, const LoraLinear& lora, float* u,
                       float* xf);

}  // namespace corellm
