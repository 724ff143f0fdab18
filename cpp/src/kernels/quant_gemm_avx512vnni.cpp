// quant_gemm on AVX-512-VNNI (the avx512vnni path of quant_gemm.h): one lane per panel row, one
// vpdpbusd per 4 values x 16 rows, the activation's 4 bytes broadcast.
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <utility>

#include "quant_formats.h"
#include "quant_gemm_paths.h"

// Everything below is compiled for AVX-512 with VNNI, whatever the build's baseline; it runs only
// where quant_path() found those instructions.
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")

#include "quant_gemm_kernel.h"
#include "quant_lanes_avx512.h"

namespace corellm::quant {

void quant_gemm_avx512vnni(const QuantGemmArgs& a, const QuantizedRows& x, const PanelClaims& claims) {
  kernel::run<Avx512VnniLanes>(a, x, claims);
}

}  // namespace corellm::quant

#pragma GCC pop_options
