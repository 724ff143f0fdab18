"""The offline API as a vLLM user would try it: prompts as strings or token ids, order, n > 1,
stop strings and stop tokens, ignore_eos, logprobs and prompt_logprobs, seeds, chat, errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from corellm import LLM, SamplingParams, TextPrompt, TokensPrompt
from tests.engine.test_tiny_oracle import write_tokenizer
from tests.model.tiny_models import make_tiny_model


@pytest.fixture(scope="module")
def llm():
    return LLM(max_model_len=512, kv_cache_memory=256 * 1024**2, max_num_seqs=32)


GREEDY = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)


def test_outputs_follow_input_order_and_prompt_forms(llm):
    tok = llm.get_tokenizer()
    prompts = ["The capital of France is", {"prompt_token_ids": tok.encode("def add(a, b):")}, "1, 2, 3,"]
    outs = llm.generate(prompts, GREEDY, use_tqdm=False)
    assert [o.prompt for o in outs] == ["The capital of France is", None, "1, 2, 3,"]
    assert outs[1].prompt_token_ids == tok.encode("def add(a, b):")
    for o in outs:
        c = o.outputs[0]
        assert o.finished and c.finish_reason == "length" and len(c.token_ids) == 16
        assert c.text == tok.decode(c.token_ids)
    alone = llm.generate(prompts[2], GREEDY, use_tqdm=False)[0]
    assert alone.outputs[0].token_ids == outs[2].outputs[0].token_ids


def test_typed_prompts_and_their_cache_salt(llm):
    """vLLM's TextPrompt / TokensPrompt forms; a prompt's cache_salt keeps its blocks from prompts
    with another salt (or none), as a request body's does on the server."""
    tok = llm.get_tokenizer()
    text = "A long shared preamble about the history of the city of Lyon, " * 6
    ids = tok.encode(text)
    first = llm.generate(TextPrompt(prompt=text), GREEDY, use_tqdm=False)[0]
    again = llm.generate(TokensPrompt(prompt_token_ids=ids, prompt=text), GREEDY, use_tqdm=False)[0]
    assert again.prompt == text and again.prompt_token_ids == first.prompt_token_ids == ids
    assert again.outputs[0].token_ids == first.outputs[0].token_ids
    assert again.num_cached_tokens >= 32  # the unsalted prompt's blocks
    salted = llm.generate(TextPrompt(prompt=text, cache_salt="tenant-a"), GREEDY, use_tqdm=False)[0]
    assert salted.num_cached_tokens == 0 and salted.outputs[0].token_ids == first.outputs[0].token_ids
    same_salt = llm.generate(TokensPrompt(prompt_token_ids=ids, cache_salt="tenant-a"), GREEDY, use_tqdm=False)[0]
    assert same_salt.num_cached_tokens >= 32


def test_per_prompt_sampling_params(llm):
    outs = llm.generate(["a", "b"], [SamplingParams(max_tokens=3, ignore_eos=True, temperature=0),
                                     SamplingParams(max_tokens=5, ignore_eos=True, temperature=0)], use_tqdm=False)
    assert [len(o.outputs[0].token_ids) for o in outs] == [3, 5]
    with pytest.raises(ValueError, match="got 1 sampling params for 2 prompts"):
        llm.generate(["a", "b"], [GREEDY], use_tqdm=False)


def test_n_samples(llm):
    out = llm.generate("Tell me a story:", SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=10, ignore_eos=True),
                       use_tqdm=False)[0]
    assert [c.index for c in out.outputs] == [0, 1, 2]
    assert all(c.finish_reason == "length" for c in out.outputs)
    assert len({tuple(c.token_ids) for c in out.outputs}) > 1


def test_seeded_sampling_reproduces_alone_and_in_a_batch(llm):
    p = SamplingParams(temperature=0.9, top_p=0.95, seed=1234, max_tokens=20, ignore_eos=True)
    alone = llm.generate("Write a poem about the sea:", p, use_tqdm=False)[0].outputs[0].token_ids
    assert llm.generate("Write a poem about the sea:", p, use_tqdm=False)[0].outputs[0].token_ids == alone
    # Across batch compositions in fp32 (bf16 logits round to ~0.06 at |logit| ~ 15, so a batch's
    # different GEMM blocking may move a draw across a boundary; fp32 does not).
    fp32 = LLM(dtype="float32", max_model_len=256, kv_cache_memory=64 * 1024**2)
    alone = fp32.generate("Write a poem about the sea:", p, use_tqdm=False)[0].outputs[0].token_ids
    batch = fp32.generate(["x", "Write a poem about the sea:", "y"],
                          [SamplingParams(temperature=1.0, max_tokens=7), p, GREEDY], use_tqdm=False)
    assert batch[1].outputs[0].token_ids == alone


def test_stop_strings_and_tokens(llm):
    base = llm.generate("1, 2, 3, 4, 5,", GREEDY, use_tqdm=False)[0].outputs[0]
    assert "8" in base.text
    out = llm.generate("1, 2, 3, 4, 5,", SamplingParams(temperature=0, max_tokens=16, stop=["8"]),
                       use_tqdm=False)[0].outputs[0]
    assert out.finish_reason == "stop" and out.stop_reason == "8"
    assert out.text == base.text[: base.text.index("8")]
    inc = llm.generate("1, 2, 3, 4, 5,", SamplingParams(temperature=0, max_tokens=16, stop=["8"],
                                                        include_stop_str_in_output=True), use_tqdm=False)[0].outputs[0]
    assert inc.text == base.text[: base.text.index("8") + 1]
    stop_tok = base.token_ids[3]
    out = llm.generate("1, 2, 3, 4, 5,", SamplingParams(temperature=0, max_tokens=16, stop_token_ids=[stop_tok]),
                       use_tqdm=False)[0].outputs[0]
    assert out.finish_reason == "stop" and out.stop_reason == stop_tok
    assert out.token_ids == base.token_ids[: base.token_ids.index(stop_tok) + 1]
    tok = llm.get_tokenizer()
    assert out.text == tok.decode(out.token_ids[:-1])  # the stop token's text is left out (vLLM)
    inc = llm.generate("1, 2, 3, 4, 5,", SamplingParams(temperature=0, max_tokens=16, stop_token_ids=[stop_tok],
                                                        include_stop_str_in_output=True), use_tqdm=False)[0].outputs[0]
    assert inc.text == tok.decode(inc.token_ids)


def ends_in_repetition(outputs: list[int], max_size: int, min_size: int, count: int) -> bool:
    """The rule stated plainly (vLLM's): the output ends with `count` copies of its last L tokens
    for some L in [max(min_size, 1), max_size]."""
    return any(len(outputs) >= size * count and outputs[-size * count:] == outputs[-size:] * count
               for size in range(max(min_size, 1), max_size + 1))


@pytest.mark.parametrize("prompt, rule", [
    ("1, 2, 1, 2, 1, 2,", {"max_pattern_size": 16, "min_count": 3}),
    ("List the numbers: 7 7 7 7", {"max_pattern_size": 4, "min_pattern_size": 2, "min_count": 2}),
    ("List the numbers: 7 7 7 7", {"max_pattern_size": 2, "min_count": 4}),  # the prompt's own " 7"s do not count
])
def test_repetition_detection_ends_a_looping_output_where_the_rule_first_holds(llm, prompt, rule):
    greedy = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)
    base = llm.generate(prompt, greedy, use_tqdm=False)[0].outputs[0].token_ids
    sizes = (rule["max_pattern_size"], rule.get("min_pattern_size", 0), rule["min_count"])
    for min_tokens in (0, 8):
        expected = next(i for i in range(max(min_tokens, 1), len(base) + 1) if ends_in_repetition(base[:i], *sizes))
        params = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True, min_tokens=min_tokens,
                                repetition_detection=rule)
        out = llm.generate(prompt, params, use_tqdm=False)[0].outputs[0]
        assert out.token_ids == base[:expected] and expected < 64, (out.token_ids, base)
        assert out.finish_reason == "repetition" and out.stop_reason == "repetition_detected"
    off = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=64, ignore_eos=True,
                                              repetition_detection={"max_pattern_size": 0}), use_tqdm=False)[0]
    assert off.outputs[0].token_ids == base and off.outputs[0].finish_reason == "length"


def test_stop_strings_wait_for_min_tokens(llm):
    base = llm.generate("1, 2, 3, 4, 5,", GREEDY, use_tqdm=False)[0].outputs[0]
    tok = llm.get_tokenizer()
    first_eight = next(i for i in range(len(base.token_ids)) if "8" in tok.decode(base.token_ids[: i + 1]))
    out = llm.generate("1, 2, 3, 4, 5,", SamplingParams(temperature=0, max_tokens=16, stop=["8"],
                                                        min_tokens=first_eight + 1), use_tqdm=False)[0].outputs[0]
    # The first "8" came within min_tokens: not a stop; the text runs on (to a later "8", or the end).
    assert len(out.token_ids) > first_eight + 1
    assert out.text.startswith(tok.decode(base.token_ids[: first_eight + 1]))


def test_eos_stops_unless_ignored(llm):
    # EOS is made certain with a logit bias: the model's own greedy reply to a chat prompt runs into
    # near-ties, and its length differs between the CPU paths (amx / avx512bf16 / avx2).
    eos = llm.get_tokenizer().eos_token_id
    hello = [{"role": "user", "content": "Say hello."}]

    def reply(**params):
        return llm.chat(hello, SamplingParams(temperature=0, logit_bias={eos: 100.0}, **params),
                        use_tqdm=False)[0].outputs[0]

    chat = reply(max_tokens=64, min_tokens=4)
    assert chat.finish_reason == "stop" and len(chat.token_ids) == 5 and chat.token_ids[-1] == eos
    assert "<|im_end|>" not in chat.text
    ignored = reply(max_tokens=12, min_tokens=4, ignore_eos=True)
    assert ignored.finish_reason == "length" and len(ignored.token_ids) == 12
    min_tok = reply(max_tokens=64, min_tokens=9)
    assert min_tok.finish_reason == "stop" and len(min_tok.token_ids) == 10 and eos not in min_tok.token_ids[:9]


def test_logprobs_shapes(llm):
    out = llm.generate("Hello", SamplingParams(temperature=0, max_tokens=6, logprobs=3, ignore_eos=True),
                       use_tqdm=False)[0].outputs[0]
    assert len(out.logprobs) == 6
    total = 0.0
    for tid, pos in zip(out.token_ids, out.logprobs):
        assert tid in pos and len(pos) >= 3
        assert pos[tid].rank == 1  # greedy picks the top token
        total += pos[tid].logprob
        assert all(lp.decoded_token is not None for lp in pos.values())
    assert abs(out.cumulative_logprob - total) < 1e-4
    none = llm.generate("Hello", GREEDY, use_tqdm=False)[0].outputs[0]
    assert none.logprobs is None and none.cumulative_logprob is None


def test_logprob_token_ids_score_the_named_tokens_at_each_position(llm):
    """Oracles: the top-20 of the same greedy run (same kernel arithmetic: equal values and ranks),
    and for a token far down the list, the prompt logprob of that token after the same context (a
    row's logits do not depend on the step's other rows, so the two are equal)."""
    tok = llm.get_tokenizer()
    named = [tok.encode(w, add_special_tokens=False)[0] for w in (" Paris", " London", " the", " banana")]
    prompt = "The capital of France is"
    out = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=4, logprob_token_ids=named + named[:1]),
                       use_tqdm=False)[0].outputs[0]
    top = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=4, logprobs=20), use_tqdm=False)[0].outputs[0]
    assert out.token_ids == top.token_ids and out.cumulative_logprob == top.cumulative_logprob
    context = tok.encode(prompt)
    for j, (token, pos, top_pos) in enumerate(zip(out.token_ids, out.logprobs, top.logprobs)):
        assert set(pos) == set(named) | {token}  # the named tokens (once each) and the chosen one
        assert pos[token].logprob == top_pos[token].logprob and pos[token].rank == top_pos[token].rank
        for t in named:
            if t in top_pos:
                assert (pos[t].logprob, pos[t].rank) == (top_pos[t].logprob, top_pos[t].rank)
        far = named[-1]  # " banana": thousands of ranks down
        assert pos[far].rank > 20
        scored = llm.generate({"prompt_token_ids": context + out.token_ids[:j] + [far]},
                              SamplingParams(max_tokens=1, prompt_logprobs=0), use_tqdm=False)[0].prompt_logprobs[-1]
        assert (scored[far].logprob, scored[far].rank) == (pos[far].logprob, pos[far].rank)  # batch-invariant rows
    with pytest.raises(ValueError, match=r"logprob_token_ids has token id 999999 outside the vocabulary"):
        llm.generate(prompt, SamplingParams(max_tokens=2, logprob_token_ids=[999999]), use_tqdm=False)


def test_max_tokens_defaults_to_the_context_left(llm):
    small = LLM(loaded_model=llm.loaded, max_model_len=40, kv_cache_memory=64 * 1024**2)
    prompt = small.get_tokenizer().encode("One two three four five")
    out = small.generate({"prompt_token_ids": prompt}, SamplingParams(temperature=0, max_tokens=None, ignore_eos=True),
                         use_tqdm=False)[0].outputs[0]
    assert len(out.token_ids) == 40 - len(prompt) and out.finish_reason == "length"
    with pytest.raises(ValueError, match=r"The prompt \(total length 45\) is too long to fit into the model "
                                         r"\(context length 40\)"):
        small.generate({"prompt_token_ids": [1] * 45}, GREEDY, use_tqdm=False)


@pytest.mark.parametrize("kwargs, message", [
    ({"n": 0}, "n must be at least 1, got 0"),
    ({"temperature": -1.0}, "temperature must be non-negative"),
    ({"top_p": 1.5}, r"top_p must be in \(0, 1\]"),
    ({"top_k": -5}, "top_k must be 0 or -1"),
    ({"max_tokens": 0}, r"max_tokens must be in \[1, 2\*\*31\)"),
    ({"top_k": 2**40}, "top_k must be 0 or -1"),
    ({"min_tokens": 5, "max_tokens": 2}, "min_tokens must be less than or equal to max_tokens"),
    ({"logprobs": -1}, "logprobs must be non-negative"),
    ({"stop": [""]}, "stop must be a list of non-empty strings"),
    ({"repetition_penalty": 0.0}, r"repetition_penalty must be in \(0, 2\]"),
    ({"temperature": float("nan")}, "temperature must be a finite number"),
    ({"repetition_detection": {"max_pattern_size": 4, "min_count": 1}},
     "repetition_detection.min_count must be at least 2"),
    ({"repetition_detection": {"max_pattern_size": 2, "min_pattern_size": 3, "min_count": 2}},
     r"repetition_detection.min_pattern_size \(3\) must not exceed max_pattern_size \(2\)"),
    ({"repetition_detection": {"max_pattern_size": -1}}, r"repetition_detection.max_pattern_size must be an integer"),
    ({"repetition_detection": {"max_size": 4}}, "repetition_detection has no field 'max_size'"),
    ({"repetition_detection": (4, 1, 2)}, "repetition_detection must be a RepetitionDetectionParams"),
    ({"logprob_token_ids": [5], "logprobs": 2}, "give logprobs .* or logprob_token_ids .*, not both"),
    ({"logprob_token_ids": []}, "logprob_token_ids must be a non-empty list of token ids"),
    ({"logprob_token_ids": [-3]}, "logprob_token_ids must be a non-empty list of token ids"),
])
def test_invalid_sampling_params(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


def test_invalid_prompts(llm):
    with pytest.raises(ValueError, match="outside the vocabulary"):
        llm.generate({"prompt_token_ids": [1, 10**6]}, GREEDY, use_tqdm=False)
    with pytest.raises(ValueError, match="must be a string, a TextPrompt"):
        llm.generate([42], GREEDY, use_tqdm=False)
    with pytest.raises(ValueError, match="a prompt has no key 'prompt_ids'"):  # a typo is not dropped
        llm.generate({"prompt_ids": [1, 2]}, GREEDY, use_tqdm=False)
    with pytest.raises(ValueError, match="'mm_processor_kwargs' is not supported"):
        llm.generate({"prompt": "x", "mm_processor_kwargs": {"num_crops": 4}}, GREEDY, use_tqdm=False)
    with pytest.raises(ValueError, match="cache_salt must be a non-empty string"):
        llm.generate({"prompt": "x", "cache_salt": 7}, GREEDY, use_tqdm=False)
    with pytest.raises(ValueError, match="logit_bias has token id"):
        llm.generate("x", SamplingParams(logit_bias={10**6: 1.0}), use_tqdm=False)
    # Nothing half-added: the engine is idle and still serves.
    assert not llm.engine_core.has_unfinished_requests()
    assert llm.generate("ok", GREEDY, use_tqdm=False)[0].finished


def test_prompt_logprobs_and_generation_config_defaults(tmp_path):
    hf = make_tiny_model("llama3", tmp_path, seed=2)
    write_tokenizer(tmp_path)
    (tmp_path / "generation_config.json").write_text(json.dumps({"temperature": 0.0, "top_p": 0.5, "eos_token_id": [2, 5]}))
    llm = LLM(str(tmp_path), dtype="float32", max_model_len=128, kv_cache_memory=32 * 1024**2)
    defaults = llm.get_default_sampling_params()
    assert defaults.temperature == 0.0 and defaults.top_p == 0.5
    prompt = list(range(7, 47))
    out = llm.generate({"prompt_token_ids": prompt}, SamplingParams(max_tokens=2, prompt_logprobs=2, temperature=0,
                                                                    ignore_eos=True), use_tqdm=False)[0]
    with torch.no_grad():
        lp = torch.log_softmax(hf(torch.tensor([prompt])).logits[0].double(), -1)
    assert out.prompt_logprobs[0] is None and len(out.prompt_logprobs) == len(prompt)
    for p in range(1, len(prompt)):
        assert abs(out.prompt_logprobs[p][prompt[p]].logprob - float(lp[p - 1, prompt[p]])) < 1e-4
    # Extra EOS ids from generation_config stop generation (unless ignore_eos).
    assert llm.get_tokenizer().eos_token_id == 2
    assert llm.input_processor.stop_token_ids(SamplingParams()) == [5]
    assert llm.input_processor.stop_token_ids(SamplingParams(ignore_eos=True)) == []


def test_generation_config_vllm_a_folder_and_overrides(tmp_path):
    """vLLM's generation_config: "vllm" drops the model's sampling defaults (its extra EOS stays), a
    folder's generation_config.json replaces the model's (its EOS too), and overrides are set over
    either; a default that is no sampling field, a non-number or a folder without the file is a
    ValueError naming it, before the model loads."""
    make_tiny_model("llama3", tmp_path / "model", seed=2)
    write_tokenizer(tmp_path / "model")
    (tmp_path / "model" / "generation_config.json").write_text(
        json.dumps({"temperature": 0.6, "top_p": 0.9, "eos_token_id": [2, 5]}))
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "generation_config.json").write_text(json.dumps({"top_k": 20, "eos_token_id": 7}))
    common = dict(dtype="float32", max_model_len=64, kv_cache_memory=8 * 1024**2)
    model = str(tmp_path / "model")

    plain = LLM(model, generation_config="vllm", **common)
    defaults = plain.get_default_sampling_params()
    assert (defaults.temperature, defaults.top_p) == (SamplingParams().temperature, SamplingParams().top_p)
    assert plain.input_processor.stop_token_ids(SamplingParams()) == [5]
    del plain
    folder = LLM(model, generation_config=str(tmp_path / "other"), override_generation_config={"temperature": 0.25},
                 **common)
    defaults = folder.get_default_sampling_params()
    assert (defaults.top_k, defaults.temperature, defaults.top_p) == (20, 0.25, SamplingParams().top_p)
    assert folder.input_processor.stop_token_ids(SamplingParams()) == [7]
    del folder

    for kwargs, message in [({"override_generation_config": {"max_tokens": 9}}, "'max_tokens' is not a sampling default"),
                            ({"override_generation_config": {"top_p": "0.5"}}, "top_p must be a number"),
                            ({"override_generation_config": {"temperature": -1}}, "override_generation_config: temp"),
                            ({"generation_config": str(tmp_path)}, "a folder holding a generation_config.json")]:
        with pytest.raises(ValueError, match=message):
            LLM(model, **kwargs, **common)


def test_cli_generate():
    r = subprocess.run([sys.executable, "-m", "corellm.cli", "generate", "The capital of France is", "--max-tokens", "8"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("The capital of France is") and "Paris" in r.stdout


def test_chat_continues_the_final_message_and_passes_template_variables(llm):
    conv = [{"role": "user", "content": "Name a fruit."}, {"role": "assistant", "content": "The fruit is"}]
    out = llm.chat(conv, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True), use_tqdm=False,
                   add_generation_prompt=False, continue_final_message=True)[0]
    assert out.prompt.endswith("The fruit is") and len(out.outputs[0].token_ids) == 4
    template = "{{ greeting }}{% for m in messages %}|{{ m.content }}{% endfor %}{{ tools | length }}"
    out = llm.chat([{"role": "user", "content": "x"}], SamplingParams(max_tokens=1), use_tqdm=False,
                   chat_template=template, tools=[{"type": "function", "function": {"name": "f"}}],
                   chat_template_kwargs={"greeting": "hi"})[0]
    assert out.prompt == "hi|x1"
    for reserved in ("self", "chat_template"):  # the renderer's own parameters
        with pytest.raises(ValueError, match=f"chat_template_kwargs may not set '{reserved}'"):
            llm.chat(conv, use_tqdm=False, chat_template_kwargs={reserved: 1})
    with pytest.raises(ValueError, match="chat_template_kwargs may not set 'tools'"):
        llm.chat(conv, use_tqdm=False, tools=[], chat_template_kwargs={"tools": []})
    with pytest.raises(ValueError, match="continue_final_message needs add_generation_prompt false"):
        llm.chat(conv, continue_final_message=True, use_tqdm=False)
