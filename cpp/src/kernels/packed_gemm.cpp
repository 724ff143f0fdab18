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

// One panel at a time (panels in parallel): its 32 rows of w are read side by side, k pair by k
// pair, and the panel is written in order, one 32-bit (W[n][k], W[n][k+1]) pair per column.
void bf16_gemm_pack(const uint16_t* w, uint16_t* packed, int64_t n, int64_t k) {
  CORELLM_CHECK_ARG(n >= 1 && k >= 1, "bf16_gemm_pack: bad shape n=", n, " k=", k);
  const int64_t full_pairs = k / 2, panel_size = gemm_panel_elements(k);
  const int64_t panels = gemm_num_panels(n);
#pragma omp parallel for schedule(static) if (n * k >= (1 << 16))
  for (int64_t p = 0; p < panels; ++p) {
    uint16_t* panel = packed + p * panel_size;
    std::memset(panel, 0, static_cast<size_t>(panel_size) * sizeof(uint16_t));  // k and column padding
    const int64_t rows = std::min<int64_t>(kGemmPanelCols, n - p * kGemmPanelCols);
    const uint16_t* w_panel = w + p * kGemmPanelCols * k;
    for (int64_t kp = 0; kp < full_pairs; ++kp) {
      uint16_t* out = panel + kp * kGemmPanelCols * 2;
      for (int64_t c = 0; c < rows; ++c) std::memcpy(out + 2 * c, w_panel + c * k + 2 * kp, 2 * sizeof(uint16_t));
    }
    if (k % 2 != 0) {  // the last column alone: the pair's other half stays zero
      uint16_t* out = panel + full_pairs * kGemmPanelCols * 2;
      for (int64_t c = 0; c < rows; ++c) out[2 * c] = w_panel[c * k + k - 1];
    }
  }
}

bool bf16_gemm_available() { return !supported_cpu_isas().empty(); }

void bf16_gemm(const uint16_t* x, int64_t x_stride, const uint16_t* packed, const uint16_t* bias, void* y,
               int64_t y_stride, int64_t m, int64_t n, int64_t k, DType y_dtype, CpuIsa isa, XRows x_rows) {
  CORELLM_CHECK_ARG(m >= 0 && n >= 1 && k >= 1, "bf16_gemm: bad shape m=", m, " n=", n, " k=", k);
  check_cpu_runs(isa, "bf16_gemm");
  if (m == 0) return;
  const GemmArgs args{x, x_stride, packed, bias, y, y_stride, m, n, k, y_dtype, x_rows};
  switch (isa) {
    case CpuIsa::kAmx: return bf16_gemm_amx(args);
    case CpuIsa::kAvx512Bf16: return bf16_gemm_avx512bf16(args);
    case CpuIsa::kAvx512: return bf16_gemm_avx512(args);
    case CpuIsa::kAvx2: return bf16_gemm_avx2(args);
  }
  CORELLM_CHECK_ARG(false, "bf16_gemm: unknown instruction-set path ", static_cast<int>(isa));
}

bool bf16_gemm_gelu_fused(CpuIsa isa) { return isa == CpuIsa::kAmx; }

void bf16_gemm_gelu(const uint16_t* x, int64_t x_stride, const uint16_t* packed, const uint16_t* bias, uint16_t* y,
                    int64_t y_stride, int64_t m, int64_t n, int64_t k, CpuIsa isa, XRows x_rows) {
  CORELLM_CHECK_ARG(m >= 0 && n >= 1 && k >= 1, "bf16_gemm_gelu: bad shape m=", m, " n=", n, " k=", k);
  check_cpu_runs(isa, "bf16_gemm_gelu");
  CORELLM_CHECK_ARG(bf16_gemm_gelu_fused(isa), "bf16_gemm_gelu: no fused pass on the ", cpu_isa_name(isa),
                    " path (amx only): use bf16_gemm, then GELU");
  if (m == 0) return;
  bf16_gemm_gelu_amx(GemmArgs{x, x_stride, packed, bias, y, y_stride, m, n, k, DType::BF16, x_rows});
}

// The amx and AVX-512 paths pair whole panels: each half a whole number of them. (The avx2 path's
// ways from 4 rows on widen x and the panels first; it computes the GEMM, then the activation.)
bool bf16_gemm_gated_fused(CpuIsa isa, int64_t n) {
  return isa != CpuIsa::kAvx2 && n % (2 * kGemmPanelCols) == 0;
}

void bf16_gemm_gated(const uint16_t* x, int64_t x_stride, const uint16_t* packed, const uint16_t* bias, uint16_t* out,
                     int64_t out_stride, int64_t m, int64_t n, int64_t k, GatedActivation act, CpuIsa isa,
                     XRows x_rows) {
  CORELLM_CHECK_ARG(m >= 0 && n >= 2 && k >= 1, "bf16_gemm_gated: bad shape m=", m, " n=", n, " k=", k);
  CORELLM_CHECK_ARG(act == GatedActivation::kSilu || act == GatedActivation::kGeluTanh ||
                        act == GatedActivation::kGeluErf,
                    "bf16_gemm_gated: unknown gated activation ", static_cast<int32_t>(act));
  check_cpu_runs(isa, "bf16_gemm_gated");
  CORELLM_CHECK_ARG(bf16_gemm_gated_fused(isa, n), "bf16_gemm_gated: no fused pass on the ", cpu_isa_name(isa),
                    " path for n=", n, " (amx, avx512bf16 or avx512, n a multiple of 64): use bf16_gemm and ",
                    "gated_activation_and_mul");
  if (m == 0) return;
  const GemmArgs args{x, x_stride, packed, bias, out, out_stride, m, n, k, DType::BF16, x_rows};
  switch (isa) {
    case CpuIsa::kAmx: return bf16_gemm_gated_amx(args, act);
    case CpuIsa::kAvx512Bf16: return bf16_gemm_gated_avx512bf16(args, act);
    case CpuIsa::kAvx512: return bf16_gemm_gated_avx512(args, act);
    case CpuIsa::kAvx2: break;
  }
  CORELLM_CHECK_ARG(false, "bf16_gemm_gated: unknown instruction-set path ", static_cast<int>(isa));
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
