// ShmAllReduce between processes (fork): every rank gets the sum in rank order, bit-identical on
// every rank, in fp32 and bf16, for tensors larger than a buffer (chunks) and over many calls; a
// rank that exits ends the others' wait with kPeerExited, a rank that never comes with kTimedOut.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "corellm/check.h"
#include "corellm/shm_all_reduce.h"

using corellm::AllReduceStatus;
using corellm::DType;
using corellm::ShmAllReduce;

namespace {

std::string unique_name(const char* what) { return "/corellm-test-ar-" + std::string(what) + "-" + std::to_string(getpid()); }

// Rank r's value at element i of call c.
float value(int r, int c, int64_t i) { return static_cast<float>((r + 1) * 0.37 + c * 1.5 - i * 0.001 + (i % 7) * 1e-3); }

template <class T>
T stored(float v) {
  if constexpr (std::is_same_v<T, float>) return v;
  else return corellm::f32_to_bf16(v);
}

template <class T>
float loaded(T v) {
  if constexpr (std::is_same_v<T, float>) return v;
  else return corellm::bf16_to_f32(v);
}

// Runs `calls` all-reduces of n elements as rank r; the exit status is 0 when every result equals
// the rank-order sum of what every rank stored, bit for bit.
template <class T>
int run_rank(ShmAllReduce& a, int size, int calls, int64_t n, DType dtype) {
  for (int c = 0; c < calls; ++c) {
    std::vector<T> data(n);
    for (int64_t i = 0; i < n; ++i) data[i] = stored<T>(value(a.rank(), c, i));
    if (a.all_reduce(data.data(), n, dtype, 10.0) != AllReduceStatus::kDone) return 2;
    for (int64_t i = 0; i < n; ++i) {
      float acc = loaded(stored<T>(value(0, c, i)));
      for (int r = 1; r < size; ++r) acc += loaded(stored<T>(value(r, c, i)));
      const T want = stored<T>(acc);
      if (std::memcmp(&want, &data[i], sizeof(T)) != 0) return 3;
    }
  }
  return 0;
}

template <class T>
void sums_on_every_rank(const char* what, DType dtype, int64_t n, size_t buffer_bytes) {
  const std::string name = unique_name(what);
  const int size = 3, calls = 40;
  auto rank0 = ShmAllReduce::create(name, size, buffer_bytes);
  std::vector<pid_t> others;
  for (int r = 1; r < size; ++r) {
    pid_t pid = fork();
    if (pid == 0) {
      int status = 4;
      try {
        auto a = ShmAllReduce::attach(name, r);
        status = run_rank<T>(*a, size, calls, n, dtype);
      } catch (...) {
      }
      _exit(status);
    }
    others.push_back(pid);
  }
  EXPECT_EQ(run_rank<T>(*rank0, size, calls, n, dtype), 0);
  for (pid_t pid : others) {
    int status = 0;
    waitpid(pid, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "a rank's results differ";
  }
}

}  // namespace

TEST(ShmAllReduce, Float32SumsInRankOrderOnEveryRank) { sums_on_every_rank<float>("f32", DType::F32, 1000, 4096); }

TEST(ShmAllReduce, Bfloat16SumsInRankOrderOnEveryRank) {
  sums_on_every_rank<uint16_t>("bf16", DType::BF16, 3001, 1024);  // 3001 elements in chunks of 512
}

TEST(ShmAllReduce, AnExitedRankEndsTheWait) {
  const std::string name = unique_name("exit");
  auto rank0 = ShmAllReduce::create(name, 2, 256);
  pid_t pid = fork();
  if (pid == 0) {
    auto a = ShmAllReduce::attach(name, 1);
    _exit(0);  // attached, then gone without reducing anything
  }
  int status = 0;
  waitpid(pid, &status, 0);
  float x = 1;
  EXPECT_EQ(rank0->all_reduce(&x, 1, DType::F32, 10.0), AllReduceStatus::kPeerExited);
  EXPECT_EQ(rank0->exited_rank(), 1);
}

TEST(ShmAllReduce, ARankThatNeverComesIsATimeout) {
  const std::string name = unique_name("late");
  auto rank0 = ShmAllReduce::create(name, 2, 256);
  auto rank1 = ShmAllReduce::attach(name, 1);  // this process: alive, never reducing
  float x = 1;
  EXPECT_EQ(rank0->all_reduce(&x, 1, DType::F32, 0.05), AllReduceStatus::kTimedOut);
}

TEST(ShmAllReduce, RefusesBadGeometryAndRanks) {
  const std::string name = unique_name("refuse");
  EXPECT_THROW(ShmAllReduce::create(name, 1, 256), corellm::InvalidArgument);
  EXPECT_THROW(ShmAllReduce::create(name, 2, 100), corellm::InvalidArgument);
  auto rank0 = ShmAllReduce::create(name, 3, 256);
  EXPECT_THROW(ShmAllReduce::create(name, 3, 256), corellm::InvalidArgument);  // taken
  EXPECT_THROW(ShmAllReduce::attach(name, 0), corellm::InvalidArgument);
  EXPECT_THROW(ShmAllReduce::attach(name, 3), corellm::InvalidArgument);
  EXPECT_THROW(ShmAllReduce::attach("/corellm-test-ar-none", 1), corellm::InvalidArgument);
}
