// What the shared-memory structures of tensor-parallel ranks (ShmBroadcast, ShmAllReduce) share to
// wait on each other: a counter alone on its cache line, and a spin that does not starve the other
// hyperthread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>

namespace corellm::shm {

static_assert(std::atomic<uint32_t>::is_always_lock_free, "the counters are shared between processes");

using Clock = std::chrono::steady_clock;

// How long a waiter spins before it yields the core (or sleeps): a peer's next message or arrival
// usually comes within microseconds.
constexpr auto kSpin = std::chrono::microseconds(50);

// A counter only one process writes, alone on its cache line (no false sharing between ranks).
struct alignas(64) Counter {
  std::atomic<uint32_t> value;
};

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#else
  std::this_thread::yield();
#endif
}

}  // namespace corellm::shm
