"""The engine on every instruction-set path this CPU runs (CORELLM_ISA=avx2, avx512, avx512bf16,
amx; each in its own process, as a user would force it): SmolLM2 in bf16 through the native stack,
greedy. On each path a batch gives every prompt exactly the tokens and logprobs of its run alone
and of its run with its prompt cut into chunks of 4 tokens (the prompts, of 5-13 tokens, leave a token alone,
whose attention is then computed as a decode's: invariance holds within a path), and each token is HF transformers' argmax (fp32, same GGUF,
given the same preceding tokens) wherever its top-2 margin is clear of bf16's rounding; the path
the engine logs is the one asked for. The same with an 8-bit KV cache (kv_cache_dtype fp8 and
fp8_e5m2) on the process's own path: its attention is the bf16 fold's on the widened blocks
(tests/ops/test_attention_fp8_kv.py, on every path), so invariance holds as for bf16; the margin
clear of its rounding is wider, e5m2's (2 mantissa bits) the widest."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from corellm.model import load_model
from corellm.model.loader import default_model_path
from corellm.native import _core
from tests.engine.prompts import PROMPTS

transformers = pytest.importorskip("transformers")

NUM_PROMPTS, NUM_TOKENS = 6, 16
# kv_cache_dtype -> the top-2 margin below which a token may go either way: bf16 weights and
# activations move logits by ~0.1 against fp32; an fp8 KV cache's rounding moves them more (SmolLM2,
# 16 prompts x 32 tokens against transformers: the greedy token's logprob by up to 0.22 nats with
# e4m3, 0.64 with e5m2, which also swapped tokens at margins of 0.25-0.5).
MARGINS = {"auto": 0.5, "fp8": 0.5, "fp8_e5m2": 1.0}

RUN_ON_PATH = """
import json, logging, sys
logging.basicConfig(level=logging.INFO)
from corellm import LLM, SamplingParams
prompts, kv_cache_dtype = json.loads(sys.argv[1]), sys.argv[2]
params = SamplingParams(temperature=0, max_tokens=%d, ignore_eos=True, logprobs=1)
def run(llm, batch):
    outs = llm.generate([{"prompt_token_ids": p} for p in batch], params, use_tqdm=False)
    return [[o.outputs[0].token_ids, [sorted((t, l.logprob) for t, l in step.items()) for step in o.outputs[0].logprobs]]
            for o in outs]
llm = LLM(max_model_len=256, kv_cache_memory=64 * 1024**2, max_num_seqs=16, kv_cache_dtype=kv_cache_dtype)
together, alone = run(llm, prompts), [run(llm, [p])[0] for p in prompts]
del llm
chunked_llm = LLM(max_model_len=256, kv_cache_memory=64 * 1024**2, max_num_seqs=16, max_num_batched_tokens=4,
                  kv_cache_dtype=kv_cache_dtype)
print(json.dumps({"together": together, "alone": alone, "chunked": [run(chunked_llm, [p])[0] for p in prompts]}))
""" % NUM_TOKENS


@pytest.fixture(scope="module")
def prompt_ids():
    tok = load_model(progress=False).tokenizer
    return [tok.encode(p) for p in PROMPTS[:NUM_PROMPTS]]


@pytest.fixture(scope="module")
def hf_model():
    path = default_model_path()
    return transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                             dtype=torch.float32).eval()


def reference_next_tokens(model, prompt: list[int], generated: list[int]) -> tuple[list[int], list[float]]:
    """HF's argmax and top-2 margin at each generated position, given the tokens before it (one
    teacher-forced forward over the prompt and what the engine generated)."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + generated])).logits[0, len(prompt) - 1 : -1].float()
    top2 = torch.topk(logits, 2, dim=-1).values
    return logits.argmax(-1).tolist(), (top2[:, 0] - top2[:, 1]).tolist()


CASES = [(isa, "auto") for isa in _core.kernels.supported_cpu_isas()] + [
    (_core.kernels.cpu_isa(), kv) for kv in ("fp8", "fp8_e5m2")]


@pytest.mark.parametrize("isa,kv_cache_dtype", CASES)
def test_each_path_is_batch_invariant_and_follows_transformers(isa, kv_cache_dtype, prompt_ids, hf_model):
    run = subprocess.run([sys.executable, "-c", RUN_ON_PATH, json.dumps(prompt_ids), kv_cache_dtype],
                         env=dict(os.environ, CORELLM_ISA=isa), capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert f"CPU kernels: {isa} on" in run.stderr  # the engine took (and logged) the path asked for
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got["together"] == got["alone"], f"{isa}: a prompt's tokens or logprobs depend on the batch"
    assert got["chunked"] == got["alone"], f"{isa}: a prompt's tokens or logprobs depend on its prefill chunks"
    compared = 0
    for prompt, (tokens, _) in zip(prompt_ids, got["together"]):
        for step, (mine, theirs, margin) in enumerate(zip(tokens, *reference_next_tokens(hf_model, prompt, tokens))):
            if margin >= MARGINS[kv_cache_dtype]:  # a near-tie may go either way
                assert mine == theirs, f"{isa}: step {step}: {mine} != {theirs} (margin {margin:.2f})"
                compared += 1
    assert compared >= NUM_PROMPTS * NUM_TOKENS // 2, f"{isa}: only {compared} positions had a clear margin"
