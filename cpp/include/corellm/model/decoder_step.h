// DecoderStepArgs: one step's batch as the native decoder stack reads it (decoder_stack.h), and
// each group of it that StepSplit cuts (step_split.h).
#pragma once

#include <cstdint>

namespace corellm {

// One step's batch: its tokens and the attention metadata (python/corellm/model/attention_metadata.py).
struct DecoderStepArgs {
  const int32_t* input_ids = nullptr;  // [num_tokens]
  // [num_tokens, hidden] bf16, or null: the decoder's input rows in place of the embedding lookup
  // (a LLaVA step: image rows merged into the text embeddings).
  const uint16_t* inputs_embeds = nullptr;
  const int32_t* positions = nullptr;  // [num_tokens]
  int64_t num_tokens = 0;              // >= 1
  const int32_t* slot_mapping = nullptr;
  const int32_t* block_table = nullptr;  // [num_seqs, block_table_stride]
  int64_t block_table_stride = 0;
  const int32_t* seq_lens = nullptr;
  const int32_t* query_start_loc = nullptr;  // [num_seqs + 1]
  int64_t num_seqs = 0;
  // [num_tokens]: the LoRA slot of each token's adapter (DecoderStack::set_lora; -1: none), or
  // null: no token of the step has one.
  const int32_t* lora_slots = nullptr;
  uint16_t* out = nullptr;  // [num_tokens, hidden] bf16: the final norm's output
};

}  // namespace corellm
