// A thread's scratch buffer: 64-byte aligned (a std::vector's storage is only 16-byte aligned),
// grown as needed and kept for the thread's next call; one buffer per Owner type. Private to the
// kernels library; include it before any target region (plain code, compiled for the baseline).
#pragma once

#include <cstdint>
#include <memory>
#include <new>

namespace corellm {

template <class Owner, class T>
T* thread_scratch(int64_t elements) {
  struct FreeAligned {
    void operator()(T* p) const { ::operator delete[](p, std::align_val_t{64}); }
  };
  thread_local std::unique_ptr<T[], FreeAligned> buffer;
  thread_local int64_t capacity = 0;
  if (elements > capacity) {
    buffer.reset(static_cast<T*>(::operator new[](elements * sizeof(T), std::align_val_t{64})));
    capacity = elements;
  }
  return buffer.get();
}

}  // namespace corellm
