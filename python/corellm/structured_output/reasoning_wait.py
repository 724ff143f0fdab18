"""ReasoningWait: a reasoning model's request waiting for the end of its reasoning block, and
vLLM's thinking_token_budget, which bounds that block.

A reasoning request writes "<think> ... </think>" and then its answer. Its grammar (structured
output) applies to the answer only: it is dormant until the output holds "</think>", and the
token after that is the grammar's first (StructuredOutputManager).

With a budget of N tokens, the reasoning's tokens are counted: from the output's first token
when the prompt opened the block (the deepseek_r1 parser: the template ends with "<think>"),
else from the token after the output's own "<think>" (qwen3). When N tokens have gone by
without "</think>", the engine ends the reasoning: the request's matcher becomes ForcedReasoningEnd's
— the bitmask allows only the tokens that spell "</think>", then what the answer's grammar
allows (or anything, without one). A reasoning that ends by itself within N tokens is left as it
was: the budget changes nothing in it. A budget of 0 ends the reasoning before its first token.

    wait = ReasoningWait(ReasoningBudget(tokens=64, opened=True))  # or ReasoningWait(): no budget
    wait.feed(text of each sampled token) -> "waiting" | "ended" (the model wrote </think>)
                                             | "exhausted" (force the end now)"""

from __future__ import annotations

import json
from dataclasses import dataclass

from corellm.reasoning_parser import THINK_END, THINK_START
from corellm.sampling_params import StructuredOutputsParams


@dataclass(frozen=True)
class ReasoningBudget:
    """A request's thinking_token_budget as the engine applies it (EngineCoreRequest)."""

    tokens: int  # the reasoning block may take this many tokens
    opened: bool  # the prompt opened the block: the output is reasoning from its first token


@dataclass(frozen=True)
class ForcedReasoningEnd:
    """The grammar of a reasoning cut at its budget: "</think>", then the answer's grammar (the
    request's structured output) or any text. Compiled (and cached) as any spec by the
    GrammarCompiler."""

    answer: StructuredOutputsParams | None
    kind = "thinking_token_budget"

    def key(self) -> str:
        return f"{self.kind}:{self.answer.key() if self.answer is not None else ''}"

    def grammar(self, answer_grammar: str | None) -> str:
        """The serialized llguidance grammar, given the answer's (grammar_spec.grammar_of): the
        answer is a grammar of its own in the same top-level grammar, referred to by name."""
        if answer_grammar is None:
            return json.dumps({"grammars": [{"name": self.kind, "lark_grammar": f"start: {json.dumps(THINK_END)} "
                                                                                r"/(.|\n)*/"}]})
        try:
            top = json.loads(answer_grammar)  # a JSON schema's or a regex's: {"grammars": [...]}
        except json.JSONDecodeError:
            top = {"grammars": [{"lark_grammar": answer_grammar}]}  # a Lark grammar's text
        answer = top["grammars"][0]
        answer["name"] = answer.get("name") or "answer"
        top["grammars"].insert(0, {"name": self.kind, "lark_grammar": f"start: {json.dumps(THINK_END)} "
                                                                      f"@{answer['name']}"})
        return json.dumps(top)


class ReasoningWait:
    def __init__(self, budget: ReasoningBudget | None = None):
        self._counting = budget is not None and budget.opened  # the budgeted reasoning has begun
        self._left = budget.tokens if budget is not None else None  # None: no budget
        self._tail = ""  # the output's last characters: enough to hold a marker split over tokens

    @property
    def exhausted_at_start(self) -> bool:
        """A budget of 0 with the block open: the reasoning ends before its first token."""
        return self._counting and self._left == 0

    def feed(self, text: str) -> str:
        """One sampled token's text: "ended" when the output now holds "</think>", "exhausted"
        when the budget is spent (the next tokens must be the forced end), else "waiting"."""
        self._tail = (self._tail + text)[-4 * len(THINK_END):]
        if THINK_END in self._tail:
            return "ended"
        if self._left is None:
            return "waiting"
        if not self._counting:
            if THINK_START in self._tail:  # the model opened the block: its reasoning starts after this token
                self._counting = True
                return "exhausted" if self._left == 0 else "waiting"
            return "waiting"
        self._left -= 1
        return "exhausted" if self._left <= 0 else "waiting"
