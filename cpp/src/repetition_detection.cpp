// RepetitionDetection: the check and its validation (the rule is stated in the header).
#include "corellm/repetition_detection.h"

#include <algorithm>

#include "corellm/check.h"

namespace corellm {

void RepetitionDetection::validate(const std::string& request_id) const {
  CORELLM_CHECK_ARG(max_pattern_size >= 0 && min_pattern_size >= 0 && min_pattern_size <= max_pattern_size,
                    "request '", request_id, "': repetition_detection needs 0 <= min_pattern_size <= ",
                    "max_pattern_size, got min_pattern_size ", min_pattern_size, " and max_pattern_size ",
                    max_pattern_size, " (max_pattern_size 0 turns detection off)");
  CORELLM_CHECK_ARG(!enabled() || min_count >= 2, "request '", request_id,
                    "': repetition_detection.min_count must be at least 2 (a pattern and one repeat of it), got ",
                    min_count);
}

bool RepetitionDetection::ends_in_repetition(const int32_t* outputs, size_t n) const {
  if (!enabled()) return false;
  const int64_t count = min_count;
  for (int64_t length = std::max<int32_t>(min_pattern_size, 1); length <= max_pattern_size; ++length) {
    if (length * count > static_cast<int64_t>(n)) return false;  // longer patterns fit even less
    const int32_t* end = outputs + n;  // the pattern is end[-length, 0)
    bool repeated = true;
    for (int64_t i = 1; i <= length && repeated; ++i) {
      for (int64_t m = 1; m < count; ++m) {
        if (end[-i - length * m] != end[-i]) {
          repeated = false;
          break;
        }
      }
    }
    if (repeated) return true;
  }
  return false;
}

}  // namespace corellm
