// The last step of the bf16 GEMM's AVX-512 paths (packed_gemm_avx512*.cpp, packed_gemm_amx.cpp):
// a row's fp32 sums for 16 columns of a panel, plus the bias, stored as fp32 or rounded once to
// bf16 (to nearest even: by the AVX-512-BF16 instruction, or in integer arithmetic on plain
// AVX-512, which keeps denormals the instruction flushes).
//
// A gated GEMM's up half (bf16_gemm_gated) ends in store_gated: its sums rounded as y's would be,
// times the activation of the gate's rounded value, rounded again — silu_and_mul's arithmetic.
//
// Include it inside the path's target region (its #pragma GCC target), after every system header
// and lanes_avx512.h: its functions are compiled for that path's instructions, each source its own
// copy (anonymous namespace), so that no other source can end up calling them.
#pragma once

namespace corellm::gemm_store {
namespace {

inline __mmask16 mask_of(int cols) { return static_cast<__mmask16>(cols >= 16 ? 0xFFFFu : (1u << cols) - 1u); }

// bias[col .. col + 16) under mask, as fp32; zero without a bias.
inline __m512 bias_of(const uint16_t* bias, int64_t col, __mmask16 mask) {
  if (bias == nullptr) return _mm512_setzero_ps();
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask, bias + col)), 16));
}

// fp32 -> bf16 to nearest even in integer arithmetic (NaN stays a quiet NaN).
inline __m256i round_to_bf16(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF))), 16);
  const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  r = _mm512_mask_or_epi32(r, nan, _mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
  return _mm512_cvtepi32_epi16(r);
}

// y[at .. at + 16) under mask = v: fp32, or bf16 rounded to nearest even (HardwareBf16: by
// the AVX-512-BF16 conversion).
template <bool HardwareBf16>
inline void store(void* y, int64_t at, bool y_f32, __mmask16 mask, __m512 v) {
  if (y_f32) {
    _mm512_mask_storeu_ps(static_cast<float*>(y) + at, mask, v);
  } else if constexpr (HardwareBf16) {
    _mm256_mask_storeu_epi16(static_cast<uint16_t*>(y) + at, mask, (__m256i)_mm512_cvtneps_pbh(v));
  } else {
    _mm256_mask_storeu_epi16(static_cast<uint16_t*>(y) + at, mask, round_to_bf16(v));
  }
}

// The vector paths' last step for one row: y[at .. at + cols) = v + bias[col .. col + cols).
template <bool HardwareBf16>
inline void store_with_bias(void* y, int64_t at, bool y_f32, int cols, __m512 v, const uint16_t* bias, int64_t col) {
  const __mmask16 mask = mask_of(cols);
  store<HardwareBf16>(y, at, y_f32, mask, _mm512_add_ps(v, bias_of(bias, col, mask)));
}

// v rounded to bf16 as store<HardwareBf16> would store it, and widened back to fp32.
template <bool HardwareBf16>
inline __m512 rounded_as_stored(__m512 v) {
  __m256i bf16;
  if constexpr (HardwareBf16) {
    bf16 = (__m256i)_mm512_cvtneps_pbh(v);
  } else {
    bf16 = round_to_bf16(v);
  }
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bf16), 16));
}

// The gated activation on 16 values: elementwise_loops.h's (silu_by / gelu_tanh_by over exp16),
// lane by lane the same bits.
struct Exp16 {
  __m512 operator()(__m512 v) const { return avx512::exp16(v); }
};

// GELU in its erf form (PyTorch's default, BERT's "gelu") on 16 values: x Phi(x) = 0.5 (x + |x|
// erf(|x| / sqrt 2)) (erf is odd, so x erf(x / sqrt 2) = |x| erf(|x| / sqrt 2): no branch on the
// sign), with erf(z), z >= 0, by Abramowitz & Stegun 7.1.26: 1 - t (a1 + t (a2 + t (a3 + t (a4 +
// t a5)))) e^(-z^2), t = 1 / (1 + p z), absolute error <= 1.5e-7. Written here, inside the path's
// target region, with no call out of it (a template defined outside would be compiled for the
// baseline and call the AVX-512 exponential out of line: AVX-512 code outside the paths, which
// tests/ops/test_portable_build.py refuses).
inline __m512 gelu_erf16(__m512 x) {
  const __m512 a = _mm512_abs_ps(x);
  const __m512 z = a * 0.7071067811865476f;
  const __m512 t = 1.0f / (1.0f + 0.3275911f * z);
  const __m512 poly = t * (0.254829592f + t * (-0.284496736f + t * (1.421413741f + t * (-1.453152027f +
                                                                                    t * 1.061405429f))));
  const __m512 erf = 1.0f - poly * avx512::exp16(-(z * z));
  return 0.5f * (x + a * erf);
}

// The gated activation by `act` (kGeluErf: gelu_erf16, which no unfused kernel shares).
inline __m512 gated_act(__m512 g, GatedActivation act) {
  if (act == GatedActivation::kGeluErf) return gelu_erf16(g);
  return act == GatedActivation::kSilu ? silu_by(g, Exp16{}) : gelu_tanh_by(g, Exp16{});
}

// y[at .. at + 16) = act(gate[0 .. 16)) * (v + bias), the up half's sums plus their 16 columns'
// bias (bias_of) rounded as y's (HardwareBf16), the product rounded as the elementwise loops round it.
template <bool HardwareBf16>
inline void store_gated(uint16_t* y, int64_t at, __m512 v, __m512 bias, const uint16_t* gate, GatedActivation act) {
  const __m512 up = rounded_as_stored<HardwareBf16>(_mm512_add_ps(v, bias));
  avx512::store_bf16x16(y + at, gated_act(avx512::load_bf16x16(gate), act) * up);
}

}  // namespace
}  // namespace corellm::gemm_store
