"""The request of Anthropic's Messages API (POST /v1/messages and /v1/messages/count_tokens, as
vLLM and llama.cpp's server take it, for Anthropic's SDKs and the tools built on them) and the chat
completion request it becomes.

    system                       the system message (a string, or text blocks joined)
    messages[i] user             its text and image blocks one user message; its tool_result blocks,
                                 first, one tool message each (their text content)
    messages[i] assistant        its text the content, its thinking blocks the reasoning_content, its
                                 tool_use blocks the tool calls (input as the arguments' JSON)
    max_tokens, stop_sequences,  max_tokens, stop, temperature, top_p, top_k
    temperature, top_p, top_k
    tools, tool_choice           function tools (input_schema the parameters); auto, any (required),
                                 tool (that function), none; disable_parallel_tool_use
    thinking                     enabled: thinking_token_budget = budget_tokens (a model read with a
                                 reasoning parser); adaptive: the model thinks as it will; disabled:
                                 the template's enable_thinking false on such a model, nothing to do
                                 on one without; display "omitted": include_reasoning false
    output_config                format (json_schema): response_format; effort: reasoning_effort
    cache_control (anywhere)     accepted: corellm's prefix cache reuses every prompt's blocks anyway

A chat field's error is named by the Messages API's field (FIELD_NAMES)."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import Field

from corellm.server.errors import bad_request
from corellm.server.request_part import RequestPart

# The chat request's fields under their Messages API names (for the errors).
FIELD_NAMES = {"stop": "stop_sequences", "thinking_token_budget": "thinking.budget_tokens",
               "chat_template_kwargs": "thinking", "parallel_tool_calls": "tool_choice.disable_parallel_tool_use",
               "response_format": "output_config.format", "reasoning_effort": "output_config.effort",
               "include_reasoning": "thinking.display"}


class TextBlock(RequestPart):
    type: Literal["text"]
    text: str
    cache_control: dict[str, Any] | None = None


class ImageSource(RequestPart):
    type: Literal["base64", "url"]
    media_type: str | None = None  # with base64: image/png, image/jpeg, image/gif, image/webp
    data: str | None = None
    url: str | None = None

    def as_url(self) -> str:
        if self.type == "url":
            if not self.url:
                raise bad_request("an image source of type url needs its url", "messages")
            return self.url
        if not self.data or not self.media_type:
            raise bad_request("an image source of type base64 needs its media_type and data", "messages")
        return f"data:{self.media_type};base64,{self.data}"


class ImageBlock(RequestPart):
    type: Literal["image"]
    source: ImageSource
    cache_control: dict[str, Any] | None = None


class ToolUseBlock(RequestPart):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]
    cache_control: dict[str, Any] | None = None


class ToolResultBlock(RequestPart):
    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[TextBlock | ImageBlock] | None = None
    is_error: bool | None = None
    cache_control: dict[str, Any] | None = None

    def text(self) -> str:
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        if any(isinstance(b, ImageBlock) for b in self.content):
            raise bad_request("images in a tool_result are not supported: give the result as text", "messages")
        return "".join(b.text for b in self.content)


class ThinkingBlock(RequestPart):
    type: Literal["thinking"]
    thinking: str
    signature: str | None = None  # corellm signs nothing: any value is taken as it is


class RedactedThinkingBlock(RequestPart):
    type: Literal["redacted_thinking"]
    data: str


Block = Annotated[TextBlock | ImageBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock | RedactedThinkingBlock,
                  Field(discriminator="type")]


class AnthropicMessage(RequestPart):
    role: Literal["user", "assistant"]
    content: str | list[Block]


class AnthropicTool(RequestPart):
    name: str
    description: str | None = None
    input_schema: dict[str, Any]
    type: Literal["custom"] | None = None  # Anthropic's server tools (web search, ...) have other types
    cache_control: dict[str, Any] | None = None


class AnthropicToolChoice(RequestPart):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None  # with "tool"
    disable_parallel_tool_use: bool | None = None


class ThinkingConfig(RequestPart):
    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = Field(None, ge=1)  # with "enabled"
    display: Literal["summarized", "omitted"] | None = None


class OutputFormat(RequestPart):
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(RequestPart):
    effort: str | None = None
    format: OutputFormat | None = None


class MessagesRequest(RequestPart):
    model: str | None = None
    max_tokens: int = Field(ge=1)
    messages: Annotated[list[AnthropicMessage], Field(min_length=1)]
    system: str | list[TextBlock] | None = None
    stop_sequences: list[str] | None = None
    stream: bool = False
    temperature: float | None = Field(None, ge=0, le=1)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=1)
    tools: list[AnthropicTool] | None = None
    tool_choice: AnthropicToolChoice | None = None
    thinking: ThinkingConfig | None = None
    output_config: OutputConfig | None = None
    cache_control: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None  # user_id: informational

    def chat_body(self, has_reasoning_parser: bool) -> dict[str, Any]:
        """The chat completion request this message is made from (validated by its model)."""
        body: dict[str, Any] = {"model": self.model, "messages": self.chat_messages(), "max_tokens": self.max_tokens,
                                "stream": self.stream}
        for name, value in (("temperature", self.temperature), ("top_p", self.top_p), ("top_k", self.top_k),
                            ("stop", self.stop_sequences)):
            if value is not None:
                body[name] = value
        if self.tools:
            if any(t.type not in (None, "custom") for t in self.tools):
                raise bad_request("tools: only custom tools (name, description, input_schema) are supported", "tools")
            body["tools"] = [{"type": "function", "function": {"name": t.name, "description": t.description,
                                                               "parameters": t.input_schema}} for t in self.tools]
        if self.tool_choice is not None:
            choice = self.tool_choice
            if choice.type == "tool" and not choice.name:
                raise bad_request('tool_choice of type "tool" needs the tool\'s name', "tool_choice.name")
            body["tool_choice"] = ({"type": "function", "function": {"name": choice.name}} if choice.type == "tool"
                                   else {"any": "required"}.get(choice.type, choice.type))
            if choice.disable_parallel_tool_use:
                body["parallel_tool_calls"] = False
        if self.thinking is not None and self.thinking.type == "enabled":
            if self.thinking.budget_tokens is None:
                raise bad_request("thinking of type \"enabled\" needs budget_tokens", "thinking.budget_tokens")
            body["thinking_token_budget"] = self.thinking.budget_tokens
        elif self.thinking is not None and self.thinking.type == "disabled" and has_reasoning_parser:
            body["chat_template_kwargs"] = {"enable_thinking": False}
        if self.thinking is not None and self.thinking.display == "omitted":
            body["include_reasoning"] = False
        if self.output_config is not None:
            fmt = self.output_config.format
            if fmt is not None:
                body["response_format"] = {"type": "json_schema",
                                           "json_schema": {"name": "output", "schema": fmt.schema_}}
            if self.output_config.effort is not None:
                body["reasoning_effort"] = self.output_config.effort
        return body

    def chat_messages(self) -> list[dict[str, Any]]:
        messages: list[dict[str, Any]] = []
        if self.system:
            system = self.system if isinstance(self.system, str) else "".join(b.text for b in self.system)
            messages.append({"role": "system", "content": system})
        for i, m in enumerate(self.messages):
            if isinstance(m.content, str):
                messages.append({"role": m.role, "content": m.content})
            elif m.role == "user":
                messages += _user_messages(m.content, i)
            else:
                messages.append(_assistant_message(m.content, i))
        return messages


def _user_messages(blocks: list[Any], index: int) -> list[dict[str, Any]]:
    """A user turn's tool results (one tool message each), then its text and images (one user message)."""
    results, parts = [], []
    for block in blocks:
        if isinstance(block, ToolResultBlock):
            text = block.text()
            results.append({"role": "tool", "tool_call_id": block.tool_use_id,
                            "content": f"Error: {text}" if block.is_error else text})
        elif isinstance(block, TextBlock):
            parts.append({"type": "text", "text": block.text})
        elif isinstance(block, ImageBlock):
            parts.append({"type": "image_url", "image_url": {"url": block.source.as_url()}})
        else:
            raise bad_request(f"messages[{index}]: a user turn holds text, image and tool_result blocks, "
                              f"not {block.type}", f"messages[{index}].content")
    return results + ([{"role": "user", "content": parts}] if parts else [])


def _assistant_message(blocks: list[Any], index: int) -> dict[str, Any]:
    text, reasoning, calls = [], [], []
    for block in blocks:
        if isinstance(block, TextBlock):
            text.append(block.text)
        elif isinstance(block, ThinkingBlock):
            reasoning.append(block.thinking)
        elif isinstance(block, ToolUseBlock):
            calls.append({"id": block.id, "type": "function",
                          "function": {"name": block.name, "arguments": json.dumps(block.input, ensure_ascii=False)}})
        elif isinstance(block, RedactedThinkingBlock):
            raise bad_request(f"messages[{index}]: redacted_thinking is Anthropic's encrypted reasoning, which "
                              f"corellm cannot read", f"messages[{index}].content")
        else:
            raise bad_request(f"messages[{index}]: an assistant turn holds text, thinking and tool_use blocks, "
                              f"not {block.type}", f"messages[{index}].content")
    message: dict[str, Any] = {"role": "assistant", "content": "".join(text) or None}
    if reasoning:
        message["reasoning_content"] = "".join(reasoning)
    if calls:
        message["tool_calls"] = calls
    return message


class CountTokensRequest(RequestPart):
    """POST /v1/messages/count_tokens: a message's input without max_tokens."""

    model: str | None = None
    messages: Annotated[list[AnthropicMessage], Field(min_length=1)]
    system: str | list[TextBlock] | None = None
    tools: list[AnthropicTool] | None = None
    tool_choice: AnthropicToolChoice | None = None
    thinking: ThinkingConfig | None = None

    def as_message(self) -> MessagesRequest:
        return MessagesRequest(model=self.model, max_tokens=1, messages=self.messages, system=self.system,
                               tools=self.tools, tool_choice=self.tool_choice, thinking=self.thinking)
