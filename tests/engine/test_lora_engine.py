"""LoRA adapters through the whole engine (LLM(enable_lora=True), generate's lora_request), on a
tiny random Llama: greedy tokens equal transformers' on the model with the updates merged (fp32,
where its top-2 margin is clear), whatever else runs in the batch; in bf16 a request's tokens and
logprobs are bit-identical alone and among other adapters; adapters beyond max_loras wait for a
slot rather than fail; prefix-cache blocks are shared only under the same adapter; and every
misuse is a ValueError naming it."""

from __future__ import annotations

import json

import pytest
import torch

from corellm import LLM, LoRARequest, SamplingParams
from tests.engine.test_tiny_oracle import hf_greedy, write_tokenizer
from tests.lora_adapters import ATTENTION, make_lora_adapter, merged
from tests.model.tiny_models import make_tiny_model

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora_engine")
    hf = make_tiny_model("llama3", root / "model", seed=11)
    write_tokenizer(root / "model")
    config = json.loads((root / "model" / "config.json").read_text())
    updates = {"a": make_lora_adapter(root / "a", config, rank=8, seed=1, std=0.15),
               "b": make_lora_adapter(root / "b", config, rank=4, modules=ATTENTION, seed=2, std=0.15),
               "c": make_lora_adapter(root / "c", config, rank=16, seed=3, std=0.15)}
    loras = {name: LoRARequest(name, i + 1, str(root / name)) for i, name in enumerate(updates)}
    return root, hf, updates, loras


def _engine(root, **kwargs):
    return LLM(str(root / "model"), max_model_len=256, kv_cache_memory=64 * 1024**2, block_size=16,
               enable_lora=True, **kwargs)


def _prompts(n, seed=3):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 384, (int(k),), generator=g).tolist() for k in torch.randint(20, 70, (n,), generator=g)]


def test_greedy_equals_transformers_with_the_updates_merged(tiny):
    root, hf, updates, loras = tiny
    llm = _engine(root, dtype="float32", max_loras=2)  # three adapters in the batch: some wait for a slot
    prompts = _prompts(8)
    names = ["a", None, "b", "c", "a", "c", None, "b"]
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, logprobs=0)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False,
                        lora_request=[None if n is None else loras[n] for n in names])
    oracles = {None: hf, **{n: merged(hf, u) for n, u in updates.items()}}
    for p, name, out in zip(prompts, names, outs):
        want, want_lp, margins = hf_greedy(oracles[name], p, 16)
        got = out.outputs[0]
        for t in range(16):
            if margins[t] < 1e-3:
                break  # a near-tie: the reference's own order is not an oracle from here
            assert got.token_ids[t] == want[t], f"adapter {name}, token {t}"
            assert abs(got.logprobs[t][want[t]].logprob - want_lp[t]) < 1e-3, f"adapter {name}, token {t}"
    llm.shutdown()


def test_bf16_tokens_and_logprobs_are_the_same_alone_and_among_other_adapters(tiny):
    root, _, _, loras = tiny
    llm = _engine(root, dtype="bfloat16", max_loras=3)
    prompts = _prompts(6, seed=5)
    names = ["a", "b", None, "c", "a", None]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=2)
    together = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False,
                            lora_request=[None if n is None else loras[n] for n in names])
    for p, name, out in zip(prompts, names, together):
        alone = llm.generate({"prompt_token_ids": p}, params, use_tqdm=False,
                             lora_request=None if name is None else loras[name])[0].outputs[0]
        assert alone.token_ids == out.outputs[0].token_ids
        assert alone.logprobs == out.outputs[0].logprobs
    assert together[0].outputs[0].token_ids != llm.generate({"prompt_token_ids": prompts[0]}, params,
                                                            use_tqdm=False)[0].outputs[0].token_ids
    llm.shutdown()


def test_prefix_cache_blocks_are_shared_only_under_the_same_adapter(tiny):
    root, _, _, loras = tiny
    llm = _engine(root, dtype="bfloat16")
    prompt = {"prompt_token_ids": _prompts(1, seed=9)[0] + list(range(40))}  # several whole blocks
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    run = lambda lora: llm.generate(prompt, params, use_tqdm=False, lora_request=lora)[0]  # noqa: E731
    assert run(None).num_cached_tokens == 0
    first_a = run(loras["a"])
    assert first_a.num_cached_tokens == 0  # the base model's blocks are not the adapter's
    again_a = run(loras["a"])
    assert again_a.num_cached_tokens > 0 and again_a.outputs[0].token_ids == first_a.outputs[0].token_ids
    assert run(loras["b"]).num_cached_tokens == 0
    llm.shutdown()


def test_misuse_is_a_value_error_naming_it(tiny, tmp_path):
    root, _, _, loras = tiny
    plain = LLM(str(root / "model"), max_model_len=256, kv_cache_memory=16 * 1024**2)
    with pytest.raises(ValueError, match="this engine runs without LoRA"):
        plain.generate("w1 w2", lora_request=loras["a"], use_tqdm=False)
    plain.shutdown()
    with pytest.raises(ValueError, match="max_loras must be >= 1"):
        LLM(str(root / "model"), enable_lora=True, max_loras=0)
    llm = _engine(root, max_lora_rank=8)
    with pytest.raises(ValueError, match=r"rank 16, above max_lora_rank \(8\)"):
        llm.generate("w1", lora_request=loras["c"], use_tqdm=False)
    with pytest.raises(ValueError, match="is not a directory"):
        llm.generate("w1", lora_request=LoRARequest("missing", 9, str(tmp_path / "nothing")), use_tqdm=False)
    llm.generate("w1", SamplingParams(max_tokens=1), lora_request=loras["a"], use_tqdm=False)
    with pytest.raises(ValueError, match="'a' is loaded as id 1"):
        llm.generate("w1", lora_request=LoRARequest("a", 1, str(root / "b")), use_tqdm=False)
    with pytest.raises(ValueError, match="lora_int_id 1 belongs to LoRA adapter 'a'"):
        llm.generate("w1", lora_request=LoRARequest("b2", 1, str(root / "b")), use_tqdm=False)
    with pytest.raises(ValueError, match="got 1 LoRA requests for 2 prompts"):
        llm.generate(["w1", "w2"], lora_request=[loras["a"]], use_tqdm=False)
    with pytest.raises(ValueError, match="lora_int_id must be an integer >= 1"):
        LoRARequest("x", 0, "/tmp")
    llm.shutdown()


def test_beam_search_runs_with_the_adapter(tiny):
    from corellm import BeamSearchParams

    root, _, _, loras = tiny
    llm = _engine(root, dtype="bfloat16")
    prompt = {"prompt_token_ids": _prompts(1, seed=4)[0]}
    n = len(prompt["prompt_token_ids"])
    one_beam = BeamSearchParams(beam_width=1, max_tokens=6, ignore_eos=True)  # one beam: the greedy path
    greedy = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    for lora in (loras["a"], None):
        beam = llm.beam_search([prompt], one_beam, lora_request=lora)[0].sequences[0].tokens[n:]
        assert beam == llm.generate(prompt, greedy, use_tqdm=False, lora_request=lora)[0].outputs[0].token_ids
    assert llm.beam_search([prompt], one_beam, lora_request=loras["a"])[0].sequences[0].tokens != \
        llm.beam_search([prompt], one_beam)[0].sequences[0].tokens
    llm.shutdown()
