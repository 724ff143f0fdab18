"""Structured output through the offline API (SmolLM2, bf16): every output constrained by a JSON
schema of the corpus validates with `jsonschema` and ends with "stop"; regex, choice and grammars
(Lark and GBNF) hold; in a mixed batch the constrained rows are valid while the unconstrained
ones stay bit-identical to their solo runs; a grammar that cannot finish within max_tokens ends
with "length"; bad specs are ValueErrors naming the field; a request aborted while its grammar
compiles leaves nothing behind."""

from __future__ import annotations

import concurrent.futures
import json
import re

import jsonschema
import pytest

from corellm import LLM, SamplingParams, StructuredOutputsParams
from corellm.model import load_model

# Bounded schemas (string lengths, array sizes, number ranges): every valid output is short, so
# each request must end on the grammar's own end, with "stop".
NAME = {"type": "string", "minLength": 1, "maxLength": 24}
SCHEMAS = {
    "nested objects": {"type": "object", "properties": {
        "name": NAME, "address": {"type": "object", "properties": {"city": NAME, "zip": {
            "type": "string", "pattern": "^[0-9]{5}$"}}, "required": ["city", "zip"], "additionalProperties": False}},
        "required": ["name", "address"], "additionalProperties": False},
    "arrays with min/maxItems": {"type": "object", "properties": {
        "tags": {"type": "array", "items": NAME, "minItems": 2, "maxItems": 4}}, "required": ["tags"],
        "additionalProperties": False},
    "enum and const": {"type": "object", "properties": {
        "color": {"enum": ["red", "green", "blue"]}, "version": {"const": 2}},
        "required": ["color", "version"], "additionalProperties": False},
    "anyOf": {"type": "object", "properties": {"id": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 999},
                                                               NAME]}},
              "required": ["id"], "additionalProperties": False},
    "oneOf": {"type": "object", "properties": {"shape": {"oneOf": [
        {"type": "object", "properties": {"radius": {"type": "integer", "minimum": 1, "maximum": 99}},
         "required": ["radius"], "additionalProperties": False},
        {"type": "object", "properties": {"side": {"type": "integer", "minimum": 1, "maximum": 99}},
         "required": ["side"], "additionalProperties": False}]}}, "required": ["shape"], "additionalProperties": False},
    "$ref and $defs": {"$defs": {"person": {"type": "object", "properties": {"name": NAME, "age": {
        "type": "integer", "minimum": 0, "maximum": 120}}, "required": ["name", "age"], "additionalProperties": False}},
        "type": "object", "properties": {"author": {"$ref": "#/$defs/person"}, "editor": {"$ref": "#/$defs/person"}},
        "required": ["author", "editor"], "additionalProperties": False},
    "patterns and number ranges": {"type": "object", "properties": {
        "code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"},
        "score": {"type": "integer", "minimum": -5, "maximum": 5},
        "ratio": {"type": "number", "minimum": 0, "maximum": 1, "multipleOf": 0.25}},
        "required": ["code", "score", "ratio"], "additionalProperties": False},
}


@pytest.fixture(scope="module")
def llm():
    return LLM(loaded_model=load_model(None, progress=False), max_model_len=1024, kv_cache_memory=128 * 1024**2)


def constrained(**spec) -> StructuredOutputsParams:
    return StructuredOutputsParams(**spec)


@pytest.mark.parametrize("name", list(SCHEMAS))
def test_every_output_of_the_schema_corpus_validates(llm, name):
    schema = SCHEMAS[name]
    prompt = [{"role": "user", "content": f"Reply with JSON matching this schema: {json.dumps(schema)}"}]
    params = [SamplingParams(temperature=0.8, seed=seed, max_tokens=300, structured_outputs=constrained(json=schema))
              for seed in range(3)]
    outs = llm.chat([prompt] * 3, params, use_tqdm=False)
    for out in outs:
        c = out.outputs[0]
        assert c.finish_reason == "stop", (c.finish_reason, c.text)
        jsonschema.validate(json.loads(c.text), schema)


def test_json_object_regex_choice_and_grammars(llm):
    specs = {
        "json_object": (constrained(json_object=True), lambda t: isinstance(json.loads(t), dict)),
        "regex": (constrained(regex=r"[0-9]{3}-[0-9]{4}"), lambda t: re.fullmatch(r"[0-9]{3}-[0-9]{4}", t)),
        "choice": (constrained(choice=["yes", "no", "maybe later"]), lambda t: t in ("yes", "no", "maybe later")),
        "lark": (constrained(grammar='start: "(" NUM (" + " NUM)* ")"\nNUM: /[1-9][0-9]?/'),
                 lambda t: re.fullmatch(r"\([1-9][0-9]?( \+ [1-9][0-9]?)*\)", t)),
        "gbnf": (constrained(grammar='root ::= "Answer: " ("A" | "B" | "C")'),
                 lambda t: t in ("Answer: A", "Answer: B", "Answer: C")),
    }
    names = list(specs)
    outs = llm.generate(["Write something:"] * len(names),
                        [SamplingParams(temperature=0.7, seed=i, max_tokens=60, structured_outputs=specs[n][0])
                         for i, n in enumerate(names)], use_tqdm=False)
    for name, out in zip(names, outs):
        c = out.outputs[0]
        assert c.finish_reason == "stop" and specs[name][1](c.text), (name, c.text)


def test_json_written_compactly_and_a_structural_tag_in_running_text(llm):
    ask = [{"role": "user", "content": "Give a JSON object with a name and an age."}]
    person = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                               "age": {"type": "integer", "minimum": 0, "maximum": 120}},
              "required": ["name", "age"]}
    free, compact = llm.chat([ask] * 2, [SamplingParams(temperature=0, max_tokens=60, structured_outputs=constrained(
        json=person, **options)) for options in ({}, {"disable_any_whitespace": True})], use_tqdm=False)
    free, compact = free.outputs[0].text, compact.outputs[0].text
    assert re.search(r"\s", free), free  # the model indents when it may (the test relies on it)
    assert compact == json.dumps(json.loads(compact), separators=(",", ":"), ensure_ascii=False), compact
    jsonschema.validate(json.loads(compact), person)
    # A tool call in the style of Llama 3.1's custom functions: the model writes the tag after a
    # few-shot example; the JSON after it must follow the schema (here: compactly, only "city").
    tag = {"type": "structural_tag", "triggers": ["<function="], "structures": [{
        "begin": "<function=get_weather>", "end": "</function>", "schema": {
            "type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"]}}]}
    prompt = ('Weather tool calls.\nUser: weather in Paris?\nAssistant: <function=get_weather>{"city": "Paris"}'
              '</function>\nUser: weather in London?\nAssistant:')
    # (The stop string ends the reply where the few-shot dialogue would go on: whether the model
    # ends it with its EOS depends on the CPU path's rounding.)
    out = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=40, stop=["\nUser:"], structured_outputs=constrained(
        structural_tag=tag, disable_any_whitespace=True, disable_additional_properties=True)),
                       use_tqdm=False)[0].outputs[0]
    call = re.fullmatch(r"(.*?)<function=get_weather>(.*?)</function>(.*)", out.text, re.S)
    assert call is not None and out.finish_reason == "stop", out.text
    assert json.loads(call.group(2)).keys() == {"city"} and " " not in call.group(2), out.text


def test_a_mixed_batch_keeps_the_free_rows_as_they_run_alone(llm):
    free = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    prompts = ["The capital of France is", "def fibonacci(n):", "Once upon a time"]
    alone = [llm.generate(p, free, use_tqdm=False)[0].outputs[0].token_ids for p in prompts]
    schema = SCHEMAS["enum and const"]
    batch = [free, SamplingParams(temperature=0, max_tokens=64, structured_outputs=constrained(json=schema)),
             free, SamplingParams(temperature=0, max_tokens=8, structured_outputs=constrained(regex="[a-z]+")), free]
    outs = llm.generate([prompts[0], "Colour as JSON:", prompts[1], "A word:", prompts[2]], batch, use_tqdm=False)
    assert [outs[i].outputs[0].token_ids for i in (0, 2, 4)] == alone
    jsonschema.validate(json.loads(outs[1].outputs[0].text), schema)
    assert re.fullmatch("[a-z]+", outs[3].outputs[0].text)


def test_a_grammar_that_cannot_finish_in_max_tokens_ends_with_length(llm):
    out = llm.generate("Digits:", SamplingParams(temperature=0, max_tokens=5, structured_outputs=constrained(
        regex="[0-9]{40}")), use_tqdm=False)[0].outputs[0]
    assert out.finish_reason == "length" and len(out.token_ids) == 5 and out.text.isdigit()


def test_n_samples_each_follow_the_grammar(llm):
    out = llm.generate("Pick:", SamplingParams(n=4, temperature=1.0, seed=3, max_tokens=10,
                                               structured_outputs=constrained(choice=["alpha", "beta", "gamma"])),
                       use_tqdm=False)[0]
    assert len(out.outputs) == 4 and all(c.text in ("alpha", "beta", "gamma") for c in out.outputs)


@pytest.mark.parametrize("spec, message", [
    (dict(json={"type": "array", "uniqueItems": True}), r'structured_outputs.json: Unimplemented keys: \["uniqueItems"\]'),
    (dict(json={"type": "frobnicate"}), "structured_outputs.json: Invalid type"),
    (dict(json={"$ref": "#/$defs/missing"}), "structured_outputs.json: .*does not exist"),
    (dict(regex="a(b"), "(?s)structured_outputs.regex: .*unclosed group"),
    (dict(grammar="start: 'a' | x"), "structured_outputs.grammar"),
])
def test_bad_specs_are_refused_naming_the_field(llm, spec, message):
    with pytest.raises(ValueError, match=message):
        llm.generate("x", SamplingParams(structured_outputs=constrained(**spec)), use_tqdm=False)
    assert not llm.engine_core.has_unfinished_requests()


# SmolLM2's vocabulary has no token holding the byte 0xF2 (nor 0xF1): the UTF-8 characters that
# begin with it (U+80000 to U+BFFFF) cannot be produced by this model.
UNSPELLABLE = "\U00080706"


def test_the_vocabulary_lacks_the_bytes_these_tests_rely_on(llm):
    spelled = llm.engine_core.structured_output.compiler.spelled_bytes
    assert 0xF2 not in spelled and 0xF1 not in spelled and 0xF4 in spelled and ord("a") in spelled


def test_a_choice_the_model_cannot_spell_is_refused_naming_it(llm):
    with pytest.raises(ValueError, match=r"structured_outputs.choice\[1\]: .*cannot spell .*0xf2"):
        llm.generate("x", SamplingParams(structured_outputs=constrained(choice=["ok", "H2" + UNSPELLABLE])),
                     use_tqdm=False)
    assert not llm.engine_core.has_unfinished_requests()


@pytest.mark.parametrize("regex", [
    f"H{UNSPELLABLE}",  # forced: llguidance's fast path tokenizes it, lossily, and allows a wrong token
    f"({UNSPELLABLE}|\U00040000)",  # not forced: no token can continue, only EOS would be allowed
])
def test_a_grammar_the_model_cannot_spell_ends_with_an_error_naming_structured_outputs(llm, regex):
    """Never a 'stop' with an output that does not follow the grammar, and never an engine fault."""
    out = llm.generate("Say H:", SamplingParams(temperature=0, max_tokens=8, structured_outputs=constrained(
        regex=regex)), use_tqdm=False)[0]
    assert out.outputs[0].finish_reason == "error"
    assert out.metrics["error_field"] == "structured_outputs"
    assert out.metrics["error"].startswith("structured_outputs: ") and "vocabulary" in out.metrics["error"]
    assert not llm.engine_core.has_unfinished_requests()
    assert llm.generate("Still serving:", SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)[0].finished


@pytest.mark.parametrize("spec, message", [
    (dict(), "exactly one of json, regex, choice, grammar, json_object or structural_tag"),
    (dict(json={}, regex="a"), "exactly one of"),
    (dict(json="{not json"), "structured_outputs.json is not valid JSON"),
    (dict(choice=[]), "choice must be a non-empty list of strings"),
])
def test_malformed_params_are_refused(spec, message):
    with pytest.raises(ValueError, match=message):
        StructuredOutputsParams(**spec)


def test_abort_while_the_grammar_compiles_leaves_nothing(llm):
    core = llm.engine_core
    manager = core.structured_output
    never: concurrent.futures.Future = concurrent.futures.Future()
    original = manager.compiler.matcher_future
    manager.compiler.matcher_future = lambda spec: never  # a compilation that does not end by itself
    try:
        processed = llm.input_processor.process("slow", "x", SamplingParams(structured_outputs=constrained(regex="z")))
        (sample,) = processed.samples
        core.add_request(sample)
        assert core.has_unfinished_requests() and sample.request_id in manager.awaiting
        free = llm.generate("Still serving:", SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)[0]
        assert free.finished  # the compiling request held nobody up
        core.abort_requests([sample.request_id])
        core.step()
        assert not core.has_unfinished_requests() and not manager.awaiting and never.cancelled()
    finally:
        manager.compiler.matcher_future = original
