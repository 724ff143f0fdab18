"""StructuredOutputManager alone (SmolLM2's tokenizer): the step's bitmask covers exactly the
marked rows whose grammar is awake, and allows what the grammar allows; accepted tokens advance the
matcher (a refused one is an error); a reasoning request's grammar sleeps until the output holds
"</think>"; a compile failure ends only its request."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from corellm.engine_core_request import EngineCoreRequest
from corellm.model.gguf_file import GGUFModelFile
from corellm.model.loader import default_model_path
from corellm.sampling_params import SamplingParams, StructuredOutputsParams
from corellm.structured_output import GrammarCompiler, StructuredOutputManager


@dataclass
class Plan:  # the two SchedulerOutput fields the manager reads
    req_ids: list[str]
    uses_grammar: np.ndarray


@pytest.fixture(scope="module")
def tok():
    return GGUFModelFile(default_model_path()).tokenizer()


@pytest.fixture
def manager(tok):
    m = StructuredOutputManager(GrammarCompiler(tok, 49152, [tok.eos_token_id]), overlap=True)
    yield m
    m.shutdown()


def request(req_id: str, spec: StructuredOutputsParams, after: str | None = None) -> EngineCoreRequest:
    return EngineCoreRequest(req_id, [1, 2], SamplingParams(structured_outputs=spec), 2, [], 0.0, 0,
                             grammar_key=spec.key(), grammar_starts_after=after)


def allowed(bitmask_row: np.ndarray) -> set[int]:
    bits = np.unpackbits(bitmask_row.view(np.uint8), bitorder="little")
    return set(np.flatnonzero(bits).tolist())


def admit(manager, *requests):
    for r in requests:
        manager.add(r)
    ready = []
    while len(ready) < len(requests):
        ready += manager.ready(timeout=1.0)
    assert all(error is None for _, error, _ in ready)


def test_the_bitmask_covers_the_awake_marked_rows(manager, tok):
    digits = StructuredOutputsParams(regex="[0-9]{2}")
    admit(manager, request("a", digits), request("b", StructuredOutputsParams(choice=["yes", "no"])))
    plan = Plan(["free", "a", "b"], np.array([False, True, True]))
    out = manager.start_bitmask(plan).result()
    assert out.bitmask_rows.tolist() == [-1, 0, 1] and out.bitmask.shape == (2, 49152 // 32)
    for t in allowed(out.bitmask[0]):
        assert tok.decode([t]).isdigit()
    assert tok.encode("yes", add_special_tokens=False)[0] in allowed(out.bitmask[1])
    assert manager.accept("a", tok.encode("4", add_special_tokens=False)[0]) is None
    error = manager.accept("a", tok.encode("x", add_special_tokens=False)[0])
    assert error is not None and error.startswith("structured_outputs: the output cannot follow the grammar")
    assert manager.start_bitmask(Plan(["free"], np.array([False]))) is None


def test_a_reasoning_requests_grammar_sleeps_until_the_reasoning_ends(manager, tok):
    admit(manager, request("r", StructuredOutputsParams(choice=["A", "B"]), after="</think>"))
    plan = Plan(["r"], np.array([True]))
    assert manager.start_bitmask(plan) is None  # asleep: the row samples freely
    for t in tok.encode("Let me think. </think>", add_special_tokens=False):
        assert manager.accept("r", t) is None  # no grammar checks the reasoning
    out = manager.start_bitmask(plan).result()
    assert out.bitmask_rows.tolist() == [0]
    assert {tok.decode([t]) for t in allowed(out.bitmask[0])} == {"A", "B"}


def test_a_grammar_that_fails_to_compile_ends_only_its_request(manager):
    import concurrent.futures

    failed: concurrent.futures.Future = concurrent.futures.Future()
    failed.set_exception(ValueError("structured_outputs.regex: boom"))
    original = manager.compiler.matcher_future
    manager.compiler.matcher_future = lambda spec: failed
    try:
        manager.add(request("bad", StructuredOutputsParams(regex="x")))
    finally:
        manager.compiler.matcher_future = original
    manager.add(request("good", StructuredOutputsParams(regex="y")))
    ready = []
    while len(ready) < 2:
        ready += manager.ready(timeout=1.0)
    # A compile error is the spec's fault (its message names the field), unlike an engine fault.
    assert sorted((r.request_id, e, spec_at_fault) for r, e, spec_at_fault in ready) == [
        ("bad", "structured_outputs.regex: boom", True), ("good", None, False)]
    assert "good" in manager.matchers and "bad" not in manager.matchers
