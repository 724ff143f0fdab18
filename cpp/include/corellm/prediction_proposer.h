// Prediction proposer (OpenAI's Predicted Outputs): draft tokens for speculative decoding read from
// a request's `prediction`, text its output is expected to largely repeat (a file being edited,
// a document rewritten), at the place the output has reached in it.
#pragma once

#include <cstdint>
#include <vector>

#include "corellm/ngram_proposer.h"

namespace corellm {

// Where a request's output stands in its prediction.
struct PredictionCursor {
  int32_t position = 0;  // the prediction's token the output is expected to write next; -1: lost
  int32_t seen = 0;      // output tokens followed so far
};

// Follows the output tokens not yet seen: a token equal to the prediction's at the cursor moves
// the cursor on; any other loses the alignment, looked for again once they are all read: the
// output's longest suffix (max_n tokens down to min_n) found in the prediction — its first
// occurrence from where the output last followed the prediction on (the output skipped part of
// it, or wrote its own tokens and came back), else its first anywhere — puts the cursor after
// that occurrence; none found: lost until a later call finds one. Then writes the prediction's
// next max_drafts tokens from the cursor to drafts and returns how many (0 when lost or at its end).
// O(new output tokens) while aligned; a search costs O(prediction * max_n).
int32_t propose_prediction_drafts(const std::vector<int32_t>& prediction, const int32_t* output, int32_t num_output,
                                  const NgramParams& params, int32_t max_drafts, int32_t* drafts,
                                  PredictionCursor& cursor);

}  // namespace corellm
