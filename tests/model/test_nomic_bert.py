"""Nomic BERT (nomic-embed-text v1 / v1.5: rotary positions, SwiGLU, no projection biases) against
transformers' NomicBertModel in fp32 on a tiny random model: from its HF directory, with the config
as transformers writes it or as the Hub's own code does (n_embd, rotary_emb_base, ...: the same
vectors), and from a GGUF file in llama.cpp's "nomic-bert" layout (F32 within 1e-5 of transformers,
Q8_0 computed as it is at a cosine above 0.999); the context is the positions the model was trained
on; in bf16 a vector is the same alone and in a batch; what corellm does not compute is refused by
name."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

from safetensors import safe_open  # noqa: E402

from corellm import LLM, PoolingParams  # noqa: E402
from tests.model.test_bert_gguf import (TEXTS, add_encoder_tensors, add_wordpiece_vocabulary, hf_mean,  # noqa: E402
                                        vocabulary, write_hf_tokenizer)

CONFIG = dict(vocab_size=384, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
              max_position_embeddings=128, type_vocab_size=2, hidden_act="silu")


@pytest.fixture(scope="module")
def tiny_nomic(tmp_path_factory):
    """(transformers' NomicBertModel, its HF tokenizer, its vocabulary, the directory)."""
    directory = tmp_path_factory.mktemp("nomic")
    torch.manual_seed(0)
    hf = transformers.NomicBertModel(transformers.NomicBertConfig(**CONFIG)).float().eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "layernorm" in name.lower():
                p.normal_(1.0 if name.endswith("weight") else 0.0, 0.2)
    hf.save_pretrained(directory, safe_serialization=True)
    vocab = vocabulary(384)
    return hf, write_hf_tokenizer(directory, vocab), vocab, directory


def hub_config(hf, **changes) -> dict:
    """The config.json nomic-embed-text's Hub repositories carry (their own modeling code's keys)."""
    c = hf.config
    return {"architectures": ["NomicBertModel"], "model_type": "nomic_bert", "activation_function": "swiglu",
            "n_embd": c.hidden_size, "n_head": c.num_attention_heads, "n_inner": c.intermediate_size,
            "n_layer": c.num_hidden_layers, "n_positions": 8192, "max_trained_positions": 128,
            "layer_norm_epsilon": c.layer_norm_eps, "rotary_emb_base": 1000, "rotary_emb_fraction": 1.0,
            "rotary_emb_interleaved": False, "rotary_emb_scale_base": None, "rotary_scaling_factor": None,
            "qkv_proj_bias": False, "mlp_fc1_bias": False, "mlp_fc2_bias": False, "prenorm": False, "causal": False,
            "parallel_block": False, "use_rms_norm": False, "type_vocab_size": 2, "vocab_size": c.vocab_size,
            **changes}


def embed(path, texts, **engine) -> list[torch.Tensor]:
    llm = LLM(str(path), dtype=engine.pop("dtype", "float32"), max_num_seqs=8, **engine)
    return [torch.tensor(o.outputs.embedding, dtype=torch.float64)
            for o in llm.embed(texts, PoolingParams(normalize=False), use_tqdm=False)]


def test_the_hub_config_and_transformers_config_give_transformers_vectors(tiny_nomic, tmp_path):
    hf, tokenizer, _, directory = tiny_nomic
    (directory / "1_Pooling").mkdir(exist_ok=True)
    (directory / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_mean_tokens": True}))
    vectors = embed(directory, TEXTS)
    for text, got in zip(TEXTS, vectors):
        torch.testing.assert_close(got, hf_mean(hf, tokenizer.encode(text)), atol=1e-5, rtol=1e-5)
    for f in directory.iterdir():
        if f.is_file() and f.name != "config.json":
            (tmp_path / f.name).write_bytes(f.read_bytes())
    (tmp_path / "1_Pooling").mkdir()
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_mean_tokens": True}))
    (tmp_path / "config.json").write_text(json.dumps(hub_config(hf)))
    assert [v.tolist() for v in embed(tmp_path, TEXTS)] == [v.tolist() for v in vectors]
    # the context: the trained positions (128 here; nomic-embed-text's 2048 of its n_positions 8192)
    with pytest.raises(ValueError, match=r"max_model_len \(129\) exceeds the model's context length \(128"):
        LLM(str(tmp_path), dtype="float32", max_model_len=129)


def test_a_vector_is_the_same_alone_and_in_a_batch_in_bf16(tiny_nomic):
    _, _, _, directory = tiny_nomic
    llm = LLM(str(directory), dtype="bfloat16", max_num_seqs=8)
    alone = [llm.embed([t], use_tqdm=False)[0].outputs.embedding for t in TEXTS]
    assert [o.outputs.embedding for o in llm.embed(TEXTS, use_tqdm=False)] == alone
    assert [o.outputs.embedding for o in llm.embed(TEXTS[::-1], use_tqdm=False)] == alone[::-1]


@pytest.mark.parametrize("change, says", [
    ({"rotary_scaling_factor": 2}, "rotary_scaling_factor 2 is not supported"),
    ({"rotary_emb_fraction": 0.5}, "rotary_emb_fraction 0.5 is not supported"),
    ({"prenorm": True}, "prenorm True is not supported"),
    ({"activation_function": "gelu"}, "MLP must be SwiGLU, got activation 'gelu'"),
    ({"moe_every_n_layers": 2}, "mixture of experts .*nomic-embed-text-v2-moe"),
    ({"qkv_proj_bias": True}, "biases all or none"),
])
def test_what_corellm_does_not_compute_is_refused_by_name(tiny_nomic, tmp_path, change, says):
    hf, _, _, directory = tiny_nomic
    for f in directory.iterdir():
        if f.is_file():
            (tmp_path / f.name).write_bytes(f.read_bytes())
    (tmp_path / "config.json").write_text(json.dumps(hub_config(hf, **change)))
    with pytest.raises(ValueError, match=says):
        LLM(str(tmp_path), dtype="float32")


# the Hub checkpoint's names -> llama.cpp's ("nomic-bert")
GGUF_NAMES = {"emb_ln": "token_embd_norm", "embeddings.word_embeddings": "token_embd",
              "embeddings.token_type_embeddings": "token_types", "attn.Wqkv": "attn_qkv", "attn.out_proj": "attn_output",
              "norm1": "attn_output_norm", "mlp.fc11": "ffn_up", "mlp.fc12": "ffn_gate", "mlp.fc2": "ffn_down",
              "norm2": "layer_output_norm"}


def write_nomic_gguf(hf, directory, vocab: list[str], path, tensor_type: str = "F32") -> None:
    """llama.cpp's layout of a NomicBertModel: its keys (rope.freq_base, mean pooling), the
    phantom-space vocabulary, its tensor names, 2-D projection weights in `tensor_type`."""
    c = hf.config
    w = gguf.GGUFWriter(str(path), "nomic-bert")
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_layer_norm_eps(c.layer_norm_eps)
    w.add_causal_attention(False)
    w.add_rope_freq_base(1000.0)
    w.add_pooling_type(gguf.PoolingType.MEAN)
    add_wordpiece_vocabulary(w, vocab, c.type_vocab_size)
    with safe_open(str(directory / "model.safetensors"), framework="np") as f:
        arrays = {name: f.get_tensor(name).astype(np.float32) for name in f.keys()}
    add_encoder_tensors(w, arrays, "encoder.layers.", GGUF_NAMES, GGUF_NAMES, tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.parametrize("tensor_type", ["F32", "Q8_0"])
def test_a_nomic_bert_gguf_embeds_as_transformers(tiny_nomic, tmp_path, tensor_type):
    hf, tokenizer, vocab, directory = tiny_nomic
    path = tmp_path / "nomic.gguf"
    write_nomic_gguf(hf, directory, vocab, path, tensor_type)
    llm = LLM(str(path), dtype="float32", max_num_seqs=8)
    assert llm.engine_core.model_runner.pooler.pooling_type == "MEAN"
    for text, out in zip(TEXTS, llm.embed(TEXTS, PoolingParams(normalize=False), use_tqdm=False)):
        encoding = tokenizer.encode(text)
        assert out.prompt_token_ids == encoding.ids
        got, want = torch.tensor(out.outputs.embedding, dtype=torch.float64), hf_mean(hf, encoding)
        if tensor_type == "F32":
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        else:
            assert float(torch.nn.functional.cosine_similarity(got, want, dim=0)) > 0.999


def test_a_gguf_files_model_is_declared_matryoshka_by_hf_overrides(tiny_nomic, tmp_path):
    """No GGUF key says a model is Matryoshka (nomic-embed-text-v1.5's files): hf_overrides'
    is_matryoshka / matryoshka_dimensions apply to a GGUF file, and only they."""
    hf, _, vocab, directory = tiny_nomic
    path = tmp_path / "nomic.gguf"
    write_nomic_gguf(hf, directory, vocab, path)
    with pytest.raises(ValueError, match="not a Matryoshka embedding model"):
        LLM(str(path), dtype="float32").embed(TEXTS[:1], PoolingParams(dimensions=16), use_tqdm=False)
    llm = LLM(str(path), dtype="float32", hf_overrides={"matryoshka_dimensions": [16, 32]})
    whole = llm.embed(TEXTS[:1], PoolingParams(normalize=False), use_tqdm=False)[0].outputs.embedding
    short = llm.embed(TEXTS[:1], PoolingParams(dimensions=16), use_tqdm=False)[0].outputs.embedding
    first = torch.tensor(whole[:16], dtype=torch.float64)
    torch.testing.assert_close(torch.tensor(short, dtype=torch.float64), first / first.norm(), atol=1e-6, rtol=1e-6)
    with pytest.raises(ValueError, match=r"hf_overrides \(\['rope_theta'\]\) apply to an HF model directory's .*\(a "
                                         r"GGUF file takes only is_matryoshka, matryoshka_dimensions\)"):
        LLM(str(path), dtype="float32", hf_overrides={"is_matryoshka": True, "rope_theta": 10.0})
