// Tests of AlignedVector: storage on a 64-byte line at every size and after growth (the amx GEMM
// reads DecoderStack's activations in place only when their rows start on lines; a plain vector's
// large buffer starts 16 bytes past a page).
#include <gtest/gtest.h>

#include <cstdint>

#include "corellm/aligned_vector.h"

using namespace corellm;

static bool on_line(const void* p) { return reinterpret_cast<uintptr_t>(p) % 64 == 0; }

TEST(AlignedVector, StorageStartsOnACacheLineAtEverySize) {
  for (size_t n : {1u, 7u, 64u, 1000u, 576u * 2048u, 3u << 20}) {  // small (heap) to large (own mapping)
    AlignedVector<uint16_t> v(n, 1);
    EXPECT_TRUE(on_line(v.data())) << n << " elements";
    EXPECT_EQ(v.size(), n);
    EXPECT_EQ(v[n - 1], 1);
  }
}

TEST(AlignedVector, GrowthKeepsTheAlignmentAndTheValues) {
  AlignedVector<uint16_t> v;
  for (size_t n = 1; n <= (1u << 22); n *= 4) {
    v.resize(n, static_cast<uint16_t>(n & 0xFFFF));
    ASSERT_TRUE(on_line(v.data())) << n << " elements";
    EXPECT_EQ(v[0], 1);  // the first element's value survives every reallocation
  }
  AlignedVector<float> f(5, 2.0f);
  AlignedVector<float> copy = f;  // a copy allocates through the same allocator
  EXPECT_TRUE(on_line(copy.data()));
  EXPECT_EQ(copy, f);
}
