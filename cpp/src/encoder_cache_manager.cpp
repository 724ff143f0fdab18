// EncoderCacheManager: the held encoder outputs' accounting (see the header).
#include "corellm/encoder_cache_manager.h"

#include <algorithm>

#include "corellm/check.h"

namespace corellm {

EncoderCacheManager::EncoderCacheManager(int32_t capacity_tokens) : capacity_(capacity_tokens) {
  CORELLM_CHECK_ARG(capacity_tokens >= 0, "encoder cache capacity must be >= 0, got ", capacity_tokens);
}

bool EncoderCacheManager::can_allocate(int32_t num_tokens) const {
  return capacity_ - used_tokens_ + freeable_tokens_ >= num_tokens;
}

void EncoderCacheManager::evict_until(int32_t free_tokens_needed) {
  while (capacity_ - used_tokens_ < free_tokens_needed && !freeable_.empty()) {
    const std::string hash = freeable_.front();
    freeable_.pop_front();
    auto it = entries_.find(hash);
    used_tokens_ -= it->second.num_tokens;
    freeable_tokens_ -= it->second.num_tokens;
    entries_.erase(it);
    freed_.push_back(hash);
  }
}

void EncoderCacheManager::allocate(const std::string& hash, int32_t num_tokens, const std::string& request_id) {
  CORELLM_CHECK(!has(hash), "encoder cache: image ", hash, " allocated twice");
  CORELLM_CHECK(can_allocate(num_tokens), "encoder cache: ", num_tokens, " tokens allocated without room");
  evict_until(num_tokens);
  Entry& entry = entries_[hash];
  entry.num_tokens = num_tokens;
  entry.users.insert(request_id);
  entry.pending = true;
  used_tokens_ += num_tokens;
}

bool EncoderCacheManager::acquire(const std::string& hash, const std::string& request_id) {
  auto it = entries_.find(hash);
  if (it == entries_.end()) return false;
  Entry& entry = it->second;
  if (entry.users.empty()) {
    freeable_.erase(entry.freeable_pos);
    freeable_tokens_ -= entry.num_tokens;
  }
  if (entry.users.insert(request_id).second) ++hits_;
  return true;
}

bool EncoderCacheManager::release(const std::string& hash, const std::string& request_id) {
  auto it = entries_.find(hash);
  if (it == entries_.end()) return false;
  Entry& entry = it->second;
  if (entry.users.erase(request_id) == 0 || !entry.users.empty()) return false;
  if (entry.pending) {  // never encoded: nothing for the runner to drop
    used_tokens_ -= entry.num_tokens;
    entries_.erase(it);
    return true;
  }
  entry.freeable_pos = freeable_.insert(freeable_.end(), hash);
  freeable_tokens_ += entry.num_tokens;
  return false;
}

void EncoderCacheManager::end_step() {
  for (auto& [hash, entry] : entries_) entry.pending = false;
}

std::vector<std::string> EncoderCacheManager::take_freed() {
  std::vector<std::string> out;
  out.swap(freed_);
  return out;
}

void EncoderCacheManager::check_integrity() const {
  int32_t used = 0, freeable = 0;
  for (const auto& [hash, entry] : entries_) {
    used += entry.num_tokens;
    if (entry.users.empty()) freeable += entry.num_tokens;
  }
  CORELLM_CHECK(used == used_tokens_ && freeable == freeable_tokens_, "encoder cache: ", used_tokens_,
                " tokens counted used and ", freeable_tokens_, " freeable, entries hold ", used, " and ", freeable);
  CORELLM_CHECK(static_cast<size_t>(std::count_if(entries_.begin(), entries_.end(),
                                                  [](const auto& e) { return e.second.users.empty(); })) ==
                    freeable_.size(),
                "encoder cache: the freeable list does not match the unused entries");
  CORELLM_CHECK(used_tokens_ <= capacity_, "encoder cache: ", used_tokens_, " tokens held over its capacity ",
                capacity_);
}

}  // namespace corellm
