"""The parts a chat request is made of (pydantic): its messages (text and image content parts,
tool calls of the history, a reply's reasoning sent back) as chat templates read them, its tools
and tool choice, and OpenAI's Predicted Outputs."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from corellm.server.request_part import RequestPart


class TextPart(RequestPart):
    type: Literal["text"]
    text: str


class ImageURL(RequestPart):
    url: str  # a data URL (data:image/png;base64,...), or http(s) where the server allows the host
    detail: str | None = None  # only "auto": "low" / "high" are not honoured (the handler's 400)


class ImagePart(RequestPart):
    type: Literal["image_url"]
    image_url: ImageURL


ContentPart = Annotated[TextPart | ImagePart, Field(discriminator="type")]


class FunctionCall(RequestPart):
    name: str
    arguments: str  # a JSON object's text, as OpenAI sends it


class MessageToolCall(RequestPart):
    """A call in an assistant message of the history."""

    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(RequestPart):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[MessageToolCall] | None = None  # assistant: the calls it made
    tool_call_id: str | None = None  # tool: the call this is the result of
    # assistant: its reasoning (templates may show or drop it; they read it as reasoning_content, or as
    # thinking, gpt-oss's template's name)
    reasoning_content: str | None = None
    reasoning: str | None = None  # (vLLM's name for it) the same, as a vLLM client sends its replies back

    @model_validator(mode="after")
    def _one_reasoning(self):
        if self.reasoning is not None:
            if self.reasoning_content is not None and self.reasoning_content != self.reasoning:
                raise ValueError("reasoning and reasoning_content name the same text (vLLM's and DeepSeek's names); "
                                 "they differ here: give one")
            self.reasoning_content = self.reasoning
        return self

    def as_template_message(self, content_parts: bool = False) -> dict[str, Any]:
        """The message as chat templates read it (HF's convention: a call's arguments as a dict).
        content_parts (a model that takes images): the content as a list of parts, {"type": "text",
        "text": ...} and {"type": "image"} (HF's multimodal templates); else one string."""
        content: Any = self.content
        if content_parts:
            if not isinstance(content, list):
                content = [{"type": "text", "text": content}] if content else []
            else:
                content = [{"type": "text", "text": p.text} if isinstance(p, TextPart) else {"type": "image"}
                           for p in content]
        elif isinstance(content, list):
            if any(isinstance(p, ImagePart) for p in content):
                from corellm.server.errors import bad_request

                raise bad_request("this model takes no images: image_url content parts need a LLaVA-style model",
                                  "messages")
            content = "".join(part.text for part in content)
        message: dict[str, Any] = {"role": self.role, "content": content or ""}
        for key in ("name", "tool_call_id", "reasoning_content"):
            if getattr(self, key) is not None:
                message[key] = getattr(self, key)
        if self.reasoning_content is not None:
            message["thinking"] = self.reasoning_content  # (the name gpt-oss's template reads it under)
        if self.tool_calls:
            message["tool_calls"] = [{"id": c.id, "type": "function", "function": {
                "name": c.function.name, "arguments": _arguments_object(c.function.arguments)}}
                for c in self.tool_calls]
        return message


def _arguments_object(arguments: str) -> Any:
    try:
        return json.loads(arguments)
    except json.JSONDecodeError:
        return arguments  # as given: the template shows it as text


class ToolFunction(RequestPart):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.:-]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema of the arguments object
    strict: bool | None = None  # the arguments are always held to the schema when constrained


class ChatTool(RequestPart):
    type: Literal["function"]
    function: ToolFunction


class NamedFunction(RequestPart):
    name: str


class NamedToolChoice(RequestPart):
    type: Literal["function"]
    function: NamedFunction


class Prediction(RequestPart):
    """(OpenAI's Predicted Outputs) text the reply is expected to largely repeat."""

    type: Literal["content"]
    content: Annotated[str, Field(min_length=1)] | Annotated[list[TextPart], Field(min_length=1)]

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)
