"""ReasoningParser: a reasoning model's output split into its reasoning and its answer, as it
streams. Models of the <think> ... </think> family write their reasoning first:

    deepseek_r1   the prompt opens the block (the template ends with "<think>\\n"), so the output is
                  reasoning until "</think>" (a leading "<think>" is dropped too); no "</think>":
                  all of it was reasoning.
    qwen3         the model opens the block itself: reasoning only between "<think>" and
                  "</think>"; an output that does not start with "<think>" is all answer (thinking
                  off: the template wrote an empty block into the prompt).

feed(delta) -> (reasoning piece, answer piece); a partial tag is held back until it resolves.

    openai_gptoss gpt-oss's harmony messages: corellm.harmony's HarmonyParser (make_reasoning_parser)."""

from __future__ import annotations

from corellm.text_holdback import partial_marker_suffix

THINK_START, THINK_END = "<think>", "</think>"
REASONING_PARSERS = ("deepseek_r1", "qwen3", "openai_gptoss")
HARMONY = "openai_gptoss"  # gpt-oss's format: corellm.harmony


def make_reasoning_parser(kind: str, tool_calls: bool = False):
    """A fresh parser of one output in `kind`'s format: a ReasoningParser, or for openai_gptoss a
    HarmonyParser (which reads the calls too where tool_calls: the request offers tools)."""
    if kind == HARMONY:
        from corellm.harmony import HarmonyParser

        return HarmonyParser(tool_calls)
    return ReasoningParser(kind)


class ReasoningParser:
    def __init__(self, kind: str):
        if kind not in REASONING_PARSERS or kind == HARMONY:
            raise ValueError(f"unknown reasoning parser {kind!r}: one of {', '.join(REASONING_PARSERS)}")
        self.kind = kind
        # "start": nothing seen yet (a leading <think> may come); "reasoning"; "answer".
        self._state = "start"
        self._buffer = ""
        self._opened = kind == "deepseek_r1"  # the prompt opened the block
        self._part_started = False  # the current part (reasoning or answer) has shown text: no more newline stripping

    def feed(self, delta: str) -> tuple[str, str]:
        self._buffer += delta
        reasoning, answer = [], []
        while True:
            if self._state == "start":
                stripped = self._buffer.lstrip()
                if THINK_START.startswith(stripped) and len(stripped) < len(THINK_START):
                    break  # maybe the opening tag, still coming
                if stripped.startswith(THINK_START):
                    self._buffer, self._opened = stripped[len(THINK_START):], True
                self._state = "reasoning" if self._opened else "answer"
            elif not self._part_started and not self._buffer.lstrip("\n"):
                break  # the newlines after a tag belong to no part: wait for the part's first text
            elif self._state == "reasoning":
                if not self._part_started:
                    self._buffer, self._part_started = self._buffer.lstrip("\n"), True
                at = self._buffer.find(THINK_END)
                if at < 0:
                    keep = partial_marker_suffix(self._buffer, THINK_END)
                    reasoning.append(self._buffer[:len(self._buffer) - keep])
                    self._buffer = self._buffer[len(self._buffer) - keep:]
                    break
                reasoning.append(self._buffer[:at])
                self._buffer = self._buffer[at + len(THINK_END):]
                self._state, self._part_started = "answer", False
            else:
                if not self._part_started:
                    self._buffer, self._part_started = self._buffer.lstrip("\n"), True
                answer.append(self._buffer)
                self._buffer = ""
                break
        return "".join(reasoning), "".join(answer)

    def finish(self) -> tuple[str, str]:
        """The end of the output: a held-back partial tag is text of the part it was in."""
        reasoning, answer = self.feed("")
        rest, self._buffer = self._buffer, ""
        if self._state == "reasoning":
            return reasoning + rest, answer
        return reasoning, answer + rest

    @property
    def reasoning_ended(self) -> bool:
        return self._state == "answer"

    @property
    def part(self) -> str:
        """Where the output is: "start" (undecided: a leading <think> may still come), "reasoning"
        or "answer"."""
        return self._state

    @property
    def opened(self) -> bool:
        """Whether the output is (or was) in a reasoning block."""
        return self._opened

