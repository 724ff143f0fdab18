"""Tiny random Llama, SmolLM3, ERNIE 4.5, GLM, GLM-4, OLMo 2, Olmo 3, Qwen2, Qwen3, Gemma 2, Gemma 3, Mixtral, Qwen3-MoE and Qwen2-MoE models (fp32) through the whole engine, 16 prompts x 32
tokens as one batch: greedy token ids equal HF transformers' greedy, logprobs within 1e-4."""

from __future__ import annotations

import pytest
import torch

from corellm import LLM, SamplingParams
from tests.model.tiny_models import make_tiny_model

pytest.importorskip("transformers")


def write_tokenizer(directory):
    from tokenizers import Tokenizer, models, pre_tokenizers

    t = Tokenizer(models.WordLevel({f"w{i}": i for i in range(384)}, unk_token="w0"))
    t.pre_tokenizer = pre_tokenizers.Whitespace()
    t.save(str(directory / "tokenizer.json"))


def hf_greedy(model, prompt: list[int], n: int):
    ids = list(prompt)
    logprobs, margins = [], []
    with torch.no_grad():
        for _ in range(n):
            logits = model(torch.tensor([ids])).logits[0, -1].double()
            top2 = torch.topk(logits, 2).values
            margins.append(float(top2[0] - top2[1]))
            lp = torch.log_softmax(logits, -1)
            ids.append(int(logits.argmax()))
            logprobs.append(float(lp[ids[-1]]))
    return ids[len(prompt):], logprobs, margins


@pytest.mark.parametrize("arch", ["llama3", "smollm3", "ernie4_5", "glm", "glm4", "qwen2", "qwen3", "gemma2", "gemma3", "mixtral", "qwen3_moe", "qwen2_moe", "ernie4_5_moe", "olmoe", "olmo2", "olmo3",
                                  "phi3", "granite", "granitemoe", "gpt_oss"])
def test_greedy_batch_equals_transformers(arch, tmp_path):
    hf = make_tiny_model(arch, tmp_path, seed=11)
    write_tokenizer(tmp_path)
    llm = LLM(str(tmp_path), dtype="float32", max_model_len=256, kv_cache_memory=64 * 1024**2, block_size=16)
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 384, (int(n),), generator=g).tolist()
               for n in torch.randint(3, 90, (16,), generator=g)]
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True, logprobs=0)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    for p, out in zip(prompts, outs):
        want, want_lp, margins = hf_greedy(hf, p, 32)
        got = out.outputs[0]
        for t in range(32):
            if margins[t] < 1e-4:
                break  # an exact tie in a random model: either answer is right, after it they differ
            assert got.token_ids[t] == want[t], f"{arch}: step {t}"
            assert abs(got.logprobs[t][want[t]].logprob - want_lp[t]) < 1e-4
