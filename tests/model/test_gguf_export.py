"""The BF16 re-encoding of a GGUF file loads back (corellm) to the same model: equal config and
tokenizer, weights equal to the source's dequantized weights rounded to bf16."""

from __future__ import annotations

import torch

from corellm.model.gguf_export import export_bf16, float32_to_bf16_bits
from corellm.model.gguf_file import GGUFModelFile
from corellm.model.loader import default_model_path


def test_bf16_rounding_matches_torch():
    x = torch.randn(10000) * 100
    x[:3] = torch.tensor([float("nan"), float("inf"), -0.0])
    ours = torch.from_numpy(float32_to_bf16_bits(x.numpy()).view("int16"))
    assert torch.equal(ours[1:], x[1:].bfloat16().view(torch.int16))
    assert ours[:1].view(torch.bfloat16).isnan().all()  # NaN stays NaN (payloads differ between libraries)


def test_export_round_trip(tmp_path):
    src = GGUFModelFile(default_model_path())
    out = GGUFModelFile(export_bf16(default_model_path(), tmp_path / "bf16.gguf"))
    assert out.config().__dict__ | {"source": ""} == src.config().__dict__ | {"source": ""}
    text = "Hello 🎉 12345 <|im_start|>"
    assert out.tokenizer().encode(text) == src.tokenizer().encode(text)
    want = dict(src.weights(torch.bfloat16, progress=False))
    for name, tensor in out.weights(torch.bfloat16, progress=False):
        assert torch.equal(tensor, want[name]), name
