"""A StructuredOutputsParams as the llguidance grammar that enforces it: a JSON schema (or any JSON
object), a regex, a choice among strings (a Lark alternation of JSON-escaped literals), a
grammar in Lark or GBNF (converted to Lark), or a structural tag (free text with JSON after each
tag: llguidance's lazy triggers); and a reasoning's forced end (reasoning_wait.ForcedReasoningEnd).

JSON is written with flexible whitespace (up to 20 characters at a time), none at all
(disable_any_whitespace) or the request's own whitespace_pattern; with
disable_additional_properties every object schema that does not say otherwise gets
`additionalProperties: false` before it compiles."""

from __future__ import annotations

import copy
import importlib
import json
from types import ModuleType
from typing import Any

from corellm.sampling_params import StructuredOutputsParams
from corellm.structured_output.reasoning_wait import ForcedReasoningEnd


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
JSON_WHITESPACE = r"[\x20\x0A\x0D\x09]{0,20}"


def json_options(spec: StructuredOutputsParams) -> dict[str, Any]:
    """llguidance's JSON options ("x-guidance") for the spec's whitespace."""
    if spec.disable_any_whitespace:
        return {"whitespace_flexible": False}
    return {"whitespace_pattern": spec.whitespace_pattern or JSON_WHITESPACE}


# The keywords whose values are schemas, lists of schemas, or maps of names to schemas.
_SUBSCHEMA = ("additionalProperties", "items", "not", "if", "then", "else", "contains", "propertyNames",
              "unevaluatedProperties", "unevaluatedItems")
_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SUBSCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")


def closed_objects(schema: Any) -> Any:
    """A copy of the schema in which every object schema (type "object", or with properties)
    without additionalProperties has `additionalProperties: false`. Walks the schema by its
    keywords, so that a property that happens to be called "properties" is not taken for one."""
    schema = copy.deepcopy(schema)

    def close(node: Any) -> None:
        if not isinstance(node, dict):
            return
        types = node.get("type")
        is_object = types == "object" or (isinstance(types, list) and "object" in types) or "properties" in node
        if is_object and "additionalProperties" not in node:
            node["additionalProperties"] = False
        for key in _SUBSCHEMA:
            close(node.get(key))
        for key in _SUBSCHEMA_LISTS:
            if isinstance(node.get(key), list):
                for sub in node[key]:
                    close(sub)
        for key in _SUBSCHEMA_MAPS:
            if isinstance(node.get(key), dict):
                for sub in node[key].values():
                    close(sub)

    close(schema)
    return schema


def _schema(spec: StructuredOutputsParams, schema: dict[str, Any]) -> dict[str, Any]:
    return closed_objects(schema) if spec.disable_additional_properties else schema


def grammar_of(spec: StructuredOutputsParams | ForcedReasoningEnd) -> str:
    """The llguidance grammar (its serialized form) of the spec; ValueError naming the field when
    the spec cannot even be turned into one (a GBNF grammar that does not convert)."""
    if isinstance(spec, ForcedReasoningEnd):
        return spec.grammar(None if spec.answer is None else grammar_of(spec.answer))
    llguidance = llguidance_module()
    kind = spec.kind
    if kind in ("json", "json_object"):
        schema = spec.json if kind == "json" else {"type": "object"}
        return llguidance.LLMatcher.grammar_from_json_schema(_schema(spec, schema), defaults=json_options(spec))
    if kind == "structural_tag":
        return _structural_tag_grammar(spec)
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


def _structural_tag_grammar(spec: StructuredOutputsParams) -> str:
    """Free text, in which each structure's begin (it starts with one of the triggers) is
    followed by JSON of its schema and then its end. The text is unconstrained until a trigger
    appears; a trigger written as one of the vocabulary's special tokens (`<|python_tag|>`)
    matches that token."""
    llguidance = llguidance_module()
    tag = spec.structural_tag
    options = json_options(spec)
    tags = []
    for s in tag["structures"]:
        # The JSON options travel inside each schema ("x-guidance"; the schema's own win).
        schema = _schema(spec, s["schema"])
        own = schema.get("x-guidance")
        schema = {**schema, "x-guidance": {**options, **(own if isinstance(own, dict) else {})}}
        trigger = next(t for t in tag["triggers"] if s["begin"].startswith(t))
        tags.append(llguidance.StructTag(trigger=trigger, begin=s["begin"], grammar=schema, end=s["end"]))
    return llguidance.LLMatcher.grammar_from_lark(llguidance.StructTag.to_grammar(tags))
