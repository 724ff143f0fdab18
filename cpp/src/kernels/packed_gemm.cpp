// bf16 GEMM over a panel-packed W (layout in packed_gemm.h): the packing, and the dispatch to the
// process's instruction-set path (cpu_isa.h; the paths in packed_gemm_paths.h).
#include "corellm/kernels/packed_gemm.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "corellm/check.h"
#include "packed_gemm_paths.h"

namespace corellm {

int64_t bf16_gemm_packed_size(int64_t n, int64_t k) { return gemm_num_panels(n) * gemm_panel_elements(k); }

void bf16_gemm_pack(const uint16_t* w, uint16_t* packed, int64_t n, int64_t k) {
  CORELLM_CHECK_ARG(n >= 1 && k >= 1, "bf16_gemm_pack: bad shape n=", n, " k=", k);
  const int64_t pairs = gemm_padded_pairs(k);
  std::memset(packed, 0, static_cast<size_t>(bf16_gemm_packed_size(n, k)) * sizeof(uint16_t));
  for (int64_t row = 0; row < n; ++row) {
    const int64_t p = row / kGemmPanelCols, c = row % kGemmPanelCols;
    for (int64_t col = 0; col < k; ++col) {
      packed[((p * pairs + col / 2) * kGemmPanelCols + c) * 2 + col % 2] = w[row * k + col];
    }
  }
}

bool bf16_gemm_available() { return !supported_cpu_isas().empty(); }

void bf16_gemm(const uint16_t* x, int64_t x_stride, const uint16_t* packed, const uint16_t* bias, void* y,
               int64_t y_stride, int64_t m, int64_t n, int64_t k, DType y_dtype, CpuIsa isa) {
  CORELLM_CHECK_ARG(m >= 0 && n >= 1 && k >= 1, "bf16_gemm: bad shape m=", m, " n=", n, " k=", k);
  check_cpu_runs(isa, "bf16_gemm");
  if (m == 0) return;
  const GemmArgs args{x, x_stride, packed, bias, y, y_stride, m, n, k, y_dtype};
  switch (isa) {
    case CpuIsa::kAmx: return bf16_gemm_amx(args);
    case CpuIsa::kAvx512Bf16: return bf16_gemm_avx512bf16(args);
    case CpuIsa::kAvx512: return bf16_gemm_avx512(args);
    case CpuIsa::kAvx2: return bf16_gemm_avx2(args);
  }
  CORELLM_CHECK_ARG(false, "bf16_gemm: unknown instruction-set path ", static_cast<int>(isa));
}

double bf16_dot_peak(CpuIsa isa, int64_t iterations) {
  check_cpu_runs(isa, "bf16_dot_peak");
  switch (isa) {
    case CpuIsa::kAmx: return bf16_dot_peak_amx(iterations);
    case CpuIsa::kAvx512Bf16: return bf16_dot_peak_avx512bf16(iterations);
    case CpuIsa::kAvx512: return bf16_dot_peak_avx512(iterations);
    case CpuIsa::kAvx2: return bf16_dot_peak_avx2(iterations);
  }
  CORELLM_CHECK_ARG(false, "bf16_dot_peak: unknown instruction-set path ", static_cast<int>(isa));
  return 0.0;
}

}  // namespace corellm
