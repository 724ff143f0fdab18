"""A StructuredOutputsParams as the llguidance grammar that enforces it: a JSON schema (or any JSON
object), a regex, a choice among strings (a Lark alternation of JSON-escaped literals), or a
grammar in Lark or GBNF (converted to Lark)."""

from __future__ import annotations

import importlib
import json
from types import ModuleType

from corellm.sampling_params import StructuredOutputsParams


def llguidance_module() -> ModuleType:
    """The llguidance package, imported on first use: an engine that serves no structured request
    never loads it (and runs where it is not installed, such as a bare GPU image)."""
    try:
        return importlib.import_module("llguidance")
    except ImportError as e:
        raise ValueError(f"structured output needs the llguidance package, which is not installed here ({e})") from e


# JSON whitespace between tokens: flexible (a model may indent as it learned to), but at most 20
# characters at a time, so that no output can run on in whitespace alone (llguidance's default
# allows any amount).
JSON_OPTIONS = {"whitespace_pattern": r"[\x20\x0A\x0D\x09]{0,20}"}


def grammar_of(spec: StructuredOutputsParams) -> str:
    """The llguidance grammar (its serialized form) of the spec; ValueError naming the field when
    the spec cannot even be turned into one (a GBNF grammar that does not convert)."""
    llguidance = llguidance_module()
    kind = spec.kind
    if kind == "json":
        return llguidance.LLMatcher.grammar_from_json_schema(spec.json, defaults=JSON_OPTIONS)
    if kind == "json_object":
        return llguidance.LLMatcher.grammar_from_json_schema({"type": "object"}, defaults=JSON_OPTIONS)
    if kind == "regex":
        return llguidance.LLMatcher.grammar_from_regex(spec.regex)
    if kind == "choice":
        return llguidance.LLMatcher.grammar_from_lark("start: " + " | ".join(json.dumps(c) for c in spec.choice))
    lark = spec.grammar
    if "::=" in lark:  # GBNF (llama.cpp's grammars), not Lark
        from llguidance.gbnf_to_lark import gbnf_to_lark

        try:
            lark = gbnf_to_lark(lark)
        except Exception as e:  # noqa: BLE001 - the converter raises its own error types
            raise ValueError(f"structured_outputs.grammar: not a valid GBNF grammar: {e}") from None
    return llguidance.LLMatcher.grammar_from_lark(lark)
