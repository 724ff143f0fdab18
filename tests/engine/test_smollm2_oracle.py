"""SmolLM2-135M-Instruct (real weights, fp32) against HF transformers loading the same GGUF:
greedy tokens equal wherever transformers' top-2 margin is clear, sequences agree until the
first near-tie, top-5 logprobs close."""

from __future__ import annotations

import pytest
import torch

from corellm import LLM, SamplingParams
from corellm.model.loader import default_model_path
from tests.engine.prompts import PROMPTS

transformers = pytest.importorskip("transformers")

NUM_PROMPTS, NUM_TOKENS, MARGIN = 16, 32, 0.05


@pytest.fixture(scope="module")
def hf_reference():
    path = default_model_path()
    model = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                              dtype=torch.float32).eval()
    return model


@pytest.fixture(scope="module")
def llm_fp32():
    return LLM(dtype="float32", max_model_len=512, kv_cache_memory=256 * 1024**2, max_num_seqs=32)


def reference_greedy(model, prompt_ids: list[int]):
    """(tokens, per-step log-softmax rows, per-step top-2 margins) of HF greedy decoding."""
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt_ids]), max_new_tokens=NUM_TOKENS, do_sample=False,
                             output_logits=True, return_dict_in_generate=True, eos_token_id=None,
                             pad_token_id=0)
    tokens = out.sequences[0, len(prompt_ids):].tolist()
    logits = torch.stack(out.logits)[:, 0].float()
    top2 = torch.topk(logits, 2, dim=-1).values
    return tokens, torch.log_softmax(logits.double(), -1), (top2[:, 0] - top2[:, 1]).tolist()


def test_greedy_tokens_and_logprobs_match_transformers(llm_fp32, hf_reference):
    tok = llm_fp32.get_tokenizer()
    prompts = [tok.encode(p) for p in PROMPTS[:NUM_PROMPTS]]
    params = SamplingParams(temperature=0.0, max_tokens=NUM_TOKENS, ignore_eos=True, logprobs=5)
    outputs = llm_fp32.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    compared = 0
    for prompt_ids, out in zip(prompts, outputs):
        ours = out.outputs[0]
        ref_tokens, ref_lp, margins = reference_greedy(hf_reference, prompt_ids)
        for t, (mine, theirs, margin) in enumerate(zip(ours.token_ids, ref_tokens, margins)):
            if margin < MARGIN:
                break  # first near-tie: beyond it the two may legitimately diverge
            assert mine == theirs, f"prompt {prompt_ids[:5]}..., step {t}: {mine} != {theirs} (margin {margin:.3f})"
            top5 = torch.topk(ref_lp[t], 5)
            for tid, lp in zip(top5.indices.tolist(), top5.values.tolist()):
                assert tid in ours.logprobs[t], f"step {t}: top-5 token {tid} missing"
                assert abs(ours.logprobs[t][tid].logprob - lp) < 1e-3, f"step {t}: logprob of {tid}"
            compared += 1
    assert compared >= NUM_PROMPTS * NUM_TOKENS // 2, f"only {compared} positions had a clear margin"
