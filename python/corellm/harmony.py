"""HarmonyParser: gpt-oss's output (OpenAI's harmony format) split into its reasoning, its answer and
its tool calls, as it streams — vLLM's `openai_gptoss` reasoning parser and `openai` tool parser.

The prompt ends with `<|start|>assistant`; the model then writes one message or several, each a
header, `<|message|>`, a body and an end marker:

    <|channel|>analysis<|message|>We need ...<|end|>
    <|start|>assistant<|channel|>final<|message|>The answer is ...<|return|>
    <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>

A header names its channel (`<|channel|>NAME`) and, for a tool call, its recipient (`to=functions.NAME`,
after the channel or before it). The bodies go by channel: `analysis` is reasoning; a message to
`functions.NAME` is a call of NAME (its body the arguments) where the request offers tools; every
other body (`final`, `commentary` preambles) is the answer. The end markers are `<|end|>`, and
`<|return|>` / `<|call|>`, which end the generation (as end tokens their text is not in the output;
the output's end ends the message). The engine keeps these special tokens in the text it hands a
harmony request (skip_special_tokens false); the headers and markers stay out of every part. An
output that does not open with a header (an unformatted model) is all answer.

feed(delta) -> (reasoning piece, answer pieces and tool-call events in order); a partial marker is
held back until it resolves. The events are tool_call_parser's: text (str), ToolCallStart,
ToolCallArguments."""

from __future__ import annotations

import re
import uuid

from corellm.text_holdback import partial_marker_suffix
from corellm.tool_calls.tool_call_parser import ToolCall, ToolCallArguments, ToolCallStart

START, CHANNEL, MESSAGE, END = "<|start|>", "<|channel|>", "<|message|>", "<|end|>"
CALL, RETURN = "<|call|>", "<|return|>"
_BODY_ENDS = (END, CALL, RETURN, START)  # (a new message's start without an <|end|> ends the body too)
_HEADER_MAX = 1024  # characters of a header without <|message|> before the output counts as unformatted
_CHANNEL_NAME = re.compile(r"<\|channel\|>\s*([^\s<]+)")
_RECIPIENT = re.compile(r"\bto=([^\s<]+)")
FUNCTIONS = "functions."


class HarmonyParser:
    def __init__(self, tool_calls: bool = False):
        """tool_calls: the request offers tools (a message to functions.NAME is then a call; without
        them its body is answer text)."""
        self.tool_calls = tool_calls
        self.calls: list[ToolCall] = []
        self._buffer = ""
        self._state = "header"  # "header", "body" or "plain" (an unformatted output: all answer)
        self._route = "answer"  # the current body's: "reasoning", "answer" or "call"
        self._part = "start"
        self._opened = False  # some analysis message was seen

    # ------------------------------------------------------------------ API
    def feed(self, delta: str) -> tuple[str, list]:
        """The reasoning and the answer events the delta completes."""
        self._buffer += delta
        reasoning: list[str] = []
        events: list = []
        while self._step(reasoning, events):
            pass
        return "".join(reasoning), events

    def finish(self) -> tuple[str, list]:
        """The end of the output: a held-back partial marker is text of the body it was in; an
        unfinished header is dropped (it named no body)."""
        reasoning, events = self.feed("")
        rest, self._buffer = self._buffer, ""
        if self._state == "plain" or (self._state == "body" and self._route == "answer"):
            if rest:
                events.append(rest)
        elif self._state == "body" and self._route == "reasoning":
            reasoning += rest
        elif self._state == "body" and self._route == "call" and rest:
            events.append(self._arguments(rest))
        return reasoning, events

    @property
    def part(self) -> str:
        """"start" (no message yet), "reasoning" (analysis so far) or "answer" (a body that is not
        analysis has begun)."""
        return self._part

    @property
    def opened(self) -> bool:
        """Whether the output has (or had) reasoning: an analysis message."""
        return self._opened

    @property
    def reasoning_ended(self) -> bool:
        return self._part == "answer"

    # ------------------------------------------------------------------ the states
    def _step(self, reasoning: list[str], events: list) -> bool:
        """Advances over the buffer; False when it must wait for more text."""
        if self._state == "plain":
            if self._buffer:
                events.append(self._buffer)
                self._buffer = ""
            return False
        if self._state == "header":
            return self._header(events)
        ends = [(self._buffer.find(marker), marker) for marker in _BODY_ENDS]
        found = [(at, marker) for at, marker in ends if at >= 0]
        if not found:
            keep = max(partial_marker_suffix(self._buffer, marker) for marker in _BODY_ENDS)
            self._emit(self._buffer[:len(self._buffer) - keep], reasoning, events)
            self._buffer = self._buffer[len(self._buffer) - keep:]
            return False
        at, marker = min(found)
        self._emit(self._buffer[:at], reasoning, events)
        self._buffer = self._buffer[at + (0 if marker == START else len(marker)):]
        self._state = "header"
        return True

    def _header(self, events: list) -> bool:
        stripped = self._buffer.lstrip()
        if not stripped:
            return False
        at = stripped.find(MESSAGE)
        if at < 0:
            opens = stripped.startswith((START, CHANNEL)) or START.startswith(stripped) or CHANNEL.startswith(stripped)
            if opens and len(stripped) <= _HEADER_MAX:
                return False  # a header still coming
            if self._part == "start" or not opens:  # not the format: the rest is answer text
                self._state, self._part = "plain", "answer"
                return True
            return False
        header, self._buffer = stripped[:at], stripped[at + len(MESSAGE):]
        if self._part == "start" and not header.startswith((START, CHANNEL)):
            self._buffer, self._state, self._part = stripped, "plain", "answer"  # text before any header
            return True
        channel = _CHANNEL_NAME.search(header)
        recipient = _RECIPIENT.search(header)
        name = recipient.group(1) if recipient else ""
        if self.tool_calls and name.startswith(FUNCTIONS):
            self._route = "call"
            events.append(self._start_call(name[len(FUNCTIONS):]))
        elif channel is not None and channel.group(1) == "analysis" and not name:
            self._route, self._opened = "reasoning", True
        else:
            self._route = "answer"
        if self._part == "start" or self._route != "reasoning":
            self._part = "reasoning" if self._route == "reasoning" else "answer"
        self._state = "body"
        return True

    def _emit(self, text: str, reasoning: list[str], events: list) -> None:
        if not text:
            return
        if self._route == "reasoning":
            reasoning.append(text)
        elif self._route == "call":
            events.append(self._arguments(text))
        else:
            events.append(text)

    def _start_call(self, name: str) -> ToolCallStart:
        call = ToolCall(f"call_{uuid.uuid4().hex[:24]}", name, "")
        self.calls.append(call)
        return ToolCallStart(len(self.calls) - 1, call.id, name)

    def _arguments(self, text: str) -> ToolCallArguments:
        self.calls[-1].arguments += text
        return ToolCallArguments(len(self.calls) - 1, text)
