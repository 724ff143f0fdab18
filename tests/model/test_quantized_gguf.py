"""A tiny Llama written to GGUF in each quantized type (every matrix, the embedding too) and run
as it is (quantization "gguf"), against transformers (fp32) running the file's dequantized
weights — what transformers' own GGUF loading computes. Activations are quantized to int8 per
32 values, so logits move slightly; measured here, the worst logit differs by under 2% of the
largest (fp32 activations), and the greedy tokens agree wherever transformers' top-2 margin is
at least 0.25. The native decoder stack gives the per-op path's bits on quantized weights too."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from corellm.model import load_model
from tests import quant_blocks
from tests.model.runner import PagedRunner
from tests.model.test_gguf import write_llama_gguf
from tests.model.tiny_models import make_tiny_model

transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

# Every matrix's k a multiple of 256: the K types' super-block.
SHAPE = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2)
PROMPT = [int(t) for t in np.random.default_rng(0).integers(3, 384, size=48)]


@pytest.fixture(scope="module", params=quant_blocks.ALL_TYPES)
def quantized_pair(request, tmp_path_factory):
    """(type name, corellm's loaded model, transformers' model on the dequantized weights)."""
    tmp = tmp_path_factory.mktemp(request.param)
    hf = make_tiny_model("llama_tied", tmp / "hf", **SHAPE)
    hf.config.tie_word_embeddings = False  # the file gets an output.weight (the same values, quantized alike)
    with torch.no_grad():  # logits spread wide enough for greedy margins (the input norm undoes it)
        hf.lm_head.weight.mul_(20.0)
    path = tmp / "tiny.gguf"
    write_llama_gguf(hf, path, getattr(gguf.GGMLQuantizationType, request.param))
    with torch.no_grad():
        for p in hf.parameters():
            if p.ndim == 2:
                a = p.float().numpy()
                p.copy_(torch.from_numpy(quant_blocks.dequantize(quant_blocks.quantize(a, request.param),
                                                                 request.param).reshape(a.shape)))
    return request.param, path, hf


def reference(hf, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf(torch.tensor([ids])).logits[0, -1].float()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_logits_near_transformers_on_the_dequantized_weights(quantized_pair, dtype):
    type_name, path, hf = quantized_pair
    ours = load_model(str(path), dtype=dtype, progress=False, use_cache=False)
    assert ours.quantization == "gguf"
    assert {q.type_name for layer in ours.model.layers for _, q in layer.attn.qkv_proj.quantized} == {type_name}
    assert ours.model.embed.quantized.type_name == type_name
    got = PagedRunner(ours.model, 64, 1).step([PROMPT])[0]
    want = reference(hf, PROMPT)
    rel = (got - want).abs().max() / want.abs().max()
    assert rel < (0.02 if dtype == "float32" else 0.04), f"{type_name} {dtype}: worst logit off by {rel:.3%}"


def test_greedy_tokens_follow_transformers_while_the_margin_is_clear(quantized_pair):
    type_name, path, hf = quantized_pair
    ours = load_model(str(path), dtype="float32", progress=False, use_cache=False)
    runner = PagedRunner(ours.model, 96, 1)
    ids, logits = list(PROMPT), runner.step([PROMPT])[0]
    compared = 0
    for _ in range(24):
        want = reference(hf, ids)
        top2 = torch.topk(want, 2).values
        if top2[0] - top2[1] < 0.25:
            break
        assert int(logits.argmax()) == int(want.argmax()), f"{type_name}: step {compared} differs"
        ids.append(int(want.argmax()))
        logits = runner.step([[ids[-1]]])[0]
        compared += 1
    assert compared >= 4, f"{type_name}: only {compared} steps had a clear margin"


def test_native_stack_gives_the_per_op_bits(quantized_pair):
    _, path, _ = quantized_pair
    ours = load_model(str(path), progress=False, use_cache=False)  # bf16: the native stack's dtype
    chunks = [PROMPT[:20], PROMPT[20:21], PROMPT[21:40]]
    op, native = PagedRunner(ours.model, 64, 1), PagedRunner(ours.model, 64, 1, native=True)
    for chunk in chunks:
        assert torch.equal(native.step([chunk]), op.step([chunk]))
