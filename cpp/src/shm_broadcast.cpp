// ShmBroadcast (algorithm in shm_broadcast.h): a ring of message slots in POSIX shared memory, one
// writer, counters per reader, futex sleeps.
#include "corellm/shm_broadcast.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <new>
#include <system_error>
#include <thread>

#include "corellm/check.h"

namespace corellm {

namespace {

constexpr uint64_t kMagic = 0x636f72656c6c6d31;  // "corellm1"
// A reader spins on the counter for kSpin, then yields the core between checks until kYield, then
// sleeps on the futex. A worker's next step follows within the engine's own work between steps
// (scheduling, sampling: ~1-10 ms), and waking a sleeping thread costs a cross-core wake-up — in
// a VM, where the idle vCPU must be scheduled back by the host, 100-300 us; yielding keeps it
// awake yet gives the core to any other runnable thread (ranks outnumbering the cores).
constexpr auto kSpin = std::chrono::microseconds(50);
constexpr auto kYield = std::chrono::milliseconds(20);

static_assert(std::atomic<uint32_t>::is_always_lock_free, "the counters are shared between processes");
static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t), "a futex word is 32 bits");

struct alignas(64) Counter {
  std::atomic<uint32_t> value;
};

using Clock = std::chrono::steady_clock;

Clock::time_point deadline_after(double timeout_s) {
  CORELLM_CHECK_ARG(timeout_s >= 0, "a timeout must be >= 0 seconds, got ", timeout_s);
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
}

void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#else
  std::this_thread::yield();
#endif
}

// Sleeps while *word == expected, until woken or `until`; spurious returns are fine (callers loop).
void futex_wait(std::atomic<uint32_t>* word, uint32_t expected, Clock::time_point until) {
  auto left = until - Clock::now();
  if (left <= Clock::duration::zero()) return;
  auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(left).count();
  timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void futex_wake_all(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0);
}

// Waits until ready() holds: spinning for kSpin, yielding the core until kYield, then calling
// sleep(until) between checks; false at the deadline.
template <class Ready, class Sleep>
bool wait_until(Ready ready, Sleep sleep, Clock::time_point until) {
  const auto start = Clock::now();
  const auto spin_end = std::min(start + kSpin, until), yield_end = std::min(start + kYield, until);
  for (int i = 0;; ++i) {
    if (ready()) return true;
    if ((i & 63) == 63 && Clock::now() >= spin_end) break;
    cpu_relax();
  }
  while (!ready()) {
    if (Clock::now() >= yield_end) break;
    std::this_thread::yield();
  }
  while (!ready()) {
    if (Clock::now() >= until) return false;
    sleep(until);
  }
  return true;
}

}  // namespace

struct ShmBroadcast::Header {
  uint64_t magic;
  uint32_t num_readers;
  uint32_t num_slots;
  uint64_t slot_bytes;
  Counter published;
  Counter consumed[kMaxReaders];
};

ShmBroadcast::ShmBroadcast(std::string name, void* base, size_t mapped_bytes, int reader)
    : name_(std::move(name)), base_(base), mapped_bytes_(mapped_bytes), header_(static_cast<Header*>(base)),
      reader_(reader) {
  num_readers_ = static_cast<int>(header_->num_readers);
  num_slots_ = header_->num_slots;
  slot_bytes_ = header_->slot_bytes;
}

std::unique_ptr<ShmBroadcast> ShmBroadcast::create(const std::string& name, int num_readers, int num_slots,
                                                   size_t slot_bytes) {
  CORELLM_CHECK_ARG(name.size() > 1 && name[0] == '/' && name.find('/', 1) == std::string::npos,
                    "a shared-memory name is '/' and a file name, got '", name, "'");
  CORELLM_CHECK_ARG(num_readers >= 1 && num_readers <= kMaxReaders, "ShmBroadcast: num_readers must be in 1..",
                    kMaxReaders, ", got ", num_readers);
  CORELLM_CHECK_ARG(num_slots >= 1, "ShmBroadcast: num_slots must be >= 1, got ", num_slots);
  CORELLM_CHECK_ARG(slot_bytes > sizeof(uint64_t) && slot_bytes % 64 == 0,
                    "ShmBroadcast: slot_bytes must be a multiple of 64 above 8, got ", slot_bytes);
  const size_t total = sizeof(Header) + static_cast<size_t>(num_slots) * slot_bytes;
  int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0 && errno == EEXIST) CORELLM_CHECK_ARG(false, "ShmBroadcast: the name '", name, "' is taken");
  if (fd < 0) throw std::system_error(errno, std::generic_category(), "shm_open " + name);
  if (ftruncate(fd, static_cast<off_t>(total)) != 0) {
    int e = errno;
    close(fd);
    shm_unlink(name.c_str());
    throw std::system_error(e, std::generic_category(), "ftruncate " + name);
  }
  void* base = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int e = errno;
  close(fd);
  if (base == MAP_FAILED) {
    shm_unlink(name.c_str());
    throw std::system_error(e, std::generic_category(), "mmap " + name);
  }
  auto* h = new (base) Header{};  // the new segment is zeros: every counter starts at 0
  h->num_readers = static_cast<uint32_t>(num_readers);
  h->num_slots = static_cast<uint32_t>(num_slots);
  h->slot_bytes = slot_bytes;
  std::atomic_thread_fence(std::memory_order_release);
  h->magic = kMagic;
  std::unique_ptr<ShmBroadcast> b(new ShmBroadcast(name, base, total, -1));
  b->name_linked_ = true;
  return b;
}

std::unique_ptr<ShmBroadcast> ShmBroadcast::attach(const std::string& name, int reader) {
  int fd = shm_open(name.c_str(), O_RDWR, 0600);
  CORELLM_CHECK_ARG(fd >= 0, "ShmBroadcast: no shared memory named '", name, "' (", std::strerror(errno), ")");
  struct stat st {};
  fstat(fd, &st);
  const auto total = static_cast<size_t>(st.st_size);
  if (total < sizeof(Header)) {
    close(fd);
    CORELLM_CHECK_ARG(false, "ShmBroadcast: '", name, "' is ", total, " bytes, too small for a header");
  }
  void* base = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int e = errno;
  close(fd);
  if (base == MAP_FAILED) throw std::system_error(e, std::generic_category(), "mmap " + name);
  auto* h = static_cast<Header*>(base);
  const bool ok = h->magic == kMagic && total == sizeof(Header) + h->num_slots * h->slot_bytes;
  if (!ok || reader < 0 || reader >= static_cast<int>(h->num_readers)) {
    const int readers = ok ? static_cast<int>(h->num_readers) : 0;
    munmap(base, total);
    CORELLM_CHECK_ARG(ok, "ShmBroadcast: '", name, "' is not a corellm broadcast segment");
    CORELLM_CHECK_ARG(false, "ShmBroadcast: reader ", reader, " is outside 0..", readers - 1);
  }
  return std::unique_ptr<ShmBroadcast>(new ShmBroadcast(name, base, total, reader));
}

ShmBroadcast::~ShmBroadcast() {
  if (is_writer()) unlink_name();
  if (base_ != nullptr) munmap(base_, mapped_bytes_);
}

void ShmBroadcast::unlink_name() {
  if (name_linked_) shm_unlink(name_.c_str());
  name_linked_ = false;
}

uint8_t* ShmBroadcast::slot(uint32_t message) const {
  return static_cast<uint8_t*>(base_) + sizeof(Header) + static_cast<size_t>(message % num_slots_) * slot_bytes_;
}

bool ShmBroadcast::publish(const void* data, size_t size, double timeout_s) {
  CORELLM_CHECK_ARG(is_writer(), "ShmBroadcast: reader ", reader_, " cannot publish");
  CORELLM_CHECK_ARG(size <= slot_capacity(), "ShmBroadcast: a message of ", size, " bytes exceeds a slot's ",
                    slot_capacity());
  const auto until = deadline_after(timeout_s);
  const uint32_t m = header_->published.value.load(std::memory_order_relaxed);  // only this process writes it
  auto slot_free = [&] {
    for (int r = 0; r < num_readers_; ++r) {
      // consumed >= m + 1 - num_slots, modulo 2^32: m - consumed < num_slots
      const uint32_t behind = m - header_->consumed[r].value.load(std::memory_order_acquire);
      if (behind >= num_slots_) return false;
    }
    return true;
  };
  auto nap = [](Clock::time_point) { std::this_thread::sleep_for(std::chrono::microseconds(20)); };
  if (!wait_until(slot_free, nap, until)) return false;
  uint8_t* s = slot(m);
  const uint64_t n = size;
  std::memcpy(s, &n, sizeof(n));
  if (size > 0) std::memcpy(s + sizeof(n), data, size);
  header_->published.value.store(m + 1, std::memory_order_release);
  futex_wake_all(&header_->published.value);
  return true;
}

bool ShmBroadcast::receive(std::vector<uint8_t>& out, double timeout_s) {
  CORELLM_CHECK_ARG(!is_writer(), "ShmBroadcast: the writer cannot receive");
  const auto until = deadline_after(timeout_s);
  std::atomic<uint32_t>& published = header_->published.value;
  std::atomic<uint32_t>& mine = header_->consumed[reader_].value;
  const uint32_t m = mine.load(std::memory_order_relaxed);  // only this reader writes it
  auto arrived = [&] { return published.load(std::memory_order_acquire) != m; };
  auto sleep = [&](Clock::time_point deadline) { futex_wait(&published, m, deadline); };
  if (!wait_until(arrived, sleep, until)) return false;
  const uint8_t* s = slot(m);
  uint64_t n = 0;
  std::memcpy(&n, s, sizeof(n));
  CORELLM_CHECK(n <= slot_capacity(), "a slot's size field (", n, ") exceeds its capacity");
  out.assign(s + sizeof(n), s + sizeof(n) + n);
  mine.store(m + 1, std::memory_order_release);
  return true;
}

}  // namespace corellm
