// Activations quantized per row in blocks of 32 values (quant_gemm.h): d = max|x| / 127, q =
// nearest_even(x * (127 / max|x|)), plus the integer sums the weight types' epilogues use. One
// implementation for every path: a row's int8 values never depend on which path multiplies them.
#include <cmath>

#include "corellm/kernels/dtype.h"
#include "quant_gemm_paths.h"

namespace corellm::quant {

namespace {

template <class T>
void quantize_row(const T* x, int64_t k, int8_t* q, float* d, float* s, int32_t* sum16) {
  for (int64_t a = 0; a < k / kActBlock; ++a) {
    float v[kActBlock];
    float amax = 0.0f;
    for (int e = 0; e < kActBlock; ++e) {
      v[e] = load_f32(x + a * kActBlock + e);
      amax = std::fmax(amax, std::fabs(v[e]));
    }
    const float scale = amax / 127.0f, inverse = amax > 0.0f ? 127.0f / amax : 0.0f;
    int32_t sums[2] = {0, 0};
    for (int e = 0; e < kActBlock; ++e) {
      const auto qe = static_cast<int8_t>(std::nearbyint(v[e] * inverse));
      q[a * kActBlock + e] = qe;
      sums[e / 16] += qe;
    }
    d[a] = scale;
    s[a] = scale * static_cast<float>(sums[0] + sums[1]);
    sum16[2 * a] = sums[0];
    sum16[2 * a + 1] = sums[1];
  }
}

}  // namespace

void quantize_rows(const void* x, int64_t x_stride, DType x_dtype, int64_t r0, int64_t r1, const QuantizedRows& out) {
  const int64_t k = out.k, nb = out.blocks();
  for (int64_t r = r0; r < r1; ++r) {
    int8_t* q = out.q + r * k;
    float *d = out.d + r * nb, *s = out.s + r * nb;
    int32_t* sum16 = out.sum16 + r * 2 * nb;
    if (x_dtype == DType::F32) {
      quantize_row(static_cast<const float*>(x) + r * x_stride, k, q, d, s, sum16);
    } else {
      quantize_row(static_cast<const uint16_t*>(x) + r * x_stride, k, q, d, s, sum16);
    }
  }
}

}  // namespace corellm::quant
