// Activations quantized per row in blocks of 32 values (quant_gemm.h): d = max|x| / 127, q =
// nearest_even(x * (127 / max|x|)), plus the integer sums the weight types' epilogues use. One
// implementation for every path, on AVX2 (the baseline): a row's int8 values never depend on which
// path multiplies them. A NaN value is quantized to 0 and left out of max|x|.
#include <immintrin.h>

#include "corellm/kernels/dtype.h"
#include "lanes_avx2.h"
#include "quant_gemm_paths.h"

namespace corellm::quant {

namespace {

inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const uint16_t* p) { return avx2::load_bf16x8(p); }

inline int32_t sum8(__m256i v) {
  __m128i h = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  h = _mm_add_epi32(h, _mm_unpackhi_epi64(h, h));
  return _mm_cvtsi128_si32(_mm_add_epi32(h, _mm_shuffle_epi32(h, 1)));
}

template <class T>
void quantize_row(const T* x, int64_t k, int8_t* q, float* d, float* s, int32_t* sum16) {
  const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  for (int64_t a = 0; a < k / kActBlock; ++a) {
    __m256 v[4];
    __m256 amax = _mm256_setzero_ps();
    for (int i = 0; i < 4; ++i) {
      v[i] = load8(x + a * kActBlock + 8 * i);
      v[i] = _mm256_and_ps(v[i], _mm256_cmp_ps(v[i], v[i], _CMP_ORD_Q));  // NaN -> 0
      amax = _mm256_max_ps(amax, _mm256_and_ps(v[i], magnitude));
    }
    const float block_max = avx2::reduce_max8(amax);
    const float scale = block_max / 127.0f, inverse = block_max > 0.0f ? 127.0f / block_max : 0.0f;
    __m256i qi[4];  // nearest even (the rounding mode's), in [-127, 127]
    for (int i = 0; i < 4; ++i) qi[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], _mm256_set1_ps(inverse)));
    // packs interleave the 128-bit halves: 0-3 4-7 | 8-11 12-15 ... put the 32 bytes back in order.
    const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(qi[0], qi[1]), _mm256_packs_epi32(qi[2], qi[3]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + a * kActBlock),
                        _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
    const int32_t first = sum8(_mm256_add_epi32(qi[0], qi[1])), second = sum8(_mm256_add_epi32(qi[2], qi[3]));
    d[a] = scale;
    s[a] = scale * static_cast<float>(first + second);
    sum16[2 * a] = first;
    sum16[2 * a + 1] = second;
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
