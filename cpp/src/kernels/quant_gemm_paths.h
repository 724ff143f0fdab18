// quant_gemm's pieces shared by its paths (quant_gemm.h): the activations quantized per row, and
// the per-path loops over panels. Private to the kernels library.
#pragma once

#include <cstdint>
#include <vector>

#include "corellm/kernels/quant_gemm.h"
#include "next_panel.h"
#include "shared_panels.h"

namespace corellm::quant {

constexpr int64_t kActBlock = 32;  // activation values per scale

// Rows of x quantized in blocks of 32 (quant_gemm.h): for row r and block a,
//   q[r k + 32 a + e]  int8 values
//   d[r nb + a]        the scale (max |x| / 127)
//   s[r nb + a]        d * float(the block's sum of q)
//   sum16[r 2nb + h]   the sum of q over values 16 h .. 16 h + 15 of block h / 2 (2 per block)
// nb = k / 32.
struct QuantizedRows {
  int8_t* q = nullptr;
  float* d = nullptr;
  float* s = nullptr;
  int32_t* sum16 = nullptr;
  int64_t k = 0;

  int64_t blocks() const { return k / kActBlock; }
  const int8_t* row_q(int64_t r) const { return q + r * k; }
  const float* row_d(int64_t r) const { return d + r * blocks(); }
  const float* row_s(int64_t r) const { return s + r * blocks(); }
  const int32_t* row_sum16(int64_t r) const { return sum16 + r * 2 * blocks(); }
};

// Quantizes rows [r0, r1) of x into rows [r0, r1) of `out` (quant_activations.cpp).
void quantize_rows(const void* x, int64_t x_stride, DType x_dtype, int64_t r0, int64_t r1, const QuantizedRows& out);

// One thread's share of a chunk of rows [r0, r1) of y: the panels it takes one at a time from the
// chunk's shared ranges (shared_panels.h: its own contiguous range first, then the other threads'
// from their backs), and for each the panel it will most likely take next, fetched meanwhile.
struct PanelClaims {
  int64_t r0, r1;
  std::vector<SharedRanges>* chunk_panels;  // per chunk of rows (gemm_shared_panels)
  size_t chunk;                             // this one's index
  int thread;

  int64_t take() const { return (*chunk_panels)[chunk].next(thread); }  // -1: every panel is taken
  int64_t likely_next() const { return gemm_next_own_panel(*chunk_panels, chunk, thread); }  // -1: none
};
// Each path's loop over its claims, from the quantized rows (quant_gemm.cpp's reference,
// quant_gemm_avx2.cpp, quant_gemm_avx512vnni.cpp, quant_gemm_amx.cpp).
void quant_gemm_reference(const QuantGemmArgs& a, const QuantizedRows& x, const PanelClaims& claims);
void quant_gemm_avx2(const QuantGemmArgs& a, const QuantizedRows& x, const PanelClaims& claims);
void quant_gemm_avx512vnni(const QuantGemmArgs& a, const QuantizedRows& x, const PanelClaims& claims);
void quant_gemm_amx(const QuantGemmArgs& a, const QuantizedRows& x, const PanelClaims& claims);

}  // namespace corellm::quant
