// RequestQueue: the waiting queue, in FCFS order or by (priority, arrival).
#pragma once

#include <cstddef>
#include <deque>
#include <set>
#include <vector>

#include "corellm/request.h"

namespace corellm {

// Orders requests by (priority, arrival_time, arrival_seq): lower values first.
struct PriorityOrder {
  bool operator()(const Request* a, const Request* b) const {
    if (a->priority != b->priority) return a->priority < b->priority;
    if (a->arrival_time != b->arrival_time) return a->arrival_time < b->arrival_time;
    return a->arrival_seq < b->arrival_seq;
  }
};

class RequestQueue {
 public:
  explicit RequestQueue(SchedulingPolicy policy) : policy_(policy) {}

  SchedulingPolicy policy() const { return policy_; }
  size_t size() const { return policy_ == SchedulingPolicy::FCFS ? fifo_.size() : ordered_.size(); }
  bool empty() const { return size() == 0; }

  // A new request: FCFS appends it; PRIORITY inserts it by its key.
  void add(Request* request);
  // A preempted request goes back ahead of everything that arrived after it: FCFS puts it at
  // the front; PRIORITY re-inserts it by its original key.
  void add_preempted(Request* request);
  Request* peek() const;  // requires !empty()
  Request* pop();         // requires !empty()
  // Removes a request wherever it is; false when it is not queued. O(n) for FCFS.
  bool remove(Request* request);
  std::vector<const Request*> requests() const;

 private:
  SchedulingPolicy policy_;
  std::deque<Request*> fifo_;
  std::set<Request*, PriorityOrder> ordered_;
};

}  // namespace corellm
