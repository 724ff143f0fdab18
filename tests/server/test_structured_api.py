"""Structured output through the server and the official openai client: response_format (json_object
and json_schema, streamed or not), vLLM's structured_outputs and the older guided_* fields, each
output valid; the 400s name the field that was wrong, before anything is admitted."""

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
