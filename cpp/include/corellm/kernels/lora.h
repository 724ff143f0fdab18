// LoRA: a projection's output updated by a low-rank adapter, y += (x A^T) B^T * scale, token by
// token, each token by the adapter its request names (python/corellm/lora/).
//
// Algorithm, for each token t whose slot s = slots[t] is >= 0, and each part p of by_slot[s]
// (a part: the adapter's update of output columns [col_offset, col_offset + cols), as q, k and v
// of a fused qkv projection each have their own A and B):
//   u[r] = scale * sum_i x[t, i] * a_t[i, r]   the shrink: fp32, i ascending, then scaled  (a_t = A^T, [k, rank])
//   d[j] = sum_r u[r] * b_t[r, j]              the expand: fp32, r ascending               (b_t = B^T, [rank, cols])
//   y[t, col_offset + j] = round(y[t, col_offset + j] + d[j])                   (to y's dtype, once)
// A and B are stored in fp32 or bf16 (the model's dtype: bf16 halves the bytes a step reads, and
// a bf16 checkpoint's values are kept exactly), widened to fp32 as they are read.
// A token's result depends on its own row and its adapter alone, in a fixed order: the same
// whatever else the step holds (batch-invariant). The loops run over r and j innermost, so they
// vectorize without reordering a sum. Tokens of the same adapter are computed in blocks of up to 8,
// each matrix row read once per block (lora.cpp); a token's arithmetic is the same in any block.
// Tokens whose slot is < 0, and slots with no parts, are left as they are.
#pragma once

#include <cstdint>
#include <vector>

#include "corellm/kernels/cpu_isa.h"
#include "corellm/kernels/dtype.h"

namespace corellm {

struct LoraPart {
  const void* a_t = nullptr;  // [k, rank]: A transposed
  const void* b_t = nullptr;  // [rank, cols]: B transposed
  DType weight_dtype = DType::F32;  // a_t's and b_t's
  float scale = 1.0f;  // lora_alpha / rank (or / sqrt(rank): rsLoRA)
  int64_t rank = 0;
  int64_t col_offset = 0;  // its first output column
  int64_t cols = 0;
};

// One adapter's update of one projection (no parts: the adapter leaves it alone).
struct LoraLinear {
  std::vector<LoraPart> parts;
  int64_t k = 0;  // the projection's input width

  // InvalidArgument naming `what` unless every part has its matrices, a positive rank and
  // columns inside [0, n).
  void check(const char* what, int64_t n) const;
};

// y [m, n] (row stride y_stride) += the adapters' updates of x [m, k] (row stride x_stride), as
// above; by_slot[s] (s < num_slots) is slot s's LoraLinear or null; a token's slot must be < 0
// or < num_slots. dtype: x's and y's (bf16 or fp32). isa: the path (avx2, or avx512 and above:
// 16-lane registers; the same sums either way).
void lora_add(void* y, int64_t y_stride, const void* x, int64_t x_stride, int64_t m, const int32_t* slots,
              const LoraLinear* const* by_slot, int64_t num_slots, DType dtype, CpuIsa isa = cpu_isa());

}  // namespace corellm
