"""Request bodies of the OpenAI-compatible API (pydantic), with vLLM's sampling extras, and how
they become SamplingParams. Extra fields are kept (model_extra) for request_fields.py to refuse
or log: none is dropped unseen. A chat request's messages, tools and prediction are
chat_messages.py's parts."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, ValidationInfo, field_validator, model_validator

from corellm.beam_search import BeamSearchParams
from corellm.sampling_params import (RepetitionDetectionParams, RequestOutputKind, SamplingParams,
                                     StructuredOutputsParams)
from corellm.server.chat_messages import ChatMessage, ChatTool, NamedToolChoice, Prediction, TextPart
from corellm.server.request_part import RequestPart

# Caps on the expensive asks; each refusal is a 400 naming the field.
MAX_LOGPROBS = 20  # logprobs, top_logprobs, prompt_logprobs: --max-logprobs' default (vLLM's)
MAX_N = 16
MAX_STOP_STRINGS = 16
MAX_STOP_STRING_CHARS = 512
MAX_STOP_TOKEN_IDS = 64
MAX_LOGIT_BIAS = 1024  # entries; each bias in [-100, 100]
MAX_ALLOWED_TOKEN_IDS = 262144  # the largest vocabularies' size
MAX_BAD_WORDS = 256
MAX_LOGPROB_TOKEN_IDS = 128  # each costs a pass over the vocabulary per generated token
MAX_CACHE_SALT_CHARS = 256
MAX_REQUEST_ID_CHARS = 256


TokenId = Annotated[int, Field(ge=0)]


def within_max_logprobs(value: Any, info: ValidationInfo) -> Any:
    """A logprobs count (logprobs, top_logprobs, prompt_logprobs) at most the server's
    --max-logprobs, which request validation passes as the context's "max_logprobs" (-1: no cap
    here; the engine refuses more than the vocabulary). Without a context: MAX_LOGPROBS."""
    limit = (info.context or {}).get("max_logprobs", MAX_LOGPROBS)
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= limit < value:
        raise ValueError(f"must be at most {limit} (the server's --max-logprobs)")
    return value


class StreamOptions(RequestPart):
    include_usage: bool = False
    continuous_usage_stats: bool = False  # (vLLM) with include_usage, the usage so far in every chunk


class JsonSchemaFormat(RequestPart):
    model_config = ConfigDict(populate_by_name=True)

    name: str = Field(min_length=1, max_length=64)
    schema_: dict[str, Any] | None = Field(None, alias="schema")  # absent: any JSON (OpenAI's rule)
    strict: bool | None = None  # the schema is always enforced, strict or not
    description: str | None = None


class Structure(RequestPart):
    """One structure of a structural tag: after its begin, JSON of its schema, then its end."""

    begin: str
    schema_: dict[str, Any] = Field(alias="schema")
    end: str


class ResponseFormat(RequestPart):
    """OpenAI's response_format, and vLLM's structural_tag type (structures and triggers)."""

    type: Literal["text", "json_object", "json_schema", "structural_tag"]
    json_schema: JsonSchemaFormat | None = None
    structures: list[Structure] | None = None
    triggers: list[str] | None = None

    @model_validator(mode="after")
    def _fields_of_its_type(self):
        for name, of_type in (("json_schema", "json_schema"), ("structures", "structural_tag"),
                              ("triggers", "structural_tag")):
            if getattr(self, name) is not None and self.type != of_type:
                raise ValueError(f"response_format.{name} belongs to the type {of_type!r}, not {self.type!r}")
        return self

    def structural_tag(self) -> dict[str, Any]:
        from corellm.server.errors import bad_request

        if self.structures is None or self.triggers is None:
            raise bad_request("response_format of type structural_tag needs structures and triggers", "response_format")
        return {"type": "structural_tag", "triggers": self.triggers,
                "structures": [s.model_dump(by_alias=True, exclude_unset=True) for s in self.structures]}


class StructuredOutputsField(RequestPart):
    """vLLM's structured_outputs: one of its kinds and how its JSON is written
    (StructuredOutputsParams checks them)."""

    json_: dict[str, Any] | str | None = Field(None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    structural_tag: dict[str, Any] | str | None = None
    disable_any_whitespace: bool = False
    whitespace_pattern: str | None = None
    disable_additional_properties: bool = False
    disable_fallback: bool = False


class RepetitionDetectionField(RequestPart):
    """(vLLM) repetition_detection: end the output where it loops (RepetitionDetectionParams states
    the rule and checks the sizes). A key it does not have is refused: a misspelt size would
    silently leave detection off."""

    model_config = ConfigDict(extra="forbid")

    max_pattern_size: int = 0
    min_pattern_size: int = 0
    min_count: int = 0


# Fields beam search has no use for: given with use_beam_search, a 400 naming them (vLLM drops
# them); each with the test that it was left as it is.
NOT_WITH_BEAM_SEARCH = {
    "stream": lambda v: not v, "logprobs": lambda v: v in (None, False), "top_logprobs": lambda v: v is None,
    "prompt_logprobs": lambda v: v is None, "echo": lambda v: not v, "stop": lambda v: not v,
    "stop_token_ids": lambda v: not v, "top_p": lambda v: v in (None, 1), "top_k": lambda v: v in (None, 0, -1),
    "min_p": lambda v: not v, "presence_penalty": lambda v: not v, "frequency_penalty": lambda v: not v,
    "repetition_penalty": lambda v: v in (None, 1), "seed": lambda v: v is None, "logit_bias": lambda v: not v,
    "allowed_token_ids": lambda v: v is None, "bad_words": lambda v: not v, "min_tokens": lambda v: not v,
    "response_format": lambda v: v is None or v.type == "text", "structured_outputs": lambda v: v is None,
    "guided_json": lambda v: v is None, "guided_regex": lambda v: v is None, "guided_choice": lambda v: v is None,
    "guided_grammar": lambda v: v is None, "structural_tag": lambda v: v is None,
    "guided_whitespace_pattern": lambda v: v is None, "thinking_token_budget": lambda v: v is None,
    "tools": lambda v: not v, "suffix": lambda v: not v, "prediction": lambda v: v is None,
    "repetition_detection": lambda v: v is None, "logprob_token_ids": lambda v: v is None}


class SamplingFields(RequestPart):
    """Fields shared by completions and chat completions."""

    model_config = ConfigDict(allow_inf_nan=False)

    model: str | None = None
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    n: int = Field(1, ge=1, le=MAX_N)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[Annotated[str, Field(min_length=1, max_length=MAX_STOP_STRING_CHARS)]] | None = Field(
        None, max_length=MAX_STOP_STRINGS)
    presence_penalty: float = Field(0.0, ge=-2, le=2)
    frequency_penalty: float = Field(0.0, ge=-2, le=2)
    logit_bias: dict[str, Annotated[float, Field(ge=-100, le=100)]] | None = Field(None, max_length=MAX_LOGIT_BIAS)
    allowed_token_ids: list[TokenId] | None = Field(None, min_length=1, max_length=MAX_ALLOWED_TOKEN_IDS)  # (vLLM)
    bad_words: list[Annotated[str, Field(min_length=1, max_length=MAX_STOP_STRING_CHARS)]] | None = Field(
        None, max_length=MAX_BAD_WORDS)  # (vLLM)
    seed: int | None = Field(None, ge=0, lt=2**63)
    user: str | None = None
    # vLLM's extras
    top_k: int | None = Field(None, ge=-1, lt=2**31)
    min_p: float | None = Field(None, ge=0, le=1)
    repetition_penalty: float | None = Field(None, gt=0, le=2)
    stop_token_ids: list[TokenId] | None = Field(None, max_length=MAX_STOP_TOKEN_IDS)
    ignore_eos: bool = False
    min_tokens: int = Field(0, ge=0, lt=2**31)
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True  # SamplingParams' comment: joined without spaces either way
    include_stop_str_in_output: bool = False
    prompt_logprobs: int | None = Field(None, ge=0)  # at most --max-logprobs (within_max_logprobs)
    # (vLLM) with logprobs: these tokens' logprobs at each position, in place of the top n
    logprob_token_ids: list[TokenId] | None = Field(None, min_length=1, max_length=MAX_LOGPROB_TOKEN_IDS)
    cache_salt: str | None = Field(None, min_length=1, max_length=MAX_CACHE_SALT_CHARS)
    priority: int = Field(0, ge=-2**31, lt=2**31)  # lower runs first (--scheduling-policy priority)
    # (vLLM) the response's id is "cmpl-" / "chatcmpl-" and this (an X-Request-Id header wins)
    request_id: str | None = Field(None, min_length=1, max_length=MAX_REQUEST_ID_CHARS, pattern=r"^[\x21-\x7e]+$")
    truncate_prompt_tokens: int | None = Field(None, ge=-1, lt=2**31)  # the prompt's last k tokens; -1: the context's
    # (vLLM) with truncate_prompt_tokens: "left" (the default) cuts the prompt's start, "right" its end
    truncation_side: Literal["left", "right"] | None = None
    return_token_ids: bool = False  # the prompt's and the choices' token ids in the response
    return_tokens_as_token_ids: bool = False  # logprobs name tokens "token_id:N"
    thinking_token_budget: int | None = Field(None, ge=-1, lt=2**31)  # (vLLM) the reasoning's tokens at most
    use_beam_search: bool = False  # (vLLM) n beams; corellm.beam_search states the algorithm
    length_penalty: float = 1.0  # (vLLM) beam search's: a sequence's score is its logprob / length ** this
    repetition_detection: RepetitionDetectionField | None = None  # (vLLM) end an output that loops
    # Structured output, in OpenAI's spelling, vLLM's, and vLLM's older one (at most one of them).
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputsField | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    structural_tag: dict[str, Any] | str | None = None  # (vLLM) as structured_outputs.structural_tag
    guided_whitespace_pattern: str | None = None  # (vLLM) with guided_json: the whitespace between JSON tokens

    @field_validator("stream_options")
    @classmethod
    def _stream_options_need_stream(cls, v, info: ValidationInfo):
        if v is not None and not info.data.get("stream", False):
            raise ValueError("stream_options is only allowed when stream is true")  # as OpenAI's API
        return v

    _logprobs_counts = field_validator("prompt_logprobs", "logprobs", "top_logprobs", check_fields=False)(
        within_max_logprobs)

    @field_validator("stop")
    @classmethod
    def _stop_string_length(cls, v):
        if isinstance(v, str) and len(v) > MAX_STOP_STRING_CHARS:
            raise ValueError(f"a stop string may hold at most {MAX_STOP_STRING_CHARS} characters")
        return v

    def beam_search_params(self, max_tokens: int | None) -> BeamSearchParams | None:
        """With use_beam_search, vLLM's BeamSearchParams (n beams; max_tokens None: up to the
        context's end); else None (length_penalty other than 1 is then a 400)."""
        from corellm.server.errors import bad_request

        if not self.use_beam_search:
            if self.length_penalty != 1:
                raise bad_request("length_penalty applies to beam search only (use_beam_search)", "length_penalty")
            return None
        for name, left_alone in NOT_WITH_BEAM_SEARCH.items():
            if name in type(self).model_fields and not left_alone(getattr(self, name)):
                raise bad_request(f"{name} is not available with use_beam_search", name)
        try:
            return BeamSearchParams(beam_width=self.n, max_tokens=max_tokens or 2**31 - 1, ignore_eos=self.ignore_eos,
                                    temperature=self.temperature or 0.0, length_penalty=self.length_penalty,
                                    include_stop_str_in_output=self.include_stop_str_in_output)
        except ValueError as e:
            raise bad_request(str(e), "use_beam_search") from None

    def structured_output(self) -> tuple[StructuredOutputsParams | None, str | None]:
        """The request's output constraint and the field it came from (for the 400s that name
        it), or (None, None). More than one way of asking is a 400."""
        from corellm.server.errors import bad_request

        asked: list[tuple[str, dict[str, Any]]] = []
        rf = self.response_format
        if rf is not None and rf.type == "json_object":
            asked.append(("response_format", {"json_object": True}))
        elif rf is not None and rf.type == "json_schema":
            if rf.json_schema is None:
                raise bad_request("response_format of type json_schema needs json_schema", "response_format")
            schema = rf.json_schema.schema_
            asked.append(("response_format.json_schema.schema", {"json": schema} if schema else {"json_object": True}))
        elif rf is not None and rf.type == "structural_tag":
            asked.append(("response_format", {"structural_tag": rf.structural_tag()}))
        if self.structured_outputs is not None:
            so = self.structured_outputs
            given = {"json": so.json_, "regex": so.regex, "choice": so.choice, "grammar": so.grammar,
                     "json_object": so.json_object, "structural_tag": so.structural_tag,
                     "whitespace_pattern": so.whitespace_pattern}
            asked.append(("structured_outputs", {k: v for k, v in given.items() if v is not None} | {
                name: getattr(so, name) for name in ("disable_any_whitespace", "disable_additional_properties",
                                                     "disable_fallback")}))
        for name, key in (("guided_json", "json"), ("guided_regex", "regex"), ("guided_choice", "choice"),
                          ("guided_grammar", "grammar"), ("structural_tag", "structural_tag")):
            if getattr(self, name) is not None:
                asked.append((name, {key: getattr(self, name)}))
        if self.guided_whitespace_pattern is not None:
            if len(asked) != 1 or asked[0][0] not in ("guided_json", "response_format",
                                                      "response_format.json_schema.schema"):
                raise bad_request("guided_whitespace_pattern applies to guided_json or a JSON response_format; "
                                  "with structured_outputs give structured_outputs.whitespace_pattern",
                                  "guided_whitespace_pattern")
            asked[0][1]["whitespace_pattern"] = self.guided_whitespace_pattern
        if not asked:
            return None, None
        if len(asked) > 1:
            raise bad_request(f"give one of response_format, structured_outputs, structural_tag and guided_*, got "
                              f"{', '.join(name for name, _ in asked)}", asked[1][0])
        field, spec = asked[0]
        try:
            return StructuredOutputsParams(**spec), field
        except ValueError as e:
            raise bad_request(str(e).replace("structured_outputs", field, 1) if field != "structured_outputs"
                              else str(e), field) from None

    def sampling_params(self, defaults: dict[str, Any], max_tokens: int | None, logprobs: int | None) -> SamplingParams:
        def pick(name: str, fallback: Any) -> Any:
            value = getattr(self, name)
            if value is not None:
                return value
            return defaults.get(name, fallback)

        from corellm.server.errors import bad_request

        if self.stream and self.prompt_logprobs is not None:
            raise bad_request("prompt_logprobs is not available when stream is true", "prompt_logprobs")
        if self.logprob_token_ids is not None:
            if logprobs is None:
                raise bad_request("logprob_token_ids needs logprobs (true on chat, a number on completions): it "
                                  "names the tokens whose logprobs each position returns", "logprob_token_ids")
            logprobs = None  # the named tokens take the top n's place
        logit_bias = None
        if self.logit_bias:
            logit_bias = {}
            for key, value in self.logit_bias.items():
                if not key.isdigit():
                    raise bad_request(f"logit_bias keys must be token ids (non-negative integers), got {key!r}",
                                      "logit_bias")
                logit_bias[int(key)] = value
        try:
            return SamplingParams(
                n=self.n, temperature=pick("temperature", 1.0), top_p=pick("top_p", 1.0), top_k=pick("top_k", 0),
                min_p=pick("min_p", 0.0), presence_penalty=self.presence_penalty,
                frequency_penalty=self.frequency_penalty,
                repetition_penalty=pick("repetition_penalty", 1.0), seed=self.seed, stop=self.stop,
                stop_token_ids=self.stop_token_ids, ignore_eos=self.ignore_eos, max_tokens=max_tokens,
                min_tokens=self.min_tokens, logprobs=logprobs, logprob_token_ids=self.logprob_token_ids,
                prompt_logprobs=self.prompt_logprobs,
                skip_special_tokens=self.skip_special_tokens,
                spaces_between_special_tokens=self.spaces_between_special_tokens,
                include_stop_str_in_output=self.include_stop_str_in_output, logit_bias=logit_bias,
                allowed_token_ids=self.allowed_token_ids, bad_words=self.bad_words,
                thinking_token_budget=self.thinking_token_budget,
                structured_outputs=self.structured_output()[0],
                repetition_detection=(None if self.repetition_detection is None else
                                      RepetitionDetectionParams(**self.repetition_detection.model_dump())),
                output_kind=RequestOutputKind.DELTA if self.stream else RequestOutputKind.FINAL_ONLY)
        except ValueError as e:  # SamplingParams' checks start with the field's name: the 400 names it too
            named = re.match(r"[a-z_]+", str(e))
            raise bad_request(str(e), named.group(0) if named and named.group(0) in type(self).model_fields
                              else None) from None


class CompletionRequest(SamplingFields):
    prompt: (Annotated[str, Field(min_length=1)] | Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1)]
             | Annotated[list[TokenId], Field(min_length=1)]
             | Annotated[list[Annotated[list[TokenId], Field(min_length=1)]], Field(min_length=1)])
    max_tokens: int | None = Field(16, ge=0)  # 0 only with echo: the prompt scored alone
    logprobs: int | None = Field(None, ge=0)  # at most --max-logprobs
    echo: bool = False
    suffix: str | None = None
    add_special_tokens: bool = True  # (vLLM) e.g. a BOS before each prompt, where the tokenizer adds one


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0)  # at most --max-logprobs
    add_generation_prompt: bool = True
    continue_final_message: bool = False  # (vLLM) the last (assistant) message is left open, to continue
    echo: bool = False  # (vLLM) the reply starts with the last message, where it is the replying role's
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None  # (vLLM) more template variables (enable_thinking, ...)
    # (vLLM) for a template that shows documents to the model (RAG: Granite's, Command R's), as
    # transformers passes them: e.g. {"title": ..., "text": ...} each
    documents: list[dict[str, str]] | None = Field(None, min_length=1)
    # (OpenAI) for a template that reads it (gpt-oss's: "Reasoning: high" in its system turn)
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    # (vLLM) false: a reasoning model's reasoning (--reasoning-parser) is parsed out of the reply
    # and not sent (reasoning_content and reasoning null, no reasoning deltas)
    include_reasoning: bool = True
    add_special_tokens: bool = False  # (vLLM) the template writes the special tokens itself
    tools: list[ChatTool] | None = Field(None, max_length=128)
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None  # default true
    prediction: Prediction | None = None

    def sampling_params(self, defaults: dict[str, Any], max_tokens: int | None, logprobs: int | None) -> SamplingParams:
        params = super().sampling_params(defaults, max_tokens, logprobs)
        if self.prediction is not None:
            text = self.prediction.text()
            if not text:
                from corellm.server.errors import bad_request

                raise bad_request("prediction: its content holds no text", "prediction")
            params.prediction = text
        return params

    def echoed_text(self) -> str:
        """What the reply starts with under echo (vLLM's rule): the last message's text where its
        role is the replying one — "assistant" after a generation prompt, without one the last
        message's own role — else nothing."""
        last = self.messages[-1]
        if not self.echo or last.content is None or (self.add_generation_prompt and last.role != "assistant"):
            return ""
        if isinstance(last.content, str):
            return last.content
        return "\n".join(p.text for p in last.content if isinstance(p, TextPart))


class TokenizeRequest(RequestPart):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True


class DetokenizeRequest(RequestPart):
    model: str | None = None
    tokens: list[TokenId]
