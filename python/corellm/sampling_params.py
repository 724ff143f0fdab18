"""SamplingParams: how to generate for one request (vLLM's fields and defaults), validated on
construction with a ValueError that names the field and the value."""

from __future__ import annotations

import enum
import struct
import json
from dataclasses import dataclass
from typing import Any


class RequestOutputKind(enum.Enum):
    CUMULATIVE = 0  # every output carries the whole text so far
    DELTA = 1  # every output carries only what is new
    FINAL_ONLY = 2  # one output, when the request finishes


_GREEDY_EPS = 1e-5  # temperatures below this are greedy, as in vLLM


_KINDS = ("json", "regex", "choice", "grammar", "structural_tag")  # StructuredOutputsParams' fields that are a kind


@dataclass
class StructuredOutputsParams:
    """What a request's output must match: exactly one of a JSON schema (`json`, a dict or its
    JSON text), any JSON object (`json_object=True`), a regular expression (`regex`), one of a
    list of strings (`choice`), a grammar (`grammar`: Lark, as llguidance reads it, or GBNF as
    llama.cpp writes it), or free text in which each of some tags is followed by JSON of its
    schema (`structural_tag`: tool calls written inside the text, such as
    `<function=get_weather>{"city": "Paris"}</function>`). vLLM's names. The engine checks it
    against the model's tokenizer when the request arrives: an invalid spec, or a JSON schema
    keyword it cannot enforce, is a ValueError naming the field.

    How the JSON is written (json, json_object and a structural tag's schemas; with the other
    kinds these are ValueErrors): `disable_any_whitespace` allows no whitespace between its
    tokens, `whitespace_pattern` is a regex of the whitespace allowed there (by default up to 20
    spaces, tabs and newlines at a time), `disable_additional_properties` closes every object
    schema that does not say otherwise (`additionalProperties: false`: only its properties).
    `disable_fallback` is accepted either way: corellm has one backend (llguidance) and never
    falls back to another."""

    json: str | dict[str, Any] | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    # {"type": "structural_tag", "structures": [{"begin", "schema", "end"}, ...], "triggers": [...]}
    # or its JSON text: each structure's begin starts with one of the triggers.
    structural_tag: str | dict[str, Any] | None = None
    disable_any_whitespace: bool = False
    whitespace_pattern: str | None = None
    disable_additional_properties: bool = False
    disable_fallback: bool = False

    def __post_init__(self) -> None:
        given = [name for name in _KINDS if getattr(self, name) is not None]
        if self.json_object:
            given.append("json_object")
        if len(given) != 1:
            raise ValueError(f"structured_outputs needs exactly one of json, regex, choice, grammar, json_object or "
                             f"structural_tag, got {given or 'none'}.")
        if self.json is not None:
            self.json = _json_object("structured_outputs.json", self.json, "a JSON schema object")
        for name in ("regex", "grammar"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"structured_outputs.{name} must be a non-empty string, got {value!r}.")
        if self.choice is not None and (not isinstance(self.choice, list) or not self.choice
                                        or any(not isinstance(c, str) for c in self.choice)):
            raise ValueError(f"structured_outputs.choice must be a non-empty list of strings, got {self.choice!r}.")
        for name in ("json_object", "disable_any_whitespace", "disable_additional_properties", "disable_fallback"):
            if getattr(self, name) is not None and not isinstance(getattr(self, name), bool):
                raise ValueError(f"structured_outputs.{name} must be true or false, got {getattr(self, name)!r}.")
        if self.structural_tag is not None:
            self.structural_tag = _structural_tag(self.structural_tag)
        self._check_json_options()

    def _check_json_options(self) -> None:
        asked = [name for name in ("disable_any_whitespace", "whitespace_pattern", "disable_additional_properties")
                 if getattr(self, name)]
        if asked and self.kind not in ("json", "json_object", "structural_tag"):
            raise ValueError(f"structured_outputs.{asked[0]} applies to JSON output (json, json_object or "
                             f"structural_tag), not to {self.kind}.")
        if self.whitespace_pattern is not None:
            if not isinstance(self.whitespace_pattern, str) or not self.whitespace_pattern:
                raise ValueError(f"structured_outputs.whitespace_pattern must be a non-empty string (a regex), "
                                 f"got {self.whitespace_pattern!r}.")
            if self.disable_any_whitespace:
                raise ValueError("structured_outputs: give disable_any_whitespace or whitespace_pattern, not both.")

    @property
    def kind(self) -> str:
        """The one field given: "json", "json_object", "regex", "choice", "grammar" or "structural_tag"."""
        return "json_object" if self.json_object else next(name for name in _KINDS if getattr(self, name) is not None)

    def key(self) -> str:
        """A canonical text of the spec: equal specs, equal keys (the compiled-grammar cache's key)."""
        value = {"json": self.json, "regex": self.regex, "choice": self.choice, "grammar": self.grammar,
                 "json_object": True, "structural_tag": self.structural_tag}[self.kind]
        options = [self.disable_any_whitespace, self.whitespace_pattern, self.disable_additional_properties]
        return f"{self.kind}:{json.dumps([value, options], sort_keys=True, separators=(',', ':'))}"


def _json_object(field: str, value: Any, what: str) -> dict[str, Any]:
    """value, a dict or its JSON text, as a dict; else a ValueError naming the field."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise ValueError(f"{field} is not valid JSON: {e}.") from None
    if not isinstance(value, dict):
        raise ValueError(f"{field} must be {what}, got {type(value).__name__}.")
    return value


def _structural_tag(value: Any) -> dict[str, Any]:
    """vLLM's structural tag (a dict or its JSON text) checked: a ValueError naming what is wrong."""
    field = "structured_outputs.structural_tag"
    tag = _json_object(field, value, 'an object {"type": "structural_tag", "structures": [...], "triggers": [...]}')
    unknown = sorted(set(tag) - {"type", "structures", "triggers"})
    if unknown:
        raise ValueError(f"{field}.{unknown[0]} is not supported (a structural tag has type, structures and triggers).")
    if tag.get("type", "structural_tag") != "structural_tag":
        raise ValueError(f"{field}.type must be \"structural_tag\", got {tag['type']!r}.")
    triggers, structures = tag.get("triggers"), tag.get("structures")
    if not isinstance(triggers, list) or not triggers or any(not isinstance(t, str) or not t for t in triggers):
        raise ValueError(f"{field}.triggers must be a non-empty list of non-empty strings, got {triggers!r}.")
    if not isinstance(structures, list) or not structures:
        raise ValueError(f"{field}.structures must be a non-empty list, got {structures!r}.")
    for i, s in enumerate(structures):
        where = f"{field}.structures[{i}]"
        if not isinstance(s, dict):
            raise ValueError(f"{where} must be an object with begin, schema and end, got {s!r}.")
        unknown = sorted(set(s) - {"begin", "schema", "end"})
        if unknown:
            raise ValueError(f"{where}.{unknown[0]} is not supported (a structure has begin, schema and end).")
        for name in ("begin", "end"):
            if not isinstance(s.get(name), str):
                raise ValueError(f"{where}.{name} must be a string, got {s.get(name)!r}.")
        if not any(s["begin"].startswith(t) for t in triggers):
            raise ValueError(f"{where}.begin {s['begin']!r} starts with none of the triggers {triggers}.")
        if not isinstance(s.get("schema"), dict):
            raise ValueError(f"{where}.schema must be a JSON schema object, got {s.get('schema')!r}.")
    return {"type": "structural_tag", "structures": structures, "triggers": triggers}


@dataclass
class RepetitionDetectionParams:
    """(vLLM) End an output that loops: once the output (not the prompt) ends with one pattern of
    min_pattern_size..max_pattern_size tokens written min_count times in a row, the request
    finishes with finish_reason "repetition" (stop_reason "repetition_detected"). Checked after
    each token, once min_tokens outputs exist (cpp/include/corellm/repetition_detection.h).
    max_pattern_size 0 turns it off; min_pattern_size 0 means 1."""

    max_pattern_size: int = 0
    min_pattern_size: int = 0
    min_count: int = 0

    def __post_init__(self) -> None:
        for name in ("max_pattern_size", "min_pattern_size", "min_count"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**31:
                raise ValueError(f"repetition_detection.{name} must be an integer in [0, 2**31), got {value!r}.")
        if self.min_pattern_size > self.max_pattern_size:
            raise ValueError(f"repetition_detection.min_pattern_size ({self.min_pattern_size}) must not exceed "
                             f"max_pattern_size ({self.max_pattern_size}); max_pattern_size 0 turns detection off.")
        if self.max_pattern_size > 0 and self.min_count < 2:
            raise ValueError(f"repetition_detection.min_count must be at least 2 (a pattern and one repeat of it), "
                             f"got {self.min_count}; max_pattern_size 0 turns detection off.")

    @property
    def enabled(self) -> bool:
        return self.max_pattern_size > 0


def _as_float32(value: float) -> float:
    """`value` rounded to float32, as the sampling kernels will see it (inf when too large)."""
    try:
        return struct.unpack("f", struct.pack("f", value))[0]
    except OverflowError:
        return float("inf")


@dataclass
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: off
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    max_tokens: int | None = 16  # None: up to the context length
    min_tokens: int = 0
    logprobs: int | None = None  # top-n logprobs per generated token (0: the chosen token's only)
    # (vLLM) instead of the top n: the logprobs (and ranks) of these tokens at each generated
    # position, beside the chosen token's — a label set scored at every step
    logprob_token_ids: list[int] | None = None
    prompt_logprobs: int | None = None
    skip_special_tokens: bool = True
    # (vLLM) Whether special tokens kept in the text are joined with spaces. corellm's detokenizer
    # is the tokenizers library's, as vLLM's for a fast tokenizer: it joins them without spaces,
    # which False asks for and True leaves as it is (as in vLLM with a fast tokenizer).
    spaces_between_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    logit_bias: dict[int, float] | None = None
    allowed_token_ids: list[int] | None = None  # (vLLM) only these tokens may be sampled
    # (vLLM) words the output must not contain: a word's last token is banned wherever the output
    # ends with the tokens before it (each word tokenized alone and after a space).
    bad_words: list[str] | None = None
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE
    # Constrain the output to a JSON schema, a regex, a choice or a grammar (structured output).
    structured_outputs: StructuredOutputsParams | None = None
    # (vLLM) A reasoning model's reasoning block may take at most this many tokens: then the
    # engine ends it ("</think>") and the answer follows. None or -1: no limit. Needs the
    # engine's reasoning_parser (structured_output/reasoning_wait.py states the rule).
    thinking_token_budget: int | None = None
    # (OpenAI's Predicted Outputs) Text the output is expected to largely repeat (a file being
    # edited): with n-gram speculative decoding its tokens are the drafts, where the output has
    # reached in it. The output is the same as without; only faster where it follows the text.
    prediction: str | None = None
    # (vLLM) End the output early where it loops (RepetitionDetectionParams, or a dict of its fields).
    repetition_detection: RepetitionDetectionParams | None = None

    def __post_init__(self) -> None:
        if isinstance(self.repetition_detection, dict):
            unknown = set(self.repetition_detection) - {"max_pattern_size", "min_pattern_size", "min_count"}
            if unknown:
                raise ValueError(f"repetition_detection has no field {sorted(unknown)[0]!r} (its fields: "
                                 f"max_pattern_size, min_pattern_size, min_count).")
            self.repetition_detection = RepetitionDetectionParams(**self.repetition_detection)
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        if self.top_k == -1:
            self.top_k = 0
        self._validate()

    def _validate(self) -> None:
        def is_int(v: object) -> bool:
            return isinstance(v, int) and not isinstance(v, bool)

        def is_num(v: object) -> bool:
            return isinstance(v, (int, float)) and not isinstance(v, bool)

        if not is_int(self.n) or self.n < 1:
            raise ValueError(f"n must be at least 1, got {self.n!r}.")
        for name in ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty"):
            value = getattr(self, name)
            if not is_num(value) or value != value or value in (float("inf"), float("-inf")):
                raise ValueError(f"{name} must be a finite number, got {value!r}.")
        if self.temperature < 0:
            raise ValueError(f"temperature must be non-negative, got {self.temperature}.")
        if not 0 < _as_float32(self.top_p) <= 1:  # the kernels see float32: 1e-300 would be 0
            raise ValueError(f"top_p must be in (0, 1] (and representable as a float32), got {self.top_p}.")
        if not is_int(self.top_k) or not 0 <= self.top_k < 2**31:
            raise ValueError(f"top_k must be 0 or -1 (disable), or in [1, 2**31), got {self.top_k!r}.")
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}.")
        if not -2 <= self.presence_penalty <= 2:
            raise ValueError(f"presence_penalty must be in [-2, 2], got {self.presence_penalty}.")
        if not -2 <= self.frequency_penalty <= 2:
            raise ValueError(f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty}.")
        if not 0 < _as_float32(self.repetition_penalty) <= 2:
            raise ValueError(f"repetition_penalty must be in (0, 2] (and representable as a float32), "
                             f"got {self.repetition_penalty}.")
        if self.max_tokens is not None and (not is_int(self.max_tokens) or not 1 <= self.max_tokens < 2**31):
            raise ValueError(f"max_tokens must be in [1, 2**31), got {self.max_tokens!r}.")
        if not is_int(self.min_tokens) or self.min_tokens < 0:
            raise ValueError(f"min_tokens must be greater than or equal to 0, got {self.min_tokens!r}.")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens must be less than or equal to max_tokens={self.max_tokens}, "
                             f"got {self.min_tokens}.")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and (not is_int(value) or value < 0):
                raise ValueError(f"{name} must be non-negative, got {value!r}.")
        if self.logprob_token_ids is not None:
            ids = self.logprob_token_ids
            if not isinstance(ids, (list, tuple)) or not ids or any(not is_int(t) or t < 0 for t in ids):
                raise ValueError(f"logprob_token_ids must be a non-empty list of token ids, got {ids!r}.")
            if self.logprobs is not None:
                raise ValueError(f"give logprobs (the top n at each position) or logprob_token_ids (these tokens), "
                                 f"not both: got logprobs={self.logprobs}.")
            self.logprob_token_ids = list(dict.fromkeys(ids))
        if self.seed is not None and (not is_int(self.seed) or not 0 <= self.seed < 2**64):
            raise ValueError(f"seed must be an integer in [0, 2**64), got {self.seed!r}.")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ValueError(f"stop must be a list of non-empty strings, got {self.stop!r}.")
        if any(not is_int(t) or t < 0 for t in self.stop_token_ids):
            raise ValueError(f"stop_token_ids must be non-negative integers, got {self.stop_token_ids!r}.")
        if self.logit_bias is not None:
            if not isinstance(self.logit_bias, dict):
                raise ValueError(f"logit_bias must be a dict of token id to bias, got {type(self.logit_bias).__name__}.")
            for k, v in self.logit_bias.items():
                if not is_int(k) or k < 0 or not is_num(v) or not -100 <= v <= 100:
                    raise ValueError(f"logit_bias entries must map token ids to biases in [-100, 100], got {k!r}: {v!r}.")
        if self.allowed_token_ids is not None:
            ids = self.allowed_token_ids
            if not isinstance(ids, (list, tuple)) or not ids or any(not is_int(t) or t < 0 for t in ids):
                raise ValueError(f"allowed_token_ids must be a non-empty list of token ids, got {ids!r}.")
        if self.bad_words is not None and (not isinstance(self.bad_words, (list, tuple))
                                           or any(not isinstance(w, str) or not w.strip() for w in self.bad_words)):
            raise ValueError(f"bad_words must be a list of words (non-blank strings), got {self.bad_words!r}.")
        for name in ("skip_special_tokens", "spaces_between_special_tokens"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a bool, got {getattr(self, name)!r}.")
        if not isinstance(self.output_kind, RequestOutputKind):
            raise ValueError(f"output_kind must be a RequestOutputKind, got {self.output_kind!r}.")
        if self.thinking_token_budget is not None and (not is_int(self.thinking_token_budget)
                                                       or not -1 <= self.thinking_token_budget < 2**31):
            raise ValueError(f"thinking_token_budget must be a number of tokens (or -1: no limit), "
                             f"got {self.thinking_token_budget!r}.")
        if self.thinking_token_budget == -1:
            self.thinking_token_budget = None
        if self.prediction is not None and (not isinstance(self.prediction, str) or not self.prediction):
            raise ValueError(f"prediction must be a non-empty string, got {self.prediction!r}.")
        if self.repetition_detection is not None and not isinstance(self.repetition_detection,
                                                                    RepetitionDetectionParams):
            raise ValueError(f"repetition_detection must be a RepetitionDetectionParams (or a dict of its fields), "
                             f"got {type(self.repetition_detection).__name__}.")
        if self.structured_outputs is not None and not isinstance(self.structured_outputs, StructuredOutputsParams):
            raise ValueError(f"structured_outputs must be a StructuredOutputsParams, got "
                             f"{type(self.structured_outputs).__name__}.")

    @property
    def wants_logprobs(self) -> bool:
        """Whether each generated token comes with its logprob (and the top n, or the given tokens')."""
        return self.logprobs is not None or self.logprob_token_ids is not None

    @property
    def greedy(self) -> bool:
        return self.temperature < _GREEDY_EPS

    def clone(self) -> "SamplingParams":
        import copy

        return copy.deepcopy(self)
