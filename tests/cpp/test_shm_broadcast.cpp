// ShmBroadcast between processes (fork): every reader gets every message, in order and intact;
// a full ring holds the writer back until the slowest reader takes a message; waits end at their
// timeouts; bad names and reader indices are refused.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "corellm/check.h"
#include "corellm/shm_broadcast.h"

using corellm::ShmBroadcast;

namespace {

std::string unique_name(const char* what) { return "/corellm-test-" + std::string(what) + "-" + std::to_string(getpid()); }

// Message i: i + 1 bytes (capped), byte j = (i * 31 + j) mod 251.
std::vector<uint8_t> message(int i, size_t cap) {
  std::vector<uint8_t> m(std::min<size_t>(static_cast<size_t>(i) * 37 + 1, cap));
  for (size_t j = 0; j < m.size(); ++j) m[j] = static_cast<uint8_t>((i * 31 + j) % 251);
  return m;
}

// A forked reader: attaches, checks `count` messages, sleeping `delay_us` after each; exit status
// 0 when every message was right.
pid_t fork_reader(const std::string& name, int reader, int count, size_t cap, int delay_us) {
  pid_t pid = fork();
  if (pid != 0) return pid;
  int status = 0;
  try {
    auto b = ShmBroadcast::attach(name, reader);
    std::vector<uint8_t> got;
    for (int i = 0; i < count && status == 0; ++i) {
      if (!b->receive(got, 10.0)) status = 2;
      else if (got != message(i, cap)) status = 3;
      if (delay_us > 0) usleep(delay_us);
    }
  } catch (...) {
    status = 4;
  }
  _exit(status);
}

int wait_status(pid_t pid) {
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 100;
}

}  // namespace

TEST(ShmBroadcast, EveryReaderGetsEveryMessageInOrder) {
  const std::string name = unique_name("order");
  const size_t slot_bytes = 4096;
  auto writer = ShmBroadcast::create(name, /*num_readers=*/3, /*num_slots=*/2, slot_bytes);
  const size_t cap = writer->slot_capacity();
  const int count = 500;
  std::vector<pid_t> readers;
  for (int r = 0; r < 3; ++r) readers.push_back(fork_reader(name, r, count, cap, r == 2 ? 20 : 0));
  for (int i = 0; i < count; ++i) {
    auto m = message(i, cap);
    ASSERT_TRUE(writer->publish(m.data(), m.size(), 10.0)) << "message " << i;
  }
  for (pid_t pid : readers) EXPECT_EQ(wait_status(pid), 0);
}

TEST(ShmBroadcast, AFullRingHoldsTheWriterUntilItsTimeout) {
  const std::string name = unique_name("full");
  auto writer = ShmBroadcast::create(name, 1, 2, 256);
  auto reader = ShmBroadcast::attach(name, 0);
  const uint8_t byte = 7;
  EXPECT_TRUE(writer->publish(&byte, 1, 0.0));
  EXPECT_TRUE(writer->publish(&byte, 1, 0.0));
  EXPECT_FALSE(writer->publish(&byte, 1, 0.01));  // both slots hold messages nobody took
  std::vector<uint8_t> got;
  ASSERT_TRUE(reader->receive(got, 0.0));
  EXPECT_EQ(got, std::vector<uint8_t>{7});
  EXPECT_TRUE(writer->publish(&byte, 1, 0.0));  // the first slot is free again
  ASSERT_TRUE(reader->receive(got, 0.0));
  ASSERT_TRUE(reader->receive(got, 0.0));
  EXPECT_FALSE(reader->receive(got, 0.01));  // nothing more came
}

TEST(ShmBroadcast, EmptyAndFullSizedMessages) {
  const std::string name = unique_name("sizes");
  auto writer = ShmBroadcast::create(name, 1, 1, 128);
  auto reader = ShmBroadcast::attach(name, 0);
  std::vector<uint8_t> full(writer->slot_capacity());
  std::iota(full.begin(), full.end(), 0);
  std::vector<uint8_t> got{1, 2, 3};
  ASSERT_TRUE(writer->publish(nullptr, 0, 1.0));
  ASSERT_TRUE(reader->receive(got, 1.0));
  EXPECT_TRUE(got.empty());
  ASSERT_TRUE(writer->publish(full.data(), full.size(), 1.0));
  ASSERT_TRUE(reader->receive(got, 1.0));
  EXPECT_EQ(got, full);
  std::vector<uint8_t> too_big(writer->slot_capacity() + 1);
  EXPECT_THROW(writer->publish(too_big.data(), too_big.size(), 1.0), corellm::InvalidArgument);
}

TEST(ShmBroadcast, PartsMayBeTheFirstColumnsOfRows) {
  const std::string name = unique_name("rows");
  auto writer = ShmBroadcast::create(name, 1, 1, 256);
  auto reader = ShmBroadcast::attach(name, 0);
  const uint8_t head[2] = {200, 201};
  const uint8_t table[3][5] = {{0, 1, 2, 3, 4}, {10, 11, 12, 13, 14}, {20, 21, 22, 23, 24}};
  // the head, then the first 2 columns of each of the 3 rows
  ASSERT_TRUE(writer->publish({{head, 2}, {&table[0][0], 2, 3, 5}}, 1.0));
  std::vector<uint8_t> got;
  ASSERT_TRUE(reader->receive(got, 1.0));
  EXPECT_EQ(got, (std::vector<uint8_t>{200, 201, 0, 1, 10, 11, 20, 21}));
  EXPECT_THROW(writer->publish({{&table[0][0], 5, 2, 4}}, 1.0), corellm::InvalidArgument);  // rows overlap
}

TEST(ShmBroadcast, AMessageReceivedInPlaceHoldsItsSlotUntilTheNextReceive) {
  const std::string name = unique_name("inplace");
  auto writer = ShmBroadcast::create(name, 1, 2, 256);
  auto reader = ShmBroadcast::attach(name, 0);
  const uint8_t a = 1, b = 2, c = 3;
  ASSERT_TRUE(writer->publish(&a, 1, 0.0));
  ASSERT_TRUE(writer->publish(&b, 1, 0.0));
  auto first = reader->receive_in_place(0.0);
  ASSERT_TRUE(first.has_value());
  ASSERT_EQ(first->size, 1u);
  EXPECT_EQ(first->data[0], 1);
  EXPECT_FALSE(writer->publish(&c, 1, 0.01));  // the first slot is still the reader's
  EXPECT_EQ(first->data[0], 1);                // and intact
  auto second = reader->receive_in_place(0.0);  // gives the first slot back
  ASSERT_TRUE(second.has_value());
  EXPECT_EQ(second->data[0], 2);
  ASSERT_TRUE(writer->publish(&c, 1, 0.0));
  std::vector<uint8_t> got;
  ASSERT_TRUE(reader->receive(got, 0.0));  // a copying receive releases the in-place one too
  EXPECT_EQ(got, std::vector<uint8_t>{3});
  ASSERT_TRUE(writer->publish(&a, 1, 0.0));
  ASSERT_TRUE(writer->publish(&b, 1, 0.0));  // both slots free again
  EXPECT_FALSE(reader->receive_in_place(0.0) == std::nullopt);
}

TEST(ShmBroadcast, RefusesBadNamesReadersAndRoles) {
  const std::string name = unique_name("refuse");
  auto writer = ShmBroadcast::create(name, 2, 2, 256);
  EXPECT_THROW(ShmBroadcast::create(name, 2, 2, 256), corellm::InvalidArgument);  // taken
  EXPECT_THROW(ShmBroadcast::create("no-slash", 1, 1, 256), corellm::InvalidArgument);
  EXPECT_THROW(ShmBroadcast::create(name + "-x", 0, 1, 256), corellm::InvalidArgument);
  EXPECT_THROW(ShmBroadcast::create(name + "-x", 1, 1, 100), corellm::InvalidArgument);  // not a multiple of 64
  EXPECT_THROW(ShmBroadcast::attach(name, 2), corellm::InvalidArgument);
  EXPECT_THROW(ShmBroadcast::attach(name, -1), corellm::InvalidArgument);
  auto reader = ShmBroadcast::attach(name, 1);
  std::vector<uint8_t> got;
  EXPECT_THROW(writer->receive(got, 0.0), corellm::InvalidArgument);
  EXPECT_THROW(writer->receive_in_place(0.0), corellm::InvalidArgument);
  EXPECT_THROW(reader->publish(nullptr, 0, 0.0), corellm::InvalidArgument);
  writer->unlink_name();
  EXPECT_THROW(ShmBroadcast::attach(name, 0), corellm::InvalidArgument);  // the name is gone ...
  ASSERT_TRUE(writer->publish(nullptr, 0, 1.0));                           // ... the mapping is not
  EXPECT_TRUE(reader->receive(got, 1.0));
}
