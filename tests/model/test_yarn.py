"""YaRN rope scaling (Qwen2.5 / Qwen3 past their pretrained context, DeepSeek, gpt-oss) against
transformers: the inverse frequencies and the attention factor bit for bit over the options a
config may set (the betas, `truncate`, mscale / mscale_all_dim, an explicit attention_factor); a
tiny Qwen2 with YaRN gives transformers' logits past its pretrained length, from its HF directory
and from a GGUF file written as llama.cpp's converter writes one; the context it serves is the
pretrained length times the factor where that is longer (vLLM's rule); bad settings are named."""

from __future__ import annotations

import json

import pytest
import torch

from corellm.model import load_model
from corellm.model.model_config import ModelConfig
from corellm.model.rope import attention_factor, inverse_frequencies
from tests.model.runner import assert_last_logits_match
from tests.model.test_gguf import LLAMA_LAYER_TENSORS, add_model_fields, write_tensors_and_close
from tests.model.tiny_models import TINY, make_tiny_model

transformers = pytest.importorskip("transformers")

PROMPT = [(11 * i + 5) % 384 for i in range(60)]  # past the pretrained 32 positions
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}


def qwen2_config(**rope) -> dict:
    cfg = dict(TINY, architectures=["Qwen2ForCausalLM"], model_type="qwen2", head_dim=32, rope_theta=10000.0,
               tie_word_embeddings=True)
    cfg["rope_scaling"] = {**YARN, **rope}
    return cfg


def transformers_yarn(cfg: dict) -> tuple[torch.Tensor, float]:
    from transformers import Qwen2Config
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    hf_config = Qwen2Config(**{k: v for k, v in cfg.items() if k not in ("architectures", "model_type")})
    return ROPE_INIT_FUNCTIONS["yarn"](hf_config, "cpu")


@pytest.mark.parametrize("rope", [
    {},
    {"beta_fast": 16, "beta_slow": 2},
    {"truncate": False},                                  # gpt-oss
    {"mscale": 0.707, "mscale_all_dim": 0.707},           # DeepSeek: the two cancel
    {"mscale": 1.0, "mscale_all_dim": 0.5},
    {"attention_factor": 1.25},
    {"factor": 1.0},                                      # no extension: no attention scaling either
    {"factor": 40.0, "original_max_position_embeddings": 4096},
], ids=lambda r: ",".join(f"{k}={v}" for k, v in r.items()) or "defaults")
def test_frequencies_and_attention_factor_are_transformers(rope):
    cfg = qwen2_config(**rope)
    config = ModelConfig.from_hf_config(cfg, "tiny")
    want_inv, want_factor = transformers_yarn(cfg)
    got = inverse_frequencies(config)
    assert got.dtype == torch.float32 and torch.equal(got, want_inv.float())
    assert attention_factor(config) == pytest.approx(want_factor, rel=1e-12)


def test_a_tiny_qwen2_gives_transformers_logits_past_its_pretrained_length(tmp_path, tokenizer_json):
    hf = make_tiny_model("qwen2", tmp_path, tokenizer_json, seed=2, rope_scaling=dict(YARN))
    ours = load_model(str(tmp_path), dtype="float32", progress=False)
    assert ours.config.rope_type == "yarn"
    assert_last_logits_match(ours.model, hf, PROMPT, atol=1e-4, rtol=1e-4)
    # and not those of the same weights without the scaling
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg.pop("rope_scaling", None)
    cfg["rope_parameters"] = {"rope_type": "default", "rope_theta": 1e6}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    plain = load_model(str(tmp_path), dtype="float32", progress=False)
    with pytest.raises(AssertionError):
        assert_last_logits_match(plain.model, hf, PROMPT, atol=1e-4, rtol=1e-4)


def test_the_context_is_the_pretrained_length_times_the_factor():
    """Qwen2.5's kind of config: max_position_embeddings 32768 (the pretrained length) and YaRN x4
    serve 131072 positions; a longer max_position_embeddings (DeepSeek's, gpt-oss's) stays."""
    cfg = qwen2_config(factor=4.0, original_max_position_embeddings=32768)
    cfg["max_position_embeddings"] = 32768
    assert ModelConfig.from_hf_config(cfg, "q").max_position_embeddings == 131072
    cfg = qwen2_config(factor=32.0, original_max_position_embeddings=4096)
    cfg["max_position_embeddings"] = 200000
    assert ModelConfig.from_hf_config(cfg, "g").max_position_embeddings == 200000


def test_the_pretrained_length_defaults_as_in_transformers():
    """Without original_max_position_embeddings in the scaling: the config's top-level one, else
    max_position_embeddings (the older rope_scaling {"type": "yarn"} spelling read too)."""
    cfg = qwen2_config()
    del cfg["rope_scaling"]["original_max_position_embeddings"]
    cfg["rope_scaling"]["type"] = cfg["rope_scaling"].pop("rope_type")
    assert ModelConfig.from_hf_config(cfg, "a").rope_scaling["original_max_position_embeddings"] == 512
    cfg["original_max_position_embeddings"] = 128
    config = ModelConfig.from_hf_config(cfg, "b")
    assert config.rope_scaling["original_max_position_embeddings"] == 128 and config.rope_type == "yarn"
    assert torch.equal(inverse_frequencies(config), transformers_yarn(cfg)[0])


@pytest.mark.parametrize(("rope", "message"), [
    ({"factor": 0.5}, r"yarn rope scaling needs a factor of at least 1, got 0.5"),
    ({"factor": "4"}, r"yarn rope scaling needs a factor of at least 1, got '4'"),
    ({"original_max_position_embeddings": -1}, r"needs a positive original_max_position_embeddings, got -1"),
    ({"beta_fast": 1, "beta_slow": 32}, r"needs positive beta_fast >= beta_slow, got beta_fast=1, beta_slow=32"),
    ({"mscale": float("nan"), "mscale_all_dim": 1.0}, r"yarn rope scaling's mscale must be a number >= 0"),
    ({"attention_factor": -1.0}, r"yarn rope scaling's attention_factor must be a number >= 0, got -1.0"),
])
def test_a_bad_yarn_config_is_refused_by_name(rope, message):
    with pytest.raises(ValueError, match=message):
        ModelConfig.from_hf_config(qwen2_config(**rope), "tiny")


def write_qwen2_yarn_gguf(hf_model, path, **extra) -> None:
    """hf_model as llama.cpp's converter writes a Qwen2 with YaRN: q and k as they are, rope.scaling.type
    "yarn", its factor and the pretrained context length (and `extra` keys under the architecture's name)."""
    import gguf

    c = hf_model.config
    w = gguf.GGUFWriter(str(path), "qwen2")
    add_model_fields(w, c)
    w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    w.add_rope_scaling_factor(4.0)
    w.add_rope_scaling_orig_ctx_len(32)
    for key, value in extra.items():
        w.add_float32(f"qwen2.{key}", value)
    write_tensors_and_close(w, hf_model, LLAMA_LAYER_TENSORS, "F32", permute=False)  # (Qwen2 rotates NeoX-style)


def test_a_gguf_file_gives_transformers_logits(tmp_path, tokenizer_json):
    pytest.importorskip("gguf")
    hf = make_tiny_model("qwen2", tmp_path / "hf", tokenizer_json, seed=3, rope_scaling=dict(YARN))
    path = tmp_path / "qwen2.gguf"
    write_qwen2_yarn_gguf(hf, path)
    ours = load_model(str(path), dtype="float32", progress=False)
    assert ours.config.rope_scaling == {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}
    assert ours.config.max_position_embeddings == 512
    assert_last_logits_match(ours.model, hf, PROMPT, atol=1e-4, rtol=1e-4)


def test_a_gguf_attention_factor_multiplier_is_refused(tmp_path, tokenizer_json):
    pytest.importorskip("gguf")
    hf = make_tiny_model("qwen2", tmp_path / "hf", tokenizer_json, seed=3, rope_scaling=dict(YARN))
    path = tmp_path / "qwen2.gguf"
    write_qwen2_yarn_gguf(hf, path, **{"rope.scaling.attn_factor": 0.8})
    with pytest.raises(ValueError, match=r"YaRN with rope.scaling.attn_factor 0.8"):
        load_model(str(path), dtype="float32", progress=False)
