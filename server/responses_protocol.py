"""The body of POST /v1/responses (OpenAI's Responses API, as vLLM serves it) and the chat request
it amounts to: `instructions` become the system message, `input` the conversation (messages,
function calls and their outputs, reasoning items given back), `text.format` the response_format,
`reasoning.effort` the template's reasoning_effort, flat function `tools` chat tools. A request
that continues a stored response (`previous_response_id`) is that response's conversation (its
input and output items, response_store.py) followed by its own input."""

from __future__ import annotations

import base64
import binascii
import uuid
from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, PrivateAttr, Tag, TypeAdapter

from corellm.server.errors import bad_request
from corellm.server.request_part import RequestPart

ENCRYPTED_REASONING = "reasoning.encrypted_content"  # the values of `include` honoured
OUTPUT_LOGPROBS = "message.output_text.logprobs"

# The chat fields whose errors a Responses client knows by another name.
FIELD_NAMES = {"messages": "input", "max_tokens": "max_output_tokens", "response_format": "text.format",
               "reasoning_effort": "reasoning.effort"}


class TextPart(RequestPart):
    """A message's text: input_text, or an output_text given back (read as its text alone)."""

    text: str
    annotations: list[Any] | None = None  # an output_text given back: its annotations (none are made)
    logprobs: list[Any] | None = None  # and its logprobs


# One class per type, so that the discriminator maps each type to its own schema in /openapi.json
# (one schema under two types let a fuzzer's "wrong type" for one of them be valid for the other).
class InputText(TextPart):
    type: Literal["input_text"]


class OutputText(TextPart):
    type: Literal["output_text"]


class InputImage(RequestPart):
    type: Literal["input_image"]
    image_url: str  # a data URL, or http(s) where the server allows the host
    detail: str | None = None


InputPart = Annotated[InputText | OutputText | InputImage, Field(discriminator="type")]


class MessageItem(RequestPart):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[InputPart]
    id: str | None = None  # an output message given back
    status: str | None = None


class FunctionCallItem(RequestPart):
    type: Literal["function_call"]
    call_id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    arguments: str
    id: str | None = None
    status: str | None = None


class FunctionCallOutputItem(RequestPart):
    type: Literal["function_call_output"]
    call_id: str = Field(min_length=1)
    output: str
    id: str | None = None
    status: str | None = None


class ReasoningText(RequestPart):
    type: Literal["reasoning_text", "summary_text"]
    text: str


class ReasoningItem(RequestPart):
    type: Literal["reasoning"]
    content: list[ReasoningText] | None = None
    summary: list[ReasoningText] = Field(default_factory=list)
    id: str | None = None
    status: str | None = None
    # The reasoning as corellm gives it out with include ["reasoning.encrypted_content"]: its text
    # in base64 (not encrypted: the client holds the conversation anyway), read back as the text.
    encrypted_content: str | None = None


def _item_type(item: Any) -> str:
    """An input item's type: a message may leave it out (OpenAI's EasyInputMessage)."""
    return item.get("type", "message") if isinstance(item, dict) else getattr(item, "type", "message")


InputItem = Annotated[Annotated[MessageItem, Tag("message")] | Annotated[FunctionCallItem, Tag("function_call")]
                      | Annotated[FunctionCallOutputItem, Tag("function_call_output")]
                      | Annotated[ReasoningItem, Tag("reasoning")], Discriminator(_item_type)]
_INPUT_ITEMS = TypeAdapter(list[InputItem])
_ITEM_ID_PREFIXES = {"message": "msg_", "function_call": "fc_", "function_call_output": "fco_", "reasoning": "rs_"}


class TextFormat(RequestPart):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = Field(None, min_length=1, max_length=64)
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None
    description: str | None = None


class TextOptions(RequestPart):
    format: TextFormat | None = None
    verbosity: str | None = None  # only "medium", the default: corellm does not steer length


class ReasoningOptions(RequestPart):
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    summary: str | None = None  # no summaries are made: refused


class FunctionTool(RequestPart):
    type: Literal["function"]
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.:-]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class NamedFunctionChoice(RequestPart):
    type: Literal["function"]
    name: str


class ResponsesRequest(RequestPart):
    model: str | None = None
    input: str | list[InputItem]
    instructions: str | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    stream: bool = False
    text: TextOptions | None = None
    reasoning: ReasoningOptions | None = None
    tools: list[FunctionTool] | None = Field(None, max_length=128)
    tool_choice: Literal["none", "auto", "required"] | NamedFunctionChoice | None = None
    parallel_tool_calls: bool | None = None
    store: bool | None = None  # None: true, as OpenAI (kept unless the server keeps none)
    previous_response_id: str | None = Field(None, min_length=1)
    background: bool | None = None
    truncation: str | None = None  # only "disabled": "auto" would drop input silently
    include: list[str] | None = None  # of the extra outputs, ENCRYPTED_REASONING and OUTPUT_LOGPROBS
    top_logprobs: int | None = Field(None, ge=0, le=20)  # with OUTPUT_LOGPROBS
    user: str | None = None
    metadata: dict[str, str] | None = None
    # vLLM's sampling extras that chat takes too
    top_k: int | None = Field(None, ge=-1, lt=2**31)
    min_p: float | None = Field(None, ge=0, le=1)
    repetition_penalty: float | None = Field(None, gt=0, le=2)
    seed: int | None = Field(None, ge=0, lt=2**63)
    thinking_token_budget: int | None = Field(None, ge=-1, lt=2**31)
    request_id: str | None = None
    # vLLM's extras of its Responses API, passed on to the chat completion the response is made from,
    # which checks them as its own fields of the same names
    stop: str | list[str] | None = None
    ignore_eos: bool | None = None
    skip_special_tokens: bool | None = None
    include_stop_str_in_output: bool | None = None
    logit_bias: dict[str, float] | None = None
    structured_outputs: dict[str, Any] | None = None
    cache_salt: str | None = None
    priority: int | None = None
    # Of `input`, the items a continued response's conversation put first (continuing()).
    _history: int = PrivateAttr(default=0)

    @property
    def encrypted_reasoning(self) -> bool:
        """Whether the reasoning items carry encrypted_content (include asks for it)."""
        return ENCRYPTED_REASONING in (self.include or ())

    @property
    def output_logprobs(self) -> bool:
        """Whether the message's output_text carries its tokens' logprobs (include asks for them)."""
        return OUTPUT_LOGPROBS in (self.include or ())

    def chat_body(self) -> dict[str, Any]:
        """The chat completion request this response is made from (validated by its model)."""
        self._refuse_what_is_not_made()
        body: dict[str, Any] = {"model": self.model, "messages": self.messages(), "stream": self.stream}
        for name, value in (("max_tokens", self.max_output_tokens), ("temperature", self.temperature),
                            ("top_p", self.top_p), ("parallel_tool_calls", self.parallel_tool_calls),
                            ("top_k", self.top_k), ("min_p", self.min_p), ("repetition_penalty", self.repetition_penalty),
                            ("seed", self.seed), ("thinking_token_budget", self.thinking_token_budget),
                            ("request_id", self.request_id), ("stop", self.stop), ("ignore_eos", self.ignore_eos),
                            ("skip_special_tokens", self.skip_special_tokens),
                            ("include_stop_str_in_output", self.include_stop_str_in_output),
                            ("logit_bias", self.logit_bias), ("structured_outputs", self.structured_outputs),
                            ("cache_salt", self.cache_salt), ("priority", self.priority)):
            if value is not None:
                body[name] = value
        fmt = self.text.format if self.text is not None else None
        if fmt is not None and fmt.type == "json_schema":
            body["response_format"] = {"type": "json_schema", "json_schema": {
                "name": fmt.name or "response", "schema": fmt.schema_, "strict": fmt.strict}}
        elif fmt is not None and fmt.type == "json_object":
            body["response_format"] = {"type": "json_object"}
        if self.reasoning is not None and self.reasoning.effort is not None:
            body["reasoning_effort"] = self.reasoning.effort
        if self.output_logprobs:
            body.update(logprobs=True, top_logprobs=self.top_logprobs or 0)
        if self.tools:
            body["tools"] = [{"type": "function", "function": t.model_dump(exclude={"type"}, exclude_none=True)}
                             for t in self.tools]
        if self.tool_choice is not None:
            choice = self.tool_choice
            body["tool_choice"] = choice if isinstance(choice, str) else {"type": "function",
                                                                          "function": {"name": choice.name}}
        return body

    def own_input_items(self) -> list[dict[str, Any]]:
        """This request's input as the items a stored response keeps (each with an id, as GET
        .../input_items lists them): a string input is the user's message."""
        if isinstance(self.input, str):
            return [{"type": "message", "id": f"msg_{uuid.uuid4().hex}", "role": "user", "status": "completed",
                     "content": [{"type": "input_text", "text": self.input}]}]
        items = []
        for item in self.input[self._history:]:
            kept = item.model_dump(by_alias=True, exclude_none=True)
            kept.setdefault("id", f"{_ITEM_ID_PREFIXES[kept['type']]}{uuid.uuid4().hex}")
            items.append(kept)
        return items

    def continuing(self, conversation: list[dict[str, Any]]) -> ResponsesRequest:
        """This request after a stored response's conversation (its input and output items): the
        same fields, its input those items then its own. Its instructions are its own (a previous
        response's are not carried over, as OpenAI)."""
        own = [MessageItem(role="user", content=self.input)] if isinstance(self.input, str) else list(self.input)
        merged = self.model_copy(update={"input": _INPUT_ITEMS.validate_python(conversation) + own})
        merged._history = len(conversation)
        return merged

    def _where(self, i: int) -> str:
        """How an error names input item i (its own index, past a continued conversation)."""
        return f"input[{i - self._history}]" if i >= self._history else f"the previous response's item {i}"

    def _refuse_what_is_not_made(self) -> None:
        refused = [
            ("background", bool(self.background) and self.stream,
             "a background response is not streamed (poll GET /v1/responses/{id})"),
            ("background", bool(self.background) and self.store is False, "a background response needs store"),
            ("truncation", self.truncation not in (None, "disabled"), "only \"disabled\": an input too long is a 400"),
            ("include", bool(set(self.include or ()) - {ENCRYPTED_REASONING, OUTPUT_LOGPROBS}),
             f"of the extra outputs only {ENCRYPTED_REASONING!r} and {OUTPUT_LOGPROBS!r} are made"),
            ("include", self.output_logprobs and bool(self.tools),
             "logprobs are not made with tools (the answer's tokens are not told from the calls')"),
            ("top_logprobs", self.top_logprobs is not None and not self.output_logprobs,
             f"top_logprobs goes with include [{OUTPUT_LOGPROBS!r}]"),
            ("reasoning.summary", self.reasoning is not None and self.reasoning.summary is not None,
             "no reasoning summaries are made (the reasoning comes whole)"),
            ("text.verbosity", self.text is not None and self.text.verbosity not in (None, "medium"),
             "corellm does not steer the answer's length"),
        ]
        for field, given, why in refused:
            if given:
                raise bad_request(f"{field} is not supported: {why}", field, "unsupported_field")

    def messages(self) -> list[dict[str, Any]]:
        """The conversation as chat messages: instructions first; consecutive function calls are
        one assistant message's tool_calls; a reasoning item is the next assistant turn's
        reasoning_content."""
        messages: list[dict[str, Any]] = []
        if self.instructions:
            messages.append({"role": "system", "content": self.instructions})
        if isinstance(self.input, str):
            return messages + [{"role": "user", "content": self.input}]
        reasoning: list[str] = []
        for i, item in enumerate(self.input):
            if isinstance(item, ReasoningItem):
                reasoning += [part.text for part in item.content or item.summary]
                if item.encrypted_content is not None and not item.content:
                    where = f"{self._where(i)}.encrypted_content"
                    reasoning.append(reasoning_from_content(item.encrypted_content, where))
                continue
            if isinstance(item, FunctionCallItem):
                call = {"id": item.call_id, "type": "function",
                        "function": {"name": item.name, "arguments": item.arguments}}
                last = messages[-1] if messages else None
                if last is not None and last["role"] == "assistant" and last.get("tool_calls") is not None \
                        and not reasoning:
                    last["tool_calls"].append(call)
                    continue
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
            elif isinstance(item, FunctionCallOutputItem):
                messages.append({"role": "tool", "tool_call_id": item.call_id, "content": item.output})
            else:
                messages.append({"role": "system" if item.role == "developer" else item.role,
                                 "content": _content(item.content)})
            if reasoning:
                if messages[-1]["role"] != "assistant":
                    raise bad_request(f"{self._where(i)}: a reasoning item must be followed by the assistant's "
                                      "message or function call it led to", "input")
                messages[-1]["reasoning_content"] = "".join(reasoning)
                reasoning = []
        if reasoning:
            raise bad_request("input: a reasoning item must be followed by the assistant's message or function call "
                              "it led to", "input")
        return messages


def _content(content: str | list[TextPart | InputImage]) -> str | list[dict[str, Any]]:
    if isinstance(content, str):
        return content
    return [{"type": "text", "text": p.text} if isinstance(p, TextPart) else
            {"type": "image_url", "image_url": {"url": p.image_url, "detail": p.detail}} for p in content]


def reasoning_content(text: str) -> str:
    """A reasoning item's encrypted_content as corellm gives it out: the text in base64."""
    return base64.b64encode(text.encode()).decode()


def reasoning_from_content(content: str, field: str) -> str:
    """The reasoning text of an encrypted_content corellm gave out; a 400 naming the field for
    any other."""
    try:
        return base64.b64decode(content, validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        raise bad_request(f"{field}: not an encrypted_content corellm made (the reasoning's text in base64)",
                          field) from None
