"""IncrementalDetokenizer alone (SmolLM2's tokenizer): text equal to a one-shot decode whatever
the token grouping, no broken UTF-8 character ever shown, stop strings matched across token
boundaries and held back while they could still complete, stop strings only from the
(min_tokens + 1)-th token, and a stop token's (or EOS's) text left out unless
include_stop_str_in_output."""

from __future__ import annotations

import pytest

from corellm.engine.detokenizer import IncrementalDetokenizer
from corellm.model.gguf_file import GGUFModelFile
from corellm.model.loader import default_model_path
from corellm.sampling_params import SamplingParams


@pytest.fixture(scope="module")
def tok():
    return GGUFModelFile(default_model_path()).tokenizer()


def detok(tok, prompt="Text:", **params) -> IncrementalDetokenizer:
    return IncrementalDetokenizer(tok, SamplingParams(**params), tok.encode(prompt))


@pytest.mark.parametrize("group", [1, 2, 5])
def test_text_equals_a_one_shot_decode_and_never_shows_half_a_character(tok, group):
    text = " Emoji 🎉🔥 日本語 café — fin."
    ids = tok.encode(text, add_special_tokens=False)
    d = detok(tok)
    shown = []
    for i in range(0, len(ids), group):
        d.update(ids[i:i + group])
        shown.append(d.text(finished=False))
        assert "\ufffd" not in shown[-1]  # a multi-byte character waits until all its bytes arrive
    assert d.text(finished=True) == tok.decode(ids)
    assert all(text.startswith(s) for s in shown)


def test_a_stop_string_across_tokens_is_held_back_then_cut(tok):
    ids = tok.encode(" one two three four", add_special_tokens=False)
    d = detok(tok, stop=["three f"])
    for i, t in enumerate(ids):
        stop = d.update([t])
        if stop is None:
            assert "three" not in d.text(finished=False)  # it could still become the stop string
    assert stop == "three f" and d.text(finished=True) == " one two "
    inc = detok(tok, stop=["three f"], include_stop_str_in_output=True)
    inc.update(ids)
    assert inc.text(finished=True) == " one two three f"


def test_stop_strings_wait_for_min_tokens(tok):
    ids = tok.encode(" a b a b a b", add_special_tokens=False)  # " a" and " b" are one token each
    assert len(ids) == 6
    d = detok(tok, stop=[" b"], min_tokens=3, max_tokens=16)
    assert [d.update([t]) for t in ids[:3]] == [None, None, None]  # tokens 1-3: not checked
    assert d.update([ids[3]]) == " b"  # the 4th token is the first checked
    assert d.text(finished=True) == " a b a"


@pytest.mark.parametrize("include", [False, True])
def test_a_stop_token_or_eos_leaves_its_text_out(tok, include):
    ids = tok.encode(" red green blue", add_special_tokens=False)
    d = detok(tok, stop_token_ids=[ids[-1]], include_stop_str_in_output=include)
    d.update(ids[:-1])
    d.update(ids[-1:], stop_terminated=True)
    assert d.text(finished=True) == (" red green blue" if include else " red green")
    eos = tok.eos_token_id
    e = detok(tok, skip_special_tokens=False, include_stop_str_in_output=include)
    e.update(ids + [eos], stop_terminated=True)
    assert e.text(finished=True) == " red green blue" + (tok.decode([eos], skip_special_tokens=False) if include else "")
