// The LoRA update's block on AVX-512 F (lora_tiles.h on 16-lane registers): the avx2 path's sums,
// twice the lanes per instruction.
#include <immintrin.h>

#include <cstdint>

#include "corellm/kernels/dtype.h"
#include "corellm/kernels/lora.h"
#include "lanes_avx512.h"
#include "lora_paths.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq")

#include "lora_tiles.h"

namespace corellm {
namespace {

struct Avx512Lanes {
  using V = __m512;
  static constexpr int64_t kWidth = 16;
  static __mmask16 first(int64_t n) { return static_cast<__mmask16>((1u << n) - 1u); }
  static V zero() { return _mm512_setzero_ps(); }
  static V load(const float* p) { return _mm512_loadu_ps(p); }
  static V load(const uint16_t* p) { return avx512::load_bf16x16(p); }
  static V load_partial(const float* p, int64_t n) { return _mm512_maskz_loadu_ps(first(n), p); }
  static V load_partial(const uint16_t* p, int64_t n) {
    const __m512i h = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(first(n), p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(h, 16));
  }
  static V broadcast(const float* p) { return _mm512_set1_ps(*p); }
  static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static void store(float* p, V v) { _mm512_storeu_ps(p, v); }
  static void store_partial(float* p, V v, int64_t n) { _mm512_mask_storeu_ps(p, first(n), v); }
  static void add_into(float* out, V v) { _mm512_storeu_ps(out, _mm512_add_ps(_mm512_loadu_ps(out), v)); }
  static void add_into(uint16_t* out, V v) {
    avx512::store_bf16x16(out, _mm512_add_ps(avx512::load_bf16x16(out), v));
  }
};

}  // namespace

void lora_block_avx512(const LoraRows& rows, const int64_t* tokens, int64_t count, const LoraLinear& lora, float* u,
                       float* xf) {
  lora_tiles::add_block_typed<Avx512Lanes>(rows, tokens, count, lora, u, xf);
}

}  // namespace corellm

#pragma GCC pop_options
