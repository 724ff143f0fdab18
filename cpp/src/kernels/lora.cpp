// The LoRA update of a projection's output (algorithm in lora.h): the step's tokens grouped by
// adapter into blocks of up to 4, the blocks shared among the threads, each run by the path's
// block kernel (lora_tiles.h: avx2 here, avx512 in lora_avx512.cpp).
#include "corellm/kernels/lora.h"

#include <immintrin.h>
#include <omp.h>

#include <vector>

#include "corellm/check.h"
#include "corellm/kernels/cpu_isa.h"
#include "lanes_avx2.h"
#include "lora_paths.h"
#include "lora_tiles.h"

namespace corellm {

void LoraLinear::check(const char* what, int64_t n) const {
  for (const LoraPart& p : parts) {
    CORELLM_CHECK_ARG(p.a_t != nullptr && p.b_t != nullptr && p.rank > 0 && p.cols > 0 && p.col_offset >= 0 &&
                          p.col_offset + p.cols <= n && k > 0,
                      what, ": a LoRA part needs its matrices, a positive rank and columns inside [0, ", n,
                      "), got rank ", p.rank, ", columns [", p.col_offset, ", ", p.col_offset + p.cols, ")");
    CORELLM_CHECK_ARG(p.weight_dtype == parts.front().weight_dtype, what,
                      ": a LoRA update's parts must store their matrices in one dtype");
  }
}

namespace {

struct Avx2Lanes {
  using V = __m256;
  static constexpr int64_t kWidth = 8;
  static __m256i first(int64_t n) {  // the first n lanes' sign bits set
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int32_t>(n)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  static V zero() { return _mm256_setzero_ps(); }
  static V load(const float* p) { return _mm256_loadu_ps(p); }
  static V load(const uint16_t* p) { return avx2::load_bf16x8(p); }
  static V load_partial(const float* p, int64_t n) { return _mm256_maskload_ps(p, first(n)); }
  static V load_partial(const uint16_t* p, int64_t n) {  // no 16-bit masked load on AVX2: lane by lane
    alignas(32) float lanes[kWidth] = {};
    for (int64_t j = 0; j < n; ++j) lanes[j] = bf16_to_f32(p[j]);
    return _mm256_load_ps(lanes);
  }
  static V broadcast(const float* p) { return _mm256_broadcast_ss(p); }
  static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static void store(float* p, V v) { _mm256_storeu_ps(p, v); }
  static void store_partial(float* p, V v, int64_t n) { _mm256_maskstore_ps(p, first(n), v); }
  static void add_into(float* out, V v) { _mm256_storeu_ps(out, _mm256_add_ps(_mm256_loadu_ps(out), v)); }
  static void add_into(uint16_t* out, V v) { avx2::store_bf16x8(out, _mm256_add_ps(avx2::load_bf16x8(out), v)); }
};

}  // namespace

void lora_block_avx2(const LoraRows& rows, const int64_t* tokens, int64_t count, const LoraLinear& lora, float* u,
                     float* xf) {
  lora_tiles::add_block_typed<Avx2Lanes>(rows, tokens, count, lora, u, xf);
}

void lora_add(void* y, int64_t y_stride, const void* x, int64_t x_stride, int64_t m, const int32_t* slots,
              const LoraLinear* const* by_slot, int64_t num_slots, DType dtype, CpuIsa isa) {
  int64_t most_rank = 0, widest = 0;
  for (int64_t s = 0; s < num_slots; ++s) {
    if (by_slot[s] == nullptr) continue;
    widest = by_slot[s]->k > widest ? by_slot[s]->k : widest;
    for (const LoraPart& p : by_slot[s]->parts) most_rank = p.rank > most_rank ? p.rank : most_rank;
  }
  // The tokens by slot (ascending within each), cut into blocks: the units of work.
  std::vector<std::vector<int64_t>> by_adapter(static_cast<size_t>(num_slots));
  for (int64_t t = 0; t < m; ++t) {
    CORELLM_CHECK_ARG(slots[t] < num_slots, "lora_add: token ", t, " names LoRA slot ", slots[t], " of ", num_slots);
    if (slots[t] >= 0 && by_slot[slots[t]] != nullptr) by_adapter[static_cast<size_t>(slots[t])].push_back(t);
  }
  struct Unit {
    int32_t slot;
    int64_t first, count;
  };
  constexpr int64_t block = lora_tiles::kTokenBlock;
  std::vector<Unit> units;
  for (int64_t s = 0; s < num_slots; ++s) {
    const auto n = static_cast<int64_t>(by_adapter[static_cast<size_t>(s)].size());
    for (int64_t first = 0; first < n; first += block) {
      units.push_back({static_cast<int32_t>(s), first, n - first < block ? n - first : block});
    }
  }
  const LoraBlockFn run_block = isa_at_least(isa, CpuIsa::kAvx512) ? lora_block_avx512 : lora_block_avx2;
  const LoraRows rows{y, y_stride, x, x_stride, dtype};
  const auto num_units = static_cast<int64_t>(units.size());
#pragma omp parallel if (num_units > 1 && !omp_in_parallel())
  {
    std::vector<float> u(static_cast<size_t>(block * most_rank)), xf(static_cast<size_t>(block * widest));
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < num_units; ++i) {
      const Unit& unit = units[static_cast<size_t>(i)];
      run_block(rows, by_adapter[static_cast<size_t>(unit.slot)].data() + unit.first, unit.count,
                *by_slot[unit.slot], u.data(), xf.data());
    }
  }
}

}  // namespace corellm
