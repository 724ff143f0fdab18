"""InputProcessor: turns a user's prompt and SamplingParams into EngineCoreRequests — tokenized,
validated against the model's context, defaults filled in, one request per sample when n > 1."""

from __future__ import annotations

import random
import time
import uuid
from dataclasses import dataclass

from corellm.engine_core_request import EngineCoreRequest
from corellm.lora.lora_registry import LoraRegistry
from corellm.lora.lora_request import LoRARequest
from corellm.inputs import PromptType, check_prompt_keys, prompt_cache_salt
from corellm.multimodal.image_inputs import ImageInputs
from corellm.model.matryoshka import check_dimensions
from corellm.pooling_params import PoolingParams
from corellm.reasoning_parser import HARMONY, THINK_END, THINK_START
from corellm.sampling_params import RequestOutputKind, SamplingParams, StructuredOutputsParams
from corellm.structured_output import GrammarCompiler
from corellm.structured_output.reasoning_wait import ForcedReasoningEnd, ReasoningBudget
from corellm.tokenizer import Tokenizer

@dataclass
class ProcessedRequest:
    """One user request after processing: its n engine-core requests and what the output needs."""

    request_id: str  # the caller's id
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    samples: list[EngineCoreRequest]  # one engine-core request per sample (n of them)

    @property
    def num_samples(self) -> int:
        return len(self.samples)

    @property
    def num_prompt_tokens(self) -> int:
        """Prompt tokens to compute, counting each sample's."""
        return len(self.prompt_token_ids) * len(self.samples)


def generation_refusal(classifier_labels: tuple[str, ...]) -> str:
    """Why a sequence classifier (ModelConfig's classifier_labels) does not generate."""
    shown = ", ".join(classifier_labels[:4]) + (", ..." if len(classifier_labels) > 4 else "")
    return (f"this model is a sequence classifier ({len(classifier_labels)} labels: {shown}), which has no "
            f"language-model head: it serves classify, score and rerank (and embeddings), not generation")


# Why an encoder-only model (EncoderConfig) does not generate.
ENCODER_REFUSAL = ("this model is an encoder (bidirectional attention, no language-model head): it serves embeddings, "
                   "score and rerank (and classify, if a sequence classifier), not generation")


class InputProcessor:
    def __init__(self, tokenizer: Tokenizer, vocab_size: int, max_model_len: int,
                 extra_eos_token_ids: list[int] | None = None, seed: int = 0, scheduling_policy: str = "fcfs",
                 grammar_compiler: GrammarCompiler | None = None, reasoning_parser: str | None = None,
                 image_inputs: ImageInputs | None = None, prediction_drafts: bool = False,
                 loras: LoraRegistry | None = None, classifier_labels: tuple[str, ...] = (),
                 encoder_only: bool = False, type_vocab_size: int = 0, embedding_size: int = 0,
                 matryoshka_dimensions: tuple[int, ...] | None = None):
        """classifier_labels: a sequence classifier's labels (ModelConfig's): it serves pooling
        requests only, and classifications; (): a generator, which classifies nothing.
        encoder_only: an encoder (EncoderConfig: BERT, XLM-R), which serves pooling requests only;
        type_vocab_size: the token types its embedding tells apart (a prompt's token_type_ids; 0:
        the model reads none). embedding_size: the length of the model's vectors (its hidden size);
        matryoshka_dimensions: the config's (model/matryoshka.py), which a request's dimensions must fit."""
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.max_model_len = max_model_len
        self.extra_eos = [t for t in (extra_eos_token_ids or []) if t != tokenizer.eos_token_id]
        self.scheduling_policy = scheduling_policy
        self.grammar_compiler = grammar_compiler  # checks structured output specs (None: refused)
        self.reasoning_parser = reasoning_parser  # a reasoning model: grammars start after its reasoning
        self._rng = random.Random(seed)  # seeds for requests that bring none: reproducible per engine
        self.image_inputs = image_inputs  # a model that takes images (LLaVA); None: text only
        self.prediction_drafts = prediction_drafts  # the scheduler drafts n-grams (a prediction's too)
        self.loras = loras  # the LoRA adapters known (None: the engine runs without LoRA)
        self.classifier_labels = classifier_labels
        self.encoder_only = encoder_only
        self.type_vocab_size = type_vocab_size
        self.embedding_size = embedding_size
        self.matryoshka_dimensions = matryoshka_dimensions

    def images(self, prompt: PromptType, ids: list[int]):
        """(ids with each image's placeholders expanded, its MultiModalFeatures) for a prompt's
        multi_modal_data {"image": one image or a list} (vLLM's form)."""
        data = prompt.get("multi_modal_data") if isinstance(prompt, dict) else None
        if data is None:
            images = []
        elif not isinstance(data, dict) or set(data) - {"image"}:
            kinds = sorted(data) if isinstance(data, dict) else type(data).__name__
            raise ValueError(f"multi_modal_data takes {{'image': an image or a list of images}}, got {kinds}")
        else:
            images = data["image"] if isinstance(data["image"], (list, tuple)) else [data["image"]]
        if self.image_inputs is None:
            if images:
                raise ValueError("this model takes no images (multi_modal_data needs a LLaVA-style model)")
            return ids, []
        if not images and self.image_inputs.image_token_id not in ids:
            return ids, []
        names = prompt.get("multi_modal_names") if isinstance(prompt, dict) else None
        return self.image_inputs.apply(ids, images, names)

    def tokenize(self, prompt: PromptType) -> tuple[str | None, list[int]]:
        if isinstance(prompt, str):
            return prompt, self.tokenizer.encode(prompt)
        if isinstance(prompt, dict):
            check_prompt_keys(prompt)
            if "prompt_token_ids" in prompt:
                ids = prompt["prompt_token_ids"]
                if not isinstance(ids, (list, tuple)) or not all(
                        isinstance(t, int) and not isinstance(t, bool) for t in ids):
                    raise ValueError("prompt_token_ids must be a list of integers")
                bad = [t for t in ids if not 0 <= t < self.vocab_size]
                if bad:
                    raise ValueError(f"prompt_token_ids holds token id {bad[0]} outside the vocabulary "
                                     f"[0, {self.vocab_size})")
                return prompt.get("prompt"), list(ids)
            if "prompt" in prompt and isinstance(prompt["prompt"], str):
                return prompt["prompt"], self.tokenizer.encode(prompt["prompt"])
        raise ValueError(f"a prompt must be a string, a TextPrompt (a dict with 'prompt') or a TokensPrompt (a "
                         f"dict with 'prompt_token_ids'), got {type(prompt).__name__}")

    def process(self, request_id: str, prompt: PromptType, params: SamplingParams | PoolingParams | None,
                arrival_time: float | None = None, priority: int = 0, cache_salt: str = "",
                lora_request: LoRARequest | None = None) -> ProcessedRequest:
        """params: how to generate, or PoolingParams for an embedding request (as vLLM takes
        either): its prompt is computed and pooled; the one token it samples to end is not kept.
        lora_request: the LoRA adapter to run with (loaded on its first use)."""
        lora = None
        if lora_request is not None:
            if self.loras is None:
                raise ValueError("lora_request: this engine runs without LoRA (start it with enable_lora=True, "
                                 "--enable-lora)")
            lora = self.loras.resolve(lora_request)
        if params is None:
            params = SamplingParams()
        pooling = None
        if isinstance(params, PoolingParams):
            if params.task == "classify" and not self.classifier_labels:
                raise ValueError("classify: this model is not a sequence classifier (its architecture is not one "
                                 "of the *ForSequenceClassification); it serves generation and embeddings")
            if params.dimensions is not None:
                check_dimensions(params.dimensions, self.embedding_size, self.matryoshka_dimensions)
            pooling, params = params, SamplingParams(max_tokens=1, temperature=0.0,
                                                     output_kind=RequestOutputKind.FINAL_ONLY)
        elif self.classifier_labels:
            raise ValueError(generation_refusal(self.classifier_labels))
        elif self.encoder_only:
            raise ValueError(ENCODER_REFUSAL)
        if not isinstance(params, SamplingParams):
            raise ValueError(f"sampling params must be a SamplingParams or a PoolingParams, got {type(params).__name__}")
        text, ids = self.tokenize(prompt)
        cache_salt = cache_salt or prompt_cache_salt(prompt)  # the caller's (a request body's) first
        ids, mm_features = self.images(prompt, ids)
        if not ids:
            raise ValueError("The prompt is empty: at least one token is needed")
        token_type_ids = self.token_types(prompt, len(ids))
        if len(ids) >= self.max_model_len and pooling is not None:
            raise ValueError(f"The input ({len(ids)} tokens) is too long to fit into the model (context length "
                             f"{self.max_model_len}; an input takes at most {self.max_model_len - 1} tokens, one "
                             f"position being kept for the token that ends the request)")
        if len(ids) >= self.max_model_len:
            raise ValueError(f"The prompt (total length {len(ids)}) is too long to fit into the model "
                             f"(context length {self.max_model_len}); at least one token must be generated")
        params = params.clone()
        if params.max_tokens is None:
            params.max_tokens = self.max_model_len - len(ids)
            if params.min_tokens > params.max_tokens:
                raise ValueError(f"min_tokens ({params.min_tokens}) exceeds the {params.max_tokens} tokens the context "
                                 f"leaves after the prompt")
        if params.logit_bias:
            bad = [t for t in params.logit_bias if t >= self.vocab_size]
            if bad:
                raise ValueError(f"logit_bias has token id {bad[0]} outside the vocabulary [0, {self.vocab_size})")
        bad_allowed = [t for t in params.allowed_token_ids or [] if t >= self.vocab_size]
        if bad_allowed:
            raise ValueError(f"allowed_token_ids has token id {bad_allowed[0]} outside the vocabulary "
                             f"[0, {self.vocab_size})")
        bad_stop = [t for t in params.stop_token_ids if t >= self.vocab_size]
        if bad_stop:
            raise ValueError(f"stop_token_ids has token id {bad_stop[0]} outside the vocabulary [0, {self.vocab_size})")
        bad_scored = [t for t in params.logprob_token_ids or [] if t >= self.vocab_size]
        if bad_scored:
            raise ValueError(f"logprob_token_ids has token id {bad_scored[0]} outside the vocabulary "
                             f"[0, {self.vocab_size})")
        if params.logprobs is not None and params.logprobs > self.vocab_size:
            raise ValueError(f"logprobs ({params.logprobs}) exceeds the vocabulary size {self.vocab_size}")
        self.check_priority(priority)
        stop_token_ids = self.stop_token_ids(params)
        bad_words_token_ids = self.bad_words_token_ids(params)
        grammar_key = None
        if params.structured_outputs is not None:
            if self.grammar_compiler is None:
                raise ValueError("structured_outputs: this engine has no grammar compiler")
            self.grammar_compiler.check(params.structured_outputs)  # ValueError naming the field
            grammar_key = params.structured_outputs.key()
        if self.reasoning_parser == HARMONY and (grammar_key is not None or params.thinking_token_budget is not None):
            field = "structured_outputs" if grammar_key is not None else "thinking_token_budget"
            raise ValueError(f"{field} is not supported with gpt-oss's harmony format (reasoning parser {HARMONY}) yet: "
                             f"its answer follows an analysis message, which a grammar or a budget would cut")
        # Where the prompt leaves a reasoning model's block: read once, for the grammar and the budget.
        block = None
        if self.reasoning_parser is not None and (grammar_key is not None or params.thinking_token_budget is not None):
            block = self._prompt_block(ids)
        grammar_starts_after = THINK_END if grammar_key is not None and block not in (None, "closed") else None
        reasoning_budget = self._reasoning_budget(block, params.thinking_token_budget, params.structured_outputs)
        prediction_token_ids = self.prediction_token_ids(params, constrained=grammar_key is not None
                                                         or reasoning_budget is not None)
        arrival = time.time() if arrival_time is None else arrival_time
        parent_id = f"{request_id}-{uuid.uuid4().hex[:8]}"
        samples = []
        for i in range(params.n):
            sample_params = params
            if params.n > 1:
                sample_params = params.clone()
                sample_params.n = 1
            seed = (params.seed + i) % 2**64 if params.seed is not None else self._rng.getrandbits(63)
            samples.append(EngineCoreRequest(
                request_id=parent_id if params.n == 1 else f"{parent_id}#{i}",
                prompt_token_ids=ids,
                sampling_params=sample_params,
                eos_token_id=self.tokenizer.eos_token_id,
                stop_token_ids=stop_token_ids,
                arrival_time=arrival,
                bad_words_token_ids=bad_words_token_ids,
                seed=seed,
                priority=priority,
                cache_salt=cache_salt,
                grammar_key=grammar_key,
                grammar_starts_after=grammar_starts_after,
                reasoning_budget=reasoning_budget,
                mm_features=mm_features,
                prediction_token_ids=prediction_token_ids,
                pooling=pooling,
                token_type_ids=token_type_ids,
                lora=lora,
            ))
        return ProcessedRequest(request_id, text, ids, params, samples)

    def token_types(self, prompt: PromptType, num_tokens: int) -> list[int] | None:
        """A TokensPrompt's token_type_ids, checked: one per token, each a type the model's embedding
        has (ValueError naming what is wrong, and on a model that reads none); None when absent."""
        types = prompt.get("token_type_ids") if isinstance(prompt, dict) else None
        if types is None:
            return None
        if self.type_vocab_size == 0:
            raise ValueError("token_type_ids: this model reads no token types (they are an encoder's, such as BERT's)")
        if not isinstance(types, (list, tuple)) or len(types) != num_tokens or not all(
                isinstance(t, int) and not isinstance(t, bool) and 0 <= t < self.type_vocab_size for t in types):
            raise ValueError(f"token_type_ids must be {num_tokens} integers (one per prompt token), each in "
                             f"[0, {self.type_vocab_size}); got {types!r:.200}")
        return list(types)

    def _prompt_block(self, prompt_ids: list[int]) -> str:
        """Where the prompt's end leaves the reasoning block: "closed" (it ends with an empty or
        whole block: thinking turned off in the template), "open" (its last block is not closed:
        the template opened it), or "none" (no block, or only earlier ones: examples, history)."""
        tail = self.tokenizer.decode(prompt_ids[-32:], skip_special_tokens=False)
        end, start = tail.rfind(THINK_END), tail.rfind(THINK_START)
        if end > start:
            return "closed" if not tail[end + len(THINK_END):].strip() else "none"
        return "open" if start >= 0 else "none"

    def _reasoning_budget(self, block: str | None, tokens: int | None,
                          answer: StructuredOutputsParams | None) -> ReasoningBudget | None:
        """thinking_token_budget as the engine applies it, given where the prompt leaves the block
        (_prompt_block): none where the prompt closed it (there is no reasoning to bound). The
        output is reasoning from its first token where the prompt opened the block, and always
        with deepseek_r1 (ReasoningParser)."""
        if tokens is None:
            return None
        if self.reasoning_parser is None:
            raise ValueError("thinking_token_budget needs a reasoning model: start the engine with a reasoning "
                             "parser (reasoning_parser= / --reasoning-parser deepseek_r1|qwen3)")
        if self.grammar_compiler is None:
            raise ValueError("thinking_token_budget: this engine has no grammar compiler")
        if block == "closed":
            return None
        self.grammar_compiler.check(ForcedReasoningEnd(answer))  # compiled now: the end is forced without delay
        return ReasoningBudget(tokens, opened=block == "open" or self.reasoning_parser == "deepseek_r1")

    def check_priority(self, priority: object) -> None:
        """ValueError unless priority is an int32, and 0 where the policy is FCFS (vLLM's rule: a
        priority the scheduler would ignore is refused, not dropped)."""
        if isinstance(priority, bool) or not isinstance(priority, int) or not -2**31 <= priority < 2**31:
            raise ValueError(f"priority must be a 32-bit integer, got {priority!r}")
        if priority != 0 and self.scheduling_policy != "priority":
            raise ValueError(f"priority {priority} needs the priority scheduling policy (this engine runs "
                             f"{self.scheduling_policy!r}: start it with scheduling_policy='priority' / "
                             f"--scheduling-policy priority)")

    def prediction_token_ids(self, params: SamplingParams, constrained: bool) -> list[int]:
        """The prediction's tokens (drafts where the output follows it); a ValueError when no draft
        would ever be taken from them: an engine without n-gram speculative decoding, or a request
        whose tokens are masked (structured output, a thinking budget: they get no drafts)."""
        if params.prediction is None:
            return []
        if not self.prediction_drafts:
            raise ValueError('prediction needs n-gram speculative decoding: start the engine with a speculative '
                             'config such as {"method": "ngram", "num_speculative_tokens": 4}')
        if constrained:
            raise ValueError("prediction cannot speed up a request with structured output or a thinking token "
                             "budget (its tokens are masked: it gets no drafts)")
        ids = self.tokenizer.encode(params.prediction, add_special_tokens=False)
        if len(ids) > self.max_model_len:
            raise ValueError(f"prediction has {len(ids)} tokens, more than any output could hold (the context is "
                             f"{self.max_model_len} tokens)")
        return ids

    def bad_words_token_ids(self, params: SamplingParams) -> list[list[int]]:
        """Each bad word's tokens alone and after a space (vLLM's rule: a word inside a text is
        usually tokenized with its leading space), without repeats."""
        sequences: list[list[int]] = []
        for word in params.bad_words or []:
            for text in (word.lstrip(), " " + word.lstrip()):
                ids = self.tokenizer.encode(text, add_special_tokens=False)
                if ids and ids not in sequences:
                    sequences.append(ids)
        return sequences

    def stop_token_ids(self, params: SamplingParams) -> list[int]:
        """Token ids that finish a request: its own, plus the model's extra EOS ids unless ignore_eos."""
        ids = list(params.stop_token_ids)
        if not params.ignore_eos:
            ids += [t for t in self.extra_eos if t not in ids]
        return ids
