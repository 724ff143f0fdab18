"""How a model writes a tool call, and the grammars that hold it to that.

A format is the text that opens a call (its trigger), the call's beginning for a given function
(trigger, then the name), the arguments (a JSON object, held to the function's parameter schema)
and the text that closes it:

    hermes       <tool_call>\\n{"name": "NAME", "arguments": ARGS}\\n</tool_call>     (Hermes, Qwen 2.5 / 3)
    llama3_json  {"name": "NAME", "parameters": ARGS}                                (Llama 3.1+)
    mistral      [TOOL_CALLS][{"name": "NAME", "arguments": ARGS}]                   (Mistral)

tool_choice_constraint() turns a request's tools and tool_choice into the StructuredOutputsParams
that enforce them (Lark grammars in llguidance's dialect):
  - a named function: the whole output is its arguments (vLLM's behaviour);
  - "required": the output is one call, or several (parallel_tool_calls), and nothing else;
  - "auto": free text, in which a call may open at its trigger; from there on the call is held to
    the format and its function's schema (a lazy lexeme ends the free text at the trigger).
A trigger that is one special token of the model's vocabulary (Qwen's <tool_call>, Mistral's
[TOOL_CALLS]) is referred to as that token, which is what the model emits."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from corellm.sampling_params import StructuredOutputsParams
from corellm.tokenizer import Tokenizer

ANY_OBJECT: dict[str, Any] = {"type": "object"}


@dataclass(frozen=True)
class Tool:
    """One function a request offers (OpenAI's tools[i].function)."""

    name: str
    parameters: dict[str, Any] | None = None  # a JSON schema of the arguments object (None: any object)
    description: str | None = None

    @property
    def schema(self) -> dict[str, Any]:
        return self.parameters if self.parameters else ANY_OBJECT


@dataclass(frozen=True)
class ToolCallFormat:
    name: str
    trigger: str  # the text that opens a call
    begin_template: str  # the call up to its arguments, with {name}
    end: str  # after the arguments' closing brace

    def begin(self, function: str) -> str:
        return self.begin_template.format(name=json.dumps(function)[1:-1])


TOOL_CALL_FORMATS = {
    "hermes": ToolCallFormat("hermes", "<tool_call>", '<tool_call>\n{{"name": "{name}", "arguments": ', "}\n</tool_call>"),
    "llama3_json": ToolCallFormat("llama3_json", '{"name": ', '{{"name": "{name}", "parameters": ', "}"),
    "mistral": ToolCallFormat("mistral", "[TOOL_CALLS]", '[TOOL_CALLS][{{"name": "{name}", "arguments": ', "}]"),
}
# gpt-oss's calls (harmony messages to functions.NAME) are read by corellm.harmony's parser, with the
# openai_gptoss reasoning parser (vLLM's names): a --tool-call-parser without a ToolCallFormat.
HARMONY_TOOL_PARSER = "openai"
TOOL_CALL_PARSERS = tuple(sorted([*TOOL_CALL_FORMATS, HARMONY_TOOL_PARSER]))


def tool_choice_constraint(tools: list[Tool], tool_choice: str | dict, fmt: ToolCallFormat, parallel: bool,
                           tokenizer: Tokenizer) -> StructuredOutputsParams | None:
    """The constraint of a request's tool_choice: "none" -> None; a named function -> its
    arguments' schema; "required" / "auto" -> a grammar of calls in `fmt`."""
    if tool_choice == "none":
        return None
    if isinstance(tool_choice, dict):
        name = tool_choice["function"]["name"]
        return StructuredOutputsParams(json=next(t for t in tools if t.name == name).schema)
    calls = " | ".join(f"call_{i}" for i in range(len(tools)))
    special = _special_prefix(fmt.trigger, tokenizer)
    rules = []
    for i, tool in enumerate(tools):
        body = f"{_lark_string(fmt.begin(tool.name)[len(fmt.trigger):])} %json {json.dumps(tool.schema)} " \
               f"{_lark_string(fmt.end)}"
        if tool_choice == "required":
            rules.append(f"call_{i}: {special or _lark_string(fmt.trigger)} {body}")
        elif special:  # the model's special token ends the free text by itself
            rules.append(f"call_{i}: TEXT {special} {body}")
        else:
            rules.append(f"call_{i}_opening[lazy]: TEXT {_lark_string(fmt.trigger)}")
            rules.append(f"call_{i}: call_{i}_opening {body}")
    if tool_choice == "required":
        start = f"start: call ({_SEPARATOR} call)*" if parallel else "start: call"
        lexemes = ""
    else:
        start = "start: call* TEXT" if parallel else "start: call? TEXT"
        lexemes = "TEXT: /(.|\\n)*/\n"
    grammar = f"%llguidance {{}}\n{start}\ncall: {calls}\n" + "\n".join(rules) + "\n" + lexemes
    return StructuredOutputsParams(grammar=grammar)


_SEPARATOR = '/[ \\n]*/'  # between the calls of "required" (the parser drops it)


def _lark_string(text: str) -> str:
    return json.dumps(text)


def _special_prefix(trigger: str, tokenizer: Tokenizer) -> str | None:
    """The trigger as a Lark special-token reference when it is one special token of the model."""
    token_id = tokenizer.token_to_id(trigger)
    if token_id is not None and tokenizer.is_special(token_id):
        return trigger if trigger.startswith("<") and trigger.endswith(">") else f"<[{token_id}]>"
    return None
