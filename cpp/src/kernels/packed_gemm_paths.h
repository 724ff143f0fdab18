// The bf16 GEMM's per-ISA implementations behind bf16_gemm (packed_gemm.h), over one packed
// layout. Private to the kernels library.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "corellm/kernels/dtype.h"
#include "corellm/kernels/packed_gemm.h"
#include "next_panel.h"
#include "shared_panels.h"
#include "thread_scratch.h"

namespace corellm {

struct GemmArgs {
  const uint16_t* x;       // [m, k], row stride x_stride
  int64_t x_stride;
  const uint16_t* packed;  // bf16_gemm_pack's layout
  const uint16_t* bias;    // [n] or null
  void* y;                 // [m, n], row stride y_stride; bf16 or fp32 (y_dtype)
  int64_t y_stride;
  int64_t m, n, k;
  DType y_dtype;
  XRows x_rows = XRows::kAnywhere;
};

// K pairs per panel row group: k is padded (with zero weights) to whole groups of 16 pairs (32
// input columns), one AMX tile's depth.
constexpr int64_t kGemmPairGroup = 16;
inline int64_t gemm_num_panels(int64_t n) { return (n + kGemmPanelCols - 1) / kGemmPanelCols; }
inline int64_t gemm_padded_pairs(int64_t k) { return ((k + 1) / 2 + kGemmPairGroup - 1) / kGemmPairGroup * kGemmPairGroup; }
inline int64_t gemm_panel_elements(int64_t k) { return gemm_padded_pairs(k) * kGemmPanelCols * 2; }

// The columns of panel half h (16 columns from col0 + 16 h) inside an n-column output; 0: none.
inline int gemm_half_columns(int64_t n, int64_t col0, int h) {
  return static_cast<int>(std::clamp<int64_t>(n - col0 - 16 * h, 0, 16));
}

// The team that runs the GEMM (shared_panels.h's gemm_team). Its parallel region and its shared
// units (gemm_shared_panels) both take this one number.
inline int gemm_team_size(const GemmArgs& a) { return gemm_team(a.m, a.n, a.k); }

void bf16_gemm_avx2(const GemmArgs& a);        // packed_gemm_avx2.cpp
void bf16_gemm_avx512(const GemmArgs& a);      // packed_gemm_avx512.cpp
void bf16_gemm_avx512bf16(const GemmArgs& a);  // packed_gemm_avx512bf16.cpp
void bf16_gemm_amx(const GemmArgs& a);         // packed_gemm_amx.cpp
// a.n = 2d (gate rows, then up rows), y = [m, d]: bf16_gemm_gated's fused pass.
void bf16_gemm_gated_amx(const GemmArgs& a, GatedActivation act);
void bf16_gemm_gelu_amx(const GemmArgs& a);     // packed_gemm_amx.cpp
void bf16_gemm_gated_avx512bf16(const GemmArgs& a, GatedActivation act);  // packed_gemm_vector.h's
void bf16_gemm_gated_avx512(const GemmArgs& a, GatedActivation act);

// The path's bf16 dot-product peak: `iterations` rounds of independent dot products on operands
// in registers (tiles), on every thread of the OpenMP team; returns the flops done.
double bf16_dot_peak_avx2(int64_t iterations);
double bf16_dot_peak_avx512(int64_t iterations);
double bf16_dot_peak_avx512bf16(int64_t iterations);
double bf16_dot_peak_amx(int64_t iterations);

}  // namespace corellm
