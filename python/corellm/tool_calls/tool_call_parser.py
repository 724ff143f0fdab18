"""ToolCallParser: a model's output text -> its content and its tool calls, as the text streams in.

feed(delta) returns what the delta completes, in order: content text (str), ToolCallStart (a
call's index, id and function name: sent first) and ToolCallArguments (a piece of its arguments'
JSON: they join to the whole). finish() flushes what was held back. State machine over the text:

    TEXT ──trigger──▶ BEGIN ──a function's begin──▶ ARGUMENTS ──object closes──▶ END ──end──▶ TEXT
    (content)         (which function?)             (JSON, by brace depth)       (format's closing)

"auto" starts in TEXT (content until a call opens; a partial trigger is held back); "required"
starts at BEGIN and drops the whitespace between calls; a named function starts in ARGUMENTS.
Text that does not follow the format (an unconstrained model) is content."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from corellm.text_holdback import partial_marker_suffix
from corellm.tool_calls.tool_call_format import ToolCallFormat


@dataclass
class ToolCallStart:
    index: int
    id: str
    name: str


@dataclass
class ToolCallArguments:
    index: int
    text: str


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: str  # a JSON object's text


class ToolCallParser:
    def __init__(self, fmt: ToolCallFormat, function_names: list[str], mode: str, named: str | None = None):
        """mode: "auto", "required" or "named" (then `named` is the function)."""
        self.fmt = fmt
        self.begins = {fmt.begin(name): name for name in function_names}
        self.mode = mode
        self.calls: list[ToolCall] = []
        self.content: list[str] = []
        self._buffer = ""
        self._state = "TEXT" if mode == "auto" else "BEGIN"
        self._depth, self._in_string, self._escaped = 0, False, False
        if mode == "named":
            self._state = "ARGUMENTS"
            self._first = self._start_call(named)

    # ------------------------------------------------------------------ API
    def feed(self, delta: str) -> list:
        self._buffer += delta
        events: list = []
        if self.mode == "named" and self._first is not None:
            events.append(self._first)
            self._first = None
        while self._step(events):
            pass
        return events

    def finish(self) -> list:
        """The end of the output: what was held back (a partial trigger or closing) is content."""
        events = self.feed("")
        if self._state == "TEXT" and self._buffer:
            events.append(self._content(self._buffer))
        elif self._state in ("BEGIN", "END") and self._buffer.strip() and self.mode == "auto":
            events.append(self._content(self._buffer))
        self._buffer = ""
        return events

    # ------------------------------------------------------------------ the states
    def _step(self, events: list) -> bool:
        """Advances the state machine over the buffer; False when it must wait for more text."""
        if self._state == "TEXT":
            at = self._buffer.find(self.fmt.trigger)
            if at < 0:
                keep = partial_marker_suffix(self._buffer, self.fmt.trigger)
                if len(self._buffer) > keep:
                    events.append(self._content(self._buffer[:len(self._buffer) - keep]))
                    self._buffer = self._buffer[len(self._buffer) - keep:]
                return False
            if at:
                events.append(self._content(self._buffer[:at]))
            self._buffer, self._state = self._buffer[at:], "BEGIN"
            return True
        if self._state == "BEGIN":
            if self.mode == "required":
                self._buffer = self._buffer.lstrip(" \n")
            for begin, name in self.begins.items():
                if self._buffer.startswith(begin):
                    events.append(self._start_call(name))
                    self._buffer, self._state = self._buffer[len(begin):], "ARGUMENTS"
                    return True
            if any(begin.startswith(self._buffer) for begin in self.begins):
                return False  # the call's beginning is still coming in
            if self.mode == "auto":  # not a call after all: the trigger was text
                cut = len(self.fmt.trigger)
                events.append(self._content(self._buffer[:cut]))
                self._buffer, self._state = self._buffer[cut:], "TEXT"
                return True
            return False
        if self._state == "ARGUMENTS":
            end = self._scan_json()
            piece = self._buffer[:end]
            if piece:
                events.append(ToolCallArguments(len(self.calls) - 1, piece))
                self.calls[-1].arguments += piece
            self._buffer = self._buffer[end:]
            if self._depth == 0 and self.calls[-1].arguments.strip():
                self._state = "END" if self.mode != "named" else "DONE"
                return True
            return False
        if self._state == "END":
            if self._buffer.startswith(self.fmt.end):
                self._buffer = self._buffer[len(self.fmt.end):]
                self._state = "TEXT" if self.mode == "auto" else "BEGIN"
                return True
            if not self.fmt.end.startswith(self._buffer) and self.mode == "auto":
                self._state = "TEXT"  # the closing did not come: what follows is text
                return True
            return False
        return False  # DONE: a named function's arguments are complete

    def _scan_json(self) -> int:
        """How much of the buffer belongs to the current arguments object (tracking brace depth
        outside strings); stops right after the object's closing brace."""
        for i, ch in enumerate(self._buffer):
            if self._in_string:
                if self._escaped:
                    self._escaped = False
                elif ch == "\\":
                    self._escaped = True
                elif ch == '"':
                    self._in_string = False
            elif ch == '"':
                self._in_string = True
            elif ch in "{[":
                self._depth += 1
            elif ch in "}]":
                self._depth -= 1
                if self._depth == 0:
                    return i + 1
        return len(self._buffer)

    def _start_call(self, name: str) -> ToolCallStart:
        call = ToolCall(f"call_{uuid.uuid4().hex[:24]}", name, "")
        self.calls.append(call)
        self._depth, self._in_string, self._escaped = 0, False, False
        return ToolCallStart(len(self.calls) - 1, call.id, name)

    def _content(self, text: str) -> str:
        self.content.append(text)
        return text

