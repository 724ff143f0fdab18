"""EngineCoreRequest: a request as the engine core takes it (token ids, validated parameters).
The first boundary structure (InputProcessor -> EngineCore); it travels on into the model runner
as the scheduler's payload, so it lives outside both engine/ and worker/."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from corellm.multimodal.features import MultiModalFeature
from corellm.pooling_params import PoolingParams
from corellm.sampling_params import SamplingParams

if TYPE_CHECKING:  # (structured_output imports this module)
    from corellm.lora.lora_adapter import LoraAdapter
    from corellm.structured_output.reasoning_wait import ReasoningBudget


@dataclass
class EngineCoreRequest:
    request_id: str  # internal id: unique within the engine (one per sample when n > 1)
    prompt_token_ids: list[int]
    sampling_params: SamplingParams  # validated; max_tokens filled in
    eos_token_id: int | None  # the tokenizer's EOS: ends the request unless ignore_eos
    # Further ids that end the request: its own stop_token_ids, plus the model's extra EOS ids
    # (generation_config) unless ignore_eos. Computed once, by the InputProcessor; the scheduler
    # stops on them and the sampler bans them (with EOS) before min_tokens.
    stop_token_ids: list[int]
    arrival_time: float  # seconds (time.time()): FCFS order among equal priorities
    seed: int  # key of this request's random stream (from params.seed, or drawn by the engine)
    priority: int = 0  # lower runs first under scheduling_policy "priority"
    # Its bad_words as token sequences (each word alone and after a space, without repeats), by the
    # InputProcessor: the sampler bans a sequence's last token where the output ends with the rest.
    bad_words_token_ids: list[list[int]] = field(default_factory=list)
    cache_salt: str = ""  # isolates this request's prefix-cache entries from other tenants'
    # The compiled-grammar key (StructuredOutputsParams.key()) when a grammar constrains the
    # output: the engine fetches the request's matcher from the compiler's cache by it.
    grammar_key: str | None = None
    # With a reasoning model: the grammar applies only once the output holds this text (the end
    # of its reasoning block, "</think>"); None: from the first token.
    grammar_starts_after: str | None = None
    # With thinking_token_budget, a reasoning model and a prompt that does not close the
    # reasoning block: the block's budget (the engine forces "</think>" once it is spent).
    reasoning_budget: ReasoningBudget | None = None
    # One per image in the prompt (a LLaVA model): its pixels, placeholder range and content hash.
    # The hashes key the prefix-cache blocks over the placeholders; the model runner encodes the
    # images (or finds them in its encoder cache) and merges their rows into the embeddings.
    mm_features: list[MultiModalFeature] = field(default_factory=list)
    # Its prediction's tokens (SamplingParams.prediction): the scheduler drafts from them first.
    prediction_token_ids: list[int] = field(default_factory=list)
    # An embedding request: its prompt's hidden states pooled into a vector (worker/pooler.py);
    # its sampling_params then ask for the one token that ends it, which nobody reads.
    pooling: PoolingParams | None = None
    # Each prompt token's type (an encoder's segment, BERT's token_type_ids: a cross-encoder pair's
    # second text is 1); None: every token's type 0, or a model that reads none.
    token_type_ids: list[int] | None = None
    # The LoRA adapter it runs with (None: the base model): the engine places it in one of the
    # model runner's slots before the request enters the scheduler, and its prefix-cache entries
    # are keyed by the adapter's load.
    lora: LoraAdapter | None = None

    @property
    def uses_grammar(self) -> bool:
        """Its sampled tokens may be masked (structured output, or a reasoning budget's forced
        end): the StructuredOutputManager follows it, and it gets no speculative drafts."""
        return self.grammar_key is not None or self.reasoning_budget is not None
