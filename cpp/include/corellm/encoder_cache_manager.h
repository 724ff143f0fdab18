// EncoderCacheManager: which images' encoder outputs the model runner holds, in placeholder tokens
// (seed 000's EncoderCacheManager), so that the scheduler plans the encoder's work.
//
// An entry per image hash, with the requests using it. The step whose tokens first reach an image
// not held allocates its entry (the runner encodes the image in that step: SchedulerOutput
// encoder_hashes); a request that reaches a held image takes a reference instead (a hit: no
// encoder work). A request drops its reference once its computed tokens pass the image, or when
// it finishes or is preempted; an entry nobody uses stays held — freeable, the least recently
// freed first — until an allocation needs its room (SchedulerOutput freed_encoder_hashes tells
// the runner to drop it). Check, then commit: can_allocate before allocate.
#pragma once

#include <cstdint>
#include <list>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace corellm {

class EncoderCacheManager {
 public:
  explicit EncoderCacheManager(int32_t capacity_tokens = 0);

  int32_t capacity() const { return capacity_; }
  bool has(const std::string& hash) const { return entries_.count(hash) > 0; }
  // Whether an entry of num_tokens fits, evicting freeable entries if need be.
  bool can_allocate(int32_t num_tokens) const;
  // A new entry used by `request_id`, to be encoded by the step being planned (pending until
  // end_step()). Needs can_allocate(num_tokens) and !has(hash).
  void allocate(const std::string& hash, int32_t num_tokens, const std::string& request_id);
  // A reference to a held entry (a freeable one is revived). Returns false if it was not held.
  bool acquire(const std::string& hash, const std::string& request_id);
  // Drops the request's reference. An entry left unused becomes freeable, or, if still pending
  // (its encoding was planned but never ran), is forgotten at once: returns true then.
  bool release(const std::string& hash, const std::string& request_id);
  // The planned step will run: its pending entries are encoded from now on.
  void end_step();
  // Entries evicted since the last call (the runner drops their outputs).
  std::vector<std::string> take_freed();

  int32_t num_used_tokens() const { return used_tokens_; }  // held entries, freeable ones included
  int64_t hits() const { return hits_; }                     // acquisitions of a held entry
  // Every entry's users are disjoint from freeable_; token counts add up.
  void check_integrity() const;

 private:
  struct Entry {
    int32_t num_tokens = 0;
    std::unordered_set<std::string> users;
    bool pending = false;
    std::list<std::string>::iterator freeable_pos;  // valid while users is empty
  };
  void evict_until(int32_t free_tokens_needed);

  int32_t capacity_;
  int32_t used_tokens_ = 0;
  int32_t freeable_tokens_ = 0;
  std::unordered_map<std::string, Entry> entries_;
  std::list<std::string> freeable_;  // least recently freed first
  std::vector<std::string> freed_;
  int64_t hits_ = 0;
};

}  // namespace corellm
