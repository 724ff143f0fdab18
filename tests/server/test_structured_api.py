"""Structured output through the server and the official openai client: response_format (json_object
and json_schema, streamed or not), vLLM's structured_outputs and the older guided_* fields, each
output valid; how JSON is written (disable_any_whitespace, guided_whitespace_pattern) and vLLM's
structural tags (response_format, structured_outputs, the top-level field); the 400s name the
field that was wrong, before anything is admitted."""

from __future__ import annotations

import json
import re

import jsonschema
import openai
import pytest

SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "minLength": 1, "maxLength": 30},
                                           "population": {"type": "integer", "minimum": 0, "maximum": 10**8}},
          "required": ["city", "population"], "additionalProperties": False}
ASK = [{"role": "user", "content": "Name a big city and its population, as JSON."}]


def test_response_format_json_schema(client, model_name):
    fmt = {"type": "json_schema", "json_schema": {"name": "city", "schema": SCHEMA, "strict": True}}
    out = client.chat.completions.create(model=model_name, messages=ASK, max_tokens=80, temperature=0,
                                         response_format=fmt)
    assert out.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(out.choices[0].message.content), SCHEMA)
    chunks = list(client.chat.completions.create(model=model_name, messages=ASK, max_tokens=80, temperature=0,
                                                 response_format=fmt, stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert json.loads(text) == json.loads(out.choices[0].message.content)


def test_response_format_json_object_on_completions(client, model_name):
    out = client.completions.create(model=model_name, prompt="A JSON object describing a cat:", max_tokens=60,
                                    temperature=0.7, seed=1, extra_body={"response_format": {"type": "json_object"}})
    assert isinstance(json.loads(out.choices[0].text), dict)


def test_vllm_structured_outputs_and_guided_fields(client, model_name):
    out = client.completions.create(model=model_name, prompt="Phone:", max_tokens=20, temperature=0.5, seed=2,
                                    extra_body={"structured_outputs": {"regex": r"\+1-[0-9]{3}-[0-9]{4}"}})
    assert re.fullmatch(r"\+1-[0-9]{3}-[0-9]{4}", out.choices[0].text)
    out = client.chat.completions.create(model=model_name, messages=[{"role": "user", "content": "Yes or no?"}],
                                         max_tokens=5, temperature=0.5, seed=3,
                                         extra_body={"guided_choice": ["yes", "no"]})
    assert out.choices[0].message.content in ("yes", "no")
    out = client.completions.create(model=model_name, prompt="Data:", max_tokens=60, temperature=0,
                                    extra_body={"guided_json": SCHEMA})
    jsonschema.validate(json.loads(out.choices[0].text), SCHEMA)


WEATHER_TAG = {"triggers": ["<function="], "structures": [{
    "begin": "<function=get_weather>", "end": "</function>",
    "schema": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"]}}]}
FEW_SHOT = ('Weather tool calls.\nUser: weather in Paris?\nAssistant: <function=get_weather>{"city": "Paris"}'
            '</function>\nUser: weather in London?\nAssistant:')


def test_how_json_is_written_and_structural_tags(client, model_name):
    out = client.chat.completions.create(model=model_name, messages=ASK, max_tokens=80, temperature=0, extra_body={
        "structured_outputs": {"json": SCHEMA, "disable_any_whitespace": True}})
    text = out.choices[0].message.content
    assert text == json.dumps(json.loads(text), separators=(",", ":"), ensure_ascii=False), text
    out = client.completions.create(model=model_name, prompt="Data:", max_tokens=60, temperature=0, extra_body={
        "guided_json": SCHEMA, "guided_whitespace_pattern": "[ ]"})
    assert "\n" not in out.choices[0].text and "  " not in out.choices[0].text, out.choices[0].text
    jsonschema.validate(json.loads(out.choices[0].text), SCHEMA)
    # vLLM's three ways of asking for a structural tag: each gives the same call.
    calls = []
    for body in ({"response_format": {"type": "structural_tag", **WEATHER_TAG}},
                 {"structured_outputs": {"structural_tag": json.dumps({"type": "structural_tag", **WEATHER_TAG}),
                                         "disable_any_whitespace": True}},
                 {"structural_tag": {"type": "structural_tag", **WEATHER_TAG}}):
        out = client.completions.create(model=model_name, prompt=FEW_SHOT, max_tokens=40, temperature=0,
                                        extra_body=body)
        call = re.search(r"<function=get_weather>(.*?)</function>", out.choices[0].text, re.S)
        assert call is not None, out.choices[0].text
        calls.append(json.loads(call.group(1)))
    assert calls == [{"city": "London"}] * 3


@pytest.mark.parametrize("body, param", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}}},
     "response_format.json_schema.schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "array", "uniqueItems": True}}}}, "response_format.json_schema.schema"),
    ({"response_format": {"type": "json_schema"}}, "response_format"),
    ({"structured_outputs": {"regex": "a(b"}}, "structured_outputs"),
    ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs"),
    ({"guided_grammar": "start: 'a' | x"}, "guided_grammar"),
    ({"guided_json": {"type": "object"}, "guided_regex": "a"}, "guided_regex"),
    ({"response_format": {"type": "yaml"}}, "response_format.type"),
    ({"response_format": {"type": "structural_tag", "triggers": ["<f"]}}, "response_format"),
    ({"response_format": {"type": "json_object", **WEATHER_TAG}}, "response_format"),
    ({"response_format": {"type": "structural_tag", "triggers": ["<tool>"], "structures": WEATHER_TAG["structures"]}},
     "response_format"),
    ({"structured_outputs": {"regex": "a+", "disable_any_whitespace": True}}, "structured_outputs"),
    ({"structured_outputs": {"json": SCHEMA, "whitespace_pattern": " ", "disable_any_whitespace": True}},
     "structured_outputs"),
    ({"guided_regex": "a+", "guided_whitespace_pattern": " *"}, "guided_whitespace_pattern"),
    ({"structural_tag": {"type": "structural_tag", **WEATHER_TAG}, "guided_json": SCHEMA}, "structural_tag"),
])
def test_bad_constraints_are_400s_naming_the_field(client, model_name, body, param):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=model_name, messages=ASK, max_tokens=5, extra_body=body)
    assert err.value.body["param"] == param, err.value.body


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("body, param", [
    # SmolLM2's vocabulary has no token holding the byte 0xF2 that begins U+80706 in UTF-8.
    ({"structured_outputs": {"choice": ["H2\U00080706", "x"]}}, "structured_outputs"),  # refused at once
    ({"guided_regex": "H\U00080706"}, "guided_regex"),  # found while generating
    ({"structured_outputs": {"regex": "(\U00080706|\U00040000)"}}, "structured_outputs"),
])
def test_a_constraint_the_model_cannot_spell_is_a_400_naming_the_field(client, model_name, body, param, stream):
    if not stream:
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(model=model_name, messages=ASK, max_tokens=8, extra_body=body)
        assert err.value.body["param"] == param and "vocabulary" in err.value.body["message"], err.value.body
        return
    try:
        chunks = list(client.chat.completions.create(model=model_name, messages=ASK, max_tokens=8, extra_body=body,
                                                     stream=True))
    except openai.BadRequestError as err:  # refused before the stream started
        assert err.body["param"] == param, err.body
        return
    except openai.APIError as err:  # the stream's error event
        assert err.body["param"] == param and "vocabulary" in err.body["message"], err.body
        return
    raise AssertionError(f"the stream ended without an error: {chunks}")
