"""AssistantMessage: one chat choice's reply built from the model's text, as OpenAI returns it — the
reasoning apart (with --reasoning-parser; parsed out and left out when the request says
include_reasoning false) under both names clients read, `reasoning_content` (DeepSeek's, OpenAI
clients') and `reasoning` (vLLM's since it renamed the field), the content, and the tool calls parsed from the model's
format — as one message, or as stream deltas in order (a call's name first, then its arguments in
pieces)."""

from __future__ import annotations

from typing import Any

from corellm.harmony import HarmonyParser
from corellm.reasoning_parser import ReasoningParser
from corellm.tool_calls import ToolCallArguments, ToolCallParser, ToolCallStart


class AssistantMessage:
    def __init__(self, reasoning: ReasoningParser | HarmonyParser | None, tool_calls: ToolCallParser | None,
                 include_reasoning: bool = True):
        """reasoning: the reasoning parser; a HarmonyParser (gpt-oss) reads the calls too, and then
        tool_calls is None."""
        self.reasoning = reasoning
        self.tool_calls = tool_calls
        self.include_reasoning = include_reasoning
        self._reasoning_text: list[str] = []
        self._content: list[str] = []

    def feed(self, text: str) -> list[dict[str, Any]]:
        """The stream deltas the model's next text completes."""
        reasoning, answer = self.reasoning.feed(text) if self.reasoning else ("", text)
        return self._deltas(reasoning, answer, final=False)

    def finish(self) -> list[dict[str, Any]]:
        """The deltas held back until the end (a partial tag, a call's closing)."""
        reasoning, answer = self.reasoning.finish() if self.reasoning else ("", "")
        return self._deltas(reasoning, answer, final=True)

    @property
    def _calls(self) -> list:
        if isinstance(self.reasoning, HarmonyParser):
            return self.reasoning.calls
        return self.tool_calls.calls if self.tool_calls else []

    @property
    def has_tool_calls(self) -> bool:
        return bool(self._calls)

    def message(self) -> dict[str, Any]:
        """The whole reply (after finish): role, content, reasoning_content and reasoning, tool_calls."""
        content = "".join(self._content)
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if self.reasoning is not None:
            reasoning = "".join(self._reasoning_text) or None  # None when not included
            message["reasoning_content"] = message["reasoning"] = reasoning
        if self.has_tool_calls:
            message["content"] = content.strip() or None
            message["tool_calls"] = [{"id": c.id, "type": "function",
                                      "function": {"name": c.name, "arguments": c.arguments}}
                                     for c in self._calls]
        return message

    def _deltas(self, reasoning: str, answer: str | list, final: bool) -> list[dict[str, Any]]:
        """answer: the answer's text, or (a HarmonyParser's) its events: text and calls."""
        deltas: list[dict[str, Any]] = []
        if reasoning and self.include_reasoning:
            self._reasoning_text.append(reasoning)
            deltas.append({"reasoning_content": reasoning, "reasoning": reasoning})
        if isinstance(answer, list):
            events = answer
        elif self.tool_calls is None:
            events = [answer] if answer else []
        else:
            events = self.tool_calls.feed(answer) + (self.tool_calls.finish() if final else [])
        for event in events:
            if isinstance(event, str):
                if event:
                    self._content.append(event)
                    deltas.append({"content": event})
            elif isinstance(event, ToolCallStart):
                deltas.append({"tool_calls": [{"index": event.index, "id": event.id, "type": "function",
                                               "function": {"name": event.name, "arguments": ""}}]})
            elif isinstance(event, ToolCallArguments):
                deltas.append({"tool_calls": [{"index": event.index, "function": {"arguments": event.text}}]})
        return deltas
