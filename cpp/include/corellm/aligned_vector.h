// A std::vector whose storage starts on a cache line (64 bytes; a plain vector's is only 16-byte
// aligned, and a large one's lands 16 bytes past a page). The amx kernels load rows as tiles, and a
// tile row split across two lines costs about three whole ones; the amx GEMM reads x's tiles in
// place only when its rows start on lines.
#pragma once

#include <cstddef>
#include <new>
#include <vector>

namespace corellm {

template <class T>
struct CacheLineAllocator {
  using value_type = T;
  CacheLineAllocator() = default;
  template <class U>
  CacheLineAllocator(const CacheLineAllocator<U>&) {}  // NOLINT: rebinding
  T* allocate(size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t{64})); }
  void deallocate(T* p, size_t) { ::operator delete(p, std::align_val_t{64}); }
  bool operator==(const CacheLineAllocator&) const { return true; }
};

template <class T>
using AlignedVector = std::vector<T, CacheLineAllocator<T>>;

}  // namespace corellm
