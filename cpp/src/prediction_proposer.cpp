// Prediction proposer: a cursor that follows the output through the prediction, found again by a
// suffix search when the output leaves it.
#include "corellm/prediction_proposer.h"

#include <algorithm>

namespace corellm {

namespace {

// The first start s in [from, to) where prediction[s, s + m) equals the last m output tokens; -1: none.
int32_t find_suffix(const std::vector<int32_t>& prediction, const int32_t* suffix, int32_t m, int32_t from,
                    int32_t to) {
  const int32_t last_start = std::min(to, static_cast<int32_t>(prediction.size()) - m + 1);
  for (int32_t s = std::max(from, 0); s < last_start; ++s) {
    if (std::equal(suffix, suffix + m, prediction.begin() + s)) return s;
  }
  return -1;
}

}  // namespace

int32_t propose_prediction_drafts(const std::vector<int32_t>& prediction, const int32_t* output, int32_t num_output,
                                  const NgramParams& params, int32_t max_drafts, int32_t* drafts,
                                  PredictionCursor& cursor) {
  const auto size = static_cast<int32_t>(prediction.size());
  bool lost = cursor.position < 0;
  int32_t followed_to = std::max(cursor.position, 0);  // where the output last followed the prediction
  for (; cursor.seen < num_output; ++cursor.seen) {
    const int32_t token = output[cursor.seen];
    if (!lost && cursor.position < size && prediction[static_cast<size_t>(cursor.position)] == token) {
      followed_to = ++cursor.position;
    } else {
      lost = true;
    }
  }
  if (lost) {
    cursor.position = -1;
    for (int32_t m = std::min(params.max_n, num_output); m >= params.min_n && cursor.position < 0; --m) {
      const int32_t* suffix = output + num_output - m;
      int32_t s = find_suffix(prediction, suffix, m, followed_to, size);
      if (s < 0) s = find_suffix(prediction, suffix, m, 0, followed_to);
      if (s >= 0) cursor.position = s + m;
    }
  }
  if (cursor.position < 0 || max_drafts <= 0) return 0;
  const int32_t count = std::min(max_drafts, size - cursor.position);
  std::copy(prediction.begin() + cursor.position, prediction.begin() + cursor.position + count, drafts);
  return count;
}

}  // namespace corellm
