"""Tiny random models of every supported architecture, made with HF transformers and saved as
safetensors, loaded by corellm: per-layer hidden states and logits equal transformers' (fp32),
for a whole prefill, chunked prefill and decode steps through the paged KV cache."""

from __future__ import annotations

import pytest
import torch

from corellm.model import load_model
from tests.model.runner import PagedRunner
from tests.model.tiny_models import ARCHS, make_tiny_model

pytest.importorskip("transformers")


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_prefill_hidden_states_and_logits_match_transformers(arch, tmp_path, tokenizer_json):
    hf = make_tiny_model(arch, tmp_path, tokenizer_json)
    ours = load_model(str(tmp_path), dtype="float32", progress=False)
    ids = torch.randint(0, 384, (1, 70), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf(ids, output_hidden_states=True)
    runner = PagedRunner(ours.model, 128, 1, block_size=16)
    hidden: list[torch.Tensor] = []
    with torch.inference_mode():
        runner.step([ids[0].tolist()], hidden)
    assert len(hidden) == len(ref.hidden_states) - 1
    for i, (got, want) in enumerate(zip(hidden, ref.hidden_states[1:])):
        if i == len(hidden) - 1:
            break  # HF applies the final norm to its last entry
        torch.testing.assert_close(got, want[0], atol=1e-4, rtol=1e-4, msg=f"{arch}: layer {i}")
    # Logits of every position: run the full-sequence forward once more, keeping all tokens.
    runner = PagedRunner(ours.model, 128, 1, block_size=16)
    logits = torch.cat([runner.step([[t]]) for t in ids[0].tolist()])  # 70 decode steps
    torch.testing.assert_close(logits, ref.logits[0], atol=2e-4, rtol=1e-4)


@pytest.mark.parametrize("arch", ["llama3", "qwen2", "qwen3", "gemma3", "mixtral", "qwen3_moe", "qwen2_moe", "olmoe",
                                  "gpt_oss"])
def test_batched_chunked_prefill_and_decode_match_transformers(arch, tmp_path, tokenizer_json):
    hf = make_tiny_model(arch, tmp_path, tokenizer_json, seed=3)
    ours = load_model(str(tmp_path), dtype="float32", progress=False)
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, 384, (n,), generator=g).tolist() for n in (45, 7, 100)]
    runner = PagedRunner(ours.model, 160, 3, block_size=8)
    # Step 1: seq 0 whole, seq 2 first chunk of 30; step 2: seq 1 whole, seq 2 the rest.
    runner.step([prompts[0], [], prompts[2][:30]])
    out = runner.step([[], prompts[1], prompts[2][30:]])
    first = runner.step([[0], [], []])  # seq 0 decodes token 0
    seqs = [prompts[0] + [0], prompts[1], prompts[2]]
    with torch.no_grad():
        want_last = [hf(torch.tensor([s])).logits[0, -1] for s in seqs]
    torch.testing.assert_close(out[0], want_last[1], atol=2e-4, rtol=1e-4)
    torch.testing.assert_close(out[1], want_last[2], atol=2e-4, rtol=1e-4)
    torch.testing.assert_close(first[0], want_last[0], atol=2e-4, rtol=1e-4)
    # Greedy decode of all three together equals HF's greedy.
    tokens = [s + [int(torch.argmax(w))] for s, w in zip(seqs, want_last)]
    nxt = [[t[-1]] for t in tokens]
    for _ in range(6):
        logits = runner.step(nxt)
        nxt = [[int(torch.argmax(row))] for row in logits]
        for t, n in zip(tokens, nxt):
            t.append(n[0])
    with torch.no_grad():
        for s, t in zip(seqs, tokens):
            ids = torch.tensor([s])  # an explicit mask: Gemma's pad id 0 would otherwise mask the 0 token out
            full = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=7, do_sample=False)[0].tolist()
            assert full[len(s):] == t[len(s) : len(s) + 7]


def test_bf16_logits_close_to_fp32(tmp_path, tokenizer_json):
    make_tiny_model("llama3", tmp_path, tokenizer_json)
    ids = list(range(3, 60))
    out = {}
    for dtype in ("float32", "bfloat16"):
        m = load_model(str(tmp_path), dtype=dtype, progress=False)
        out[dtype] = PagedRunner(m.model, 64, 1).step([ids])
    torch.testing.assert_close(out["bfloat16"], out["float32"], atol=0.1, rtol=0.05)
