"""How a StructuredOutputsParams' JSON options and structural tags change what its grammar accepts
(SmolLM2's tokenizer; each text tokenized and fed to a fresh matcher): whitespace as the request
asks, objects closed by disable_additional_properties exactly where JSON Schema's own rule would
refuse the extra key (the `jsonschema` package as the reference), a structural tag's JSON checked
after each begin and the text around it free. Malformed options are ValueErrors naming them."""

from __future__ import annotations

import json

import jsonschema
import pytest

from corellm.sampling_params import StructuredOutputsParams
from corellm.structured_output.grammar_spec import closed_objects
from tests.structured_output.conftest import accepts


PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name"]}


def test_whitespace_flexible_by_default_none_or_the_requests_pattern(compiler):
    texts = ['{"name":"Ann"}', '{"name": "Ann"}', '{\n  "name": "Ann",\n  "age": 3\n}', '{"name":  "Ann"}']
    default = StructuredOutputsParams(json=PERSON)
    compact = StructuredOutputsParams(json=PERSON, disable_any_whitespace=True)
    one_space = StructuredOutputsParams(json=PERSON, whitespace_pattern="[ ]")  # one space or none
    assert [accepts(compiler, default, t) for t in texts] == [True, True, True, True]
    assert [accepts(compiler, compact, t) for t in texts] == [True, False, False, False]
    assert [accepts(compiler, one_space, t) for t in texts] == [True, True, False, False]
    assert not accepts(compiler, default, "{" + " " * 21 + '"name":"A"}')  # at most 20 at a time
    assert [accepts(compiler, StructuredOutputsParams(json_object=True, disable_any_whitespace=True), t)
            for t in ('{"k":[1,2]}', '{"k": [1, 2]}')] == [True, False]


NESTED = {
    "type": "object",
    "properties": {
        "properties": {"type": "object", "properties": {"x": {"type": "integer"}}},  # a property so named
        "owner": {"$ref": "#/$defs/person"},
        "pets": {"type": "array", "items": {"type": "object", "properties": {"kind": {"type": "string"}}}},
        "open": {"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": True},
        "either": {"anyOf": [{"type": "object", "properties": {"b": {"type": "integer"}}}, {"type": "integer"}]},
    },
    "$defs": {"person": PERSON},
}
# The same schema with its objects closed by hand: JSON Schema's validity of each document under it
# is what the grammar must accept with disable_additional_properties.
CLOSED = {"person": {**PERSON, "additionalProperties": False}}
NESTED_CLOSED = {
    "type": "object", "additionalProperties": False,
    "properties": {
        "properties": {"type": "object", "properties": {"x": {"type": "integer"}}, "additionalProperties": False},
        "owner": {"$ref": "#/$defs/person"},
        "pets": {"type": "array", "items": {"type": "object", "properties": {"kind": {"type": "string"}},
                                            "additionalProperties": False}},
        "open": {"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": True},
        "either": {"anyOf": [{"type": "object", "properties": {"b": {"type": "integer"}}, "additionalProperties": False},
                             {"type": "integer"}]},
    },
    "$defs": CLOSED,
}


@pytest.mark.parametrize("doc", [
    {"owner": {"name": "Ann"}},
    {"owner": {"name": "Ann", "pet": "cat"}},
    {"pets": [{"kind": "cat"}, {"kind": "dog", "age": 2}]},
    {"properties": {"x": 1}},
    {"properties": {"x": 1, "y": 2}},
    {"open": {"a": 1, "z": 2}},
    {"either": {"b": 1, "c": 2}},
    {"either": 5},
    {"extra": 1},
])
def test_disable_additional_properties_refuses_exactly_what_json_schema_refuses_when_closed(compiler, doc):
    jsonschema.validate(doc, NESTED)
    assert closed_objects(NESTED) == NESTED_CLOSED
    try:
        jsonschema.validate(doc, NESTED_CLOSED)
        valid = True
    except jsonschema.ValidationError:
        valid = False
    text = json.dumps(doc)
    assert accepts(compiler, StructuredOutputsParams(json=NESTED), text)  # every doc here is valid when open
    assert accepts(compiler, StructuredOutputsParams(json=NESTED, disable_additional_properties=True), text) == valid


def test_closing_the_objects_keeps_the_request_schema_as_it_was():
    before = json.dumps(NESTED, sort_keys=True)
    closed = closed_objects(NESTED)
    assert json.dumps(NESTED, sort_keys=True) == before
    assert closed["additionalProperties"] is False and closed["$defs"]["person"]["additionalProperties"] is False
    assert closed["properties"]["open"]["additionalProperties"] is True  # said otherwise: left alone
    assert "additionalProperties" not in closed["properties"]  # the map of properties is not a schema
    assert closed["properties"]["properties"]["additionalProperties"] is False


TAG = {"type": "structural_tag", "triggers": ["<function="],
       "structures": [{"begin": "<function=get_weather>", "schema": {
           "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}, "end": "</function>"},
           {"begin": "<function=get_time>", "schema": {"type": "object", "properties": {}}, "end": "</function>"}]}


@pytest.mark.parametrize("text, ok", [
    ("No tools needed, it is sunny.", True),
    ('Let me look. <function=get_weather>{"city": "Paris"}</function> One moment.', True),
    ('<function=get_time>{}</function><function=get_weather>{"city": "Oslo"}</function>', True),
    ('<function=get_weather>{"town": "Paris"}</function>', False),  # not its schema
    ('<function=get_weather>{"city": "Paris"} and more', False),  # its end must follow the JSON
    ("<function=send_mail>{}</function>", False),  # a trigger, then no structure's begin
])
def test_a_structural_tag_checks_the_json_after_each_begin_and_leaves_the_text_free(compiler, text, ok):
    assert accepts(compiler, StructuredOutputsParams(structural_tag=TAG), text) == ok
    assert accepts(compiler, StructuredOutputsParams(structural_tag=json.dumps(TAG)), text) == ok


def test_a_structural_tags_json_follows_the_whitespace_options(compiler):
    compact = StructuredOutputsParams(structural_tag=TAG, disable_any_whitespace=True)
    assert accepts(compiler, compact, '<function=get_weather>{"city":"Paris"}</function>')
    assert not accepts(compiler, compact, '<function=get_weather>{"city": "Paris"}</function>')
    closed = StructuredOutputsParams(structural_tag=TAG, disable_additional_properties=True)
    assert accepts(compiler, StructuredOutputsParams(structural_tag=TAG), '<function=get_time>{"tz": "UTC"}</function>')
    assert not accepts(compiler, closed, '<function=get_time>{"tz": "UTC"}</function>')


def test_the_options_are_part_of_the_compiled_grammars_key():
    keys = {StructuredOutputsParams(json=PERSON, **options).key() for options in (
        {}, {"disable_any_whitespace": True}, {"whitespace_pattern": " ?"}, {"disable_additional_properties": True})}
    assert len(keys) == 4
    assert StructuredOutputsParams(json=PERSON, disable_fallback=True).key() == StructuredOutputsParams(json=PERSON).key()


@pytest.mark.parametrize("spec, message", [
    (dict(regex="a+", disable_any_whitespace=True), "disable_any_whitespace applies to JSON output .*not to regex"),
    (dict(choice=["a"], whitespace_pattern=" "), "whitespace_pattern applies to JSON output"),
    (dict(grammar="start: 'a'", disable_additional_properties=True), "disable_additional_properties applies"),
    (dict(json=PERSON, disable_any_whitespace=True, whitespace_pattern=" "), "not both"),
    (dict(json=PERSON, whitespace_pattern=""), "whitespace_pattern must be a non-empty string"),
    (dict(json=PERSON, disable_any_whitespace="yes"), "disable_any_whitespace must be true or false"),
    (dict(structural_tag="{oops"), "structural_tag is not valid JSON"),
    (dict(structural_tag={**TAG, "triggers": []}), "structural_tag.triggers must be a non-empty list"),
    (dict(structural_tag={**TAG, "structures": []}), "structural_tag.structures must be a non-empty list"),
    (dict(structural_tag={**TAG, "format": {}}), r"structural_tag.format is not supported"),
    (dict(structural_tag={**TAG, "type": "tag"}), 'structural_tag.type must be "structural_tag"'),
    (dict(structural_tag={**TAG, "structures": [{"begin": "<tool>", "schema": {}, "end": ""}]}),
     r"structures\[0\].begin '<tool>' starts with none of the triggers"),
    (dict(structural_tag={**TAG, "structures": [{"begin": "<function=f>", "end": ""}]}),
     r"structures\[0\].schema must be a JSON schema object"),
    (dict(structural_tag={**TAG, "structures": [{"begin": "<function=f>", "schema": {}, "end": "", "x": 1}]}),
     r"structures\[0\].x is not supported"),
    (dict(structural_tag=TAG, regex="a"), "exactly one of"),
])
def test_malformed_options_and_tags_are_refused_naming_them(spec, message):
    with pytest.raises(ValueError, match=message):
        StructuredOutputsParams(**spec)
