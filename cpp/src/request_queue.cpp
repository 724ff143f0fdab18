// The waiting queue: a deque for FCFS, an ordered set for the priority policy.
#include "corellm/request_queue.h"

#include <algorithm>

#include "corellm/check.h"

namespace corellm {

void RequestQueue::add(Request* request) {
  if (policy_ == SchedulingPolicy::FCFS) {
    fifo_.push_back(request);
  } else {
    CORELLM_CHECK(ordered_.insert(request).second, "request ", request->request_id, " queued twice");
  }
}

void RequestQueue::add_preempted(Request* request) {
  if (policy_ == SchedulingPolicy::FCFS) {
    fifo_.push_front(request);
  } else {
    add(request);
  }
}

Request* RequestQueue::peek() const {
  CORELLM_CHECK(!empty(), "peek on an empty queue");
  return policy_ == SchedulingPolicy::FCFS ? fifo_.front() : *ordered_.begin();
}

Request* RequestQueue::pop() {
  Request* request = peek();
  if (policy_ == SchedulingPolicy::FCFS) {
    fifo_.pop_front();
  } else {
    ordered_.erase(ordered_.begin());
  }
  return request;
}

bool RequestQueue::remove(Request* request) {
  if (policy_ == SchedulingPolicy::FCFS) {
    auto it = std::find(fifo_.begin(), fifo_.end(), request);
    if (it == fifo_.end()) return false;
    fifo_.erase(it);
    return true;
  }
  return ordered_.erase(request) > 0;
}

std::vector<const Request*> RequestQueue::requests() const {
  if (policy_ == SchedulingPolicy::FCFS) return {fifo_.begin(), fifo_.end()};
  return {ordered_.begin(), ordered_.end()};
}

}  // namespace corellm
