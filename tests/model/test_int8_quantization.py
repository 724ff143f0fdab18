"""--quantization int8: an HF checkpoint's projections quantized at load to int8 with one scale per
output row (vLLM's W8A8 weights), activations quantized to int8 as they come (per 32 values,
quant_gemm.h), against transformers in fp32 on the original weights."""

from __future__ import annotations

import pytest
import torch

from corellm.model import load_model
from tests.model.runner import PagedRunner
from tests.model.tiny_models import make_tiny_model

transformers = pytest.importorskip("transformers")

PROMPT = list(range(7, 71))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, tokenizer_json):
    path = tmp_path_factory.mktemp("int8")
    hf = make_tiny_model("qwen2", path, tokenizer_json)  # qkv biases: added in the int8 GEMM's epilogue
    return path, hf


def test_projections_are_int8_per_channel(tiny):
    path, hf = tiny
    ours = load_model(str(path), dtype="float32", quantization="int8", progress=False)
    assert ours.quantization == "int8"
    layer = ours.model.layers[1]
    for linear in layer.linears():
        assert [q.type_name for _, q in linear.quantized] == ["Q8_0"]
    assert ours.model.embed.quantized is None and not ours.model.lm_head.quantized  # as vLLM: left in dtype
    w = hf.model.layers[1].mlp.down_proj.weight.detach().float()
    scale = (w.abs().amax(1) / 127).half().float()
    want = torch.clamp(torch.round(w / scale[:, None]), -127, 127) * scale[:, None]
    got = layer.mlp.down_proj.quantized[0][1].dequantize(torch.float32)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-7)
    assert ours.model.weight_bytes()["Q8_0"] < sum(p.numel() for p in hf.parameters()) * 4 / 3


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_logits_near_transformers(tiny, dtype):
    path, hf = tiny
    ours = load_model(str(path), dtype=dtype, quantization="int8", progress=False)
    got = PagedRunner(ours.model, 96, 1).step([PROMPT])[0]
    with torch.no_grad():
        want = hf(torch.tensor([PROMPT])).logits[0, -1].float()
    rel = (got - want).abs().max() / want.abs().max()
    assert rel < (0.03 if dtype == "float32" else 0.05), f"worst logit off by {rel:.3%}"


def test_int8_is_refused_where_it_does_not_apply(tiny):
    from corellm.model.loader import default_model_path

    with pytest.raises(ValueError, match="quantization 'int8' quantizes an HF checkpoint's weights; .* is a GGUF"):
        load_model(str(default_model_path()), quantization="int8")
    with pytest.raises(ValueError, match="quantization 'fp4' is not supported: use one of gguf, int8, fp8, mxfp4, none"):
        load_model(str(tiny[0]), quantization="fp4")
    with pytest.raises(ValueError, match="quantization 'gguf' needs a .gguf file"):
        load_model(str(tiny[0]), quantization="gguf")
