// RepetitionDetection: a request's rule for ending an output that loops (vLLM's
// repetition_detection). A model can fall into repeating a phrase ("abcdabcdabcd...") until
// max_tokens; with this rule the request ends as soon as its output ends with one pattern of
// min_pattern_size..max_pattern_size tokens written min_count times in a row, finish reason
// "repetition". Only the output is looked at, never the prompt.
//
// The check runs after each appended token (Scheduler::check_stop). For each pattern length L in
// [min_pattern_size, max_pattern_size], smallest first: the last L * min_count output tokens are
// min_count copies of the last L, i.e. out[n - 1 - i] == out[n - 1 - i - L * m] for every
// i < L and 1 <= m < min_count. A mismatch ends the try of that L at once, so a step costs about
// one comparison per pattern length unless the output is nearly looping.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace corellm {

struct RepetitionDetection {
  int32_t max_pattern_size = 0;  // 0: no detection
  int32_t min_pattern_size = 0;  // 0: 1
  int32_t min_count = 0;         // how many copies in a row end the request (>= 2 when detecting)

  bool enabled() const { return max_pattern_size > 0; }

  // Throws InvalidArgument (naming the field and `request_id`) for sizes below 0, min above max,
  // or, when enabled, min_count below 2.
  void validate(const std::string& request_id) const;

  // Whether outputs[0, n) end with one pattern repeated min_count times (false when disabled).
  bool ends_in_repetition(const int32_t* outputs, size_t n) const;
};

}  // namespace corellm
