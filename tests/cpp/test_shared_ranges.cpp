// Tests of SharedRanges (the amx GEMM's panels shared by its threads): every item is taken exactly
// once, whatever the threads do; a thread takes its own range front to back first; the ranges of
// threads that never ask are taken from their backs by the others.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <thread>
#include <vector>

#include "corellm/shared_ranges.h"

using namespace corellm;

TEST(SharedRanges, EveryItemIsTakenOnceByConcurrentThreads) {
  for (int threads : {1, 2, 3, 4}) {
    for (int64_t items : {0, 1, 2, 7, 96, 5000}) {
      SharedRanges shared(items, threads);
      std::vector<std::vector<int64_t>> taken(static_cast<size_t>(threads));
      std::vector<std::thread> team;
      for (int t = 0; t < threads; ++t) {
        team.emplace_back([&, t] {
          for (int64_t i = shared.next(t); i >= 0; i = shared.next(t)) taken[static_cast<size_t>(t)].push_back(i);
        });
      }
      for (auto& th : team) th.join();
      std::vector<int64_t> all;
      for (const auto& mine : taken) all.insert(all.end(), mine.begin(), mine.end());
      std::sort(all.begin(), all.end());
      ASSERT_EQ(static_cast<int64_t>(all.size()), items) << threads << " threads";
      for (int64_t i = 0; i < items; ++i) ASSERT_EQ(all[static_cast<size_t>(i)], i) << threads << " threads";
      EXPECT_EQ(shared.next(0), -1);
    }
  }
}

TEST(SharedRanges, OwnRangeFrontToBackThenTheOthersFromTheBack) {
  SharedRanges shared(10, 2);  // ranges [0, 5) and [5, 10)
  std::vector<int64_t> order;
  for (int64_t i = shared.next(0); i >= 0; i = shared.next(0)) order.push_back(i);
  EXPECT_EQ(order, (std::vector<int64_t>{0, 1, 2, 3, 4, 9, 8, 7, 6, 5}));
  EXPECT_EQ(shared.next(1), -1);  // thread 1 finds its range taken

  SharedRanges three(9, 3);  // [0, 3), [3, 6), [6, 9): thread 1 alone
  order.clear();
  for (int64_t i = three.next(1); i >= 0; i = three.next(1)) order.push_back(i);
  EXPECT_EQ(order, (std::vector<int64_t>{3, 4, 5, 8, 7, 6, 2, 1, 0}));
}

TEST(SharedRanges, ThreadsInterleavedMeetInTheMiddle) {
  SharedRanges shared(6, 2);
  EXPECT_EQ(shared.own_front(0), 0);
  EXPECT_EQ(shared.next(0), 0);
  EXPECT_EQ(shared.own_front(0), 1);
  EXPECT_EQ(shared.next(1), 3);
  EXPECT_EQ(shared.next(1), 4);
  EXPECT_EQ(shared.next(1), 5);
  EXPECT_EQ(shared.own_front(1), -1);
  EXPECT_EQ(shared.next(1), 2);  // thread 1 done: it takes thread 0's last item
  EXPECT_EQ(shared.own_front(0), 1);
  EXPECT_EQ(shared.next(0), 1);
  EXPECT_EQ(shared.own_front(0), -1);
  EXPECT_EQ(shared.next(0), -1);
  EXPECT_EQ(shared.next(1), -1);
}

TEST(SharedRanges, RejectsBadSizes) {
  EXPECT_THROW(SharedRanges(10, 0), std::invalid_argument);
  EXPECT_THROW(SharedRanges(10, -1), std::invalid_argument);
  EXPECT_THROW(SharedRanges(-1, 2), std::invalid_argument);
  EXPECT_THROW(SharedRanges(int64_t{1} << 32, 2), std::invalid_argument);
}
