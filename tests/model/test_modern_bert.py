"""ModernBERT against transformers' ModernBertModel / ModernBertForSequenceClassification in fp32
on tiny random models: pre-norm layers, GeGLU (and SwiGLU), rotary positions with a base per layer kind, and
sliding-window layers (inputs longer than the window, so that the window matters), the config as
transformers 5 writes it and as its 4.x releases did (global_attn_every_n_layers,
global_rope_theta, ...: the same vectors); a classifier pooling CLS or MEAN; bf16 vectors the same
alone and in a batch; what corellm does not compute refused by name."""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from corellm import LLM, PoolingParams  # noqa: E402
from tests.model.test_bert import encode  # noqa: E402

# 3 layers (the first and a third global, as ModernBERT's global_attn_every_n_layers 3), a window of
# 8 positions each side (local_attention 16), bases far apart so that a wrong one shows
CONFIG = dict(vocab_size=384, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
              max_position_embeddings=128, local_attention=16, pad_token_id=0, bos_token_id=2, eos_token_id=3,
              cls_token_id=2, sep_token_id=3, norm_eps=1e-5)
LONG = " ".join(f"w{10 + (i * 7) % 300}" for i in range(40))
PROMPTS = ["w5 w7 w9 w11 w13", "w3", LONG, "w300 w17 w17 w17 w4 w99 w100 w101 w250 w3 w8 w60 w61 w62 w63 w64 w65"]


def make_modernbert(directory, tokenizer_json, seed: int, labels: tuple[str, ...] | None = None, **overrides):
    fields = {**CONFIG, **overrides}
    cls = "ModernBertModel"
    if labels is not None:
        fields.update(num_labels=len(labels), id2label=dict(enumerate(labels)),
                      label2id={name: i for i, name in enumerate(labels)})
        cls = "ModernBertForSequenceClassification"
    torch.manual_seed(seed)
    model = getattr(transformers, cls)(transformers.ModernBertConfig(**fields)).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.normal_(1.0 if name.endswith("weight") else 0.0, 0.2)
            elif "Wqkv" in name:  # attention far from uniform, so that positions and windows show
                p.normal_(0.0, 0.15)
            elif name.endswith("bias"):
                p.normal_(0.0, 0.2)
    model.save_pretrained(directory, safe_serialization=True)
    (directory / "tokenizer.json").write_bytes(tokenizer_json.read_bytes())
    return model


def hf_rows(hf, encoding) -> torch.Tensor:
    base = getattr(hf, "model", hf)
    with torch.no_grad():
        return base(torch.tensor([encoding.ids])).last_hidden_state[0].double()


def embed(directory, prompts, pooling: str, **engine) -> list[torch.Tensor]:
    (directory / "1_Pooling").mkdir(exist_ok=True)
    (directory / "1_Pooling" / "config.json").write_text(json.dumps({f"pooling_mode_{pooling}": True}))
    llm = LLM(str(directory), dtype=engine.pop("dtype", "float32"), max_num_seqs=8, **engine)
    return [torch.tensor(o.outputs.embedding, dtype=torch.float64)
            for o in llm.embed(prompts, PoolingParams(normalize=False), use_tqdm=False)]


@pytest.mark.parametrize("pooling, activation", [("cls_token", "gelu"), ("mean_tokens", "gelu"),
                                                 ("mean_tokens", "silu")])  # silu: IBM's granite-embedding r2
def test_embeddings_are_transformers_pooled(tmp_path, tokenizer_json, pooling, activation):
    hf = make_modernbert(tmp_path, tokenizer_json, seed=1, hidden_activation=activation)
    assert hf.config.layer_types == ["full_attention", "sliding_attention", "sliding_attention", "full_attention"]
    for prompt, got in zip(PROMPTS, embed(tmp_path, PROMPTS, pooling)):
        rows = hf_rows(hf, encode(tokenizer_json, prompt))
        torch.testing.assert_close(got, rows[0] if pooling == "cls_token" else rows.mean(0), atol=2e-5, rtol=2e-5)


def test_the_window_and_each_kinds_base_matter(tmp_path, tokenizer_json):
    """The long input (42 tokens, a window of 8 each side): with every layer global, or the bases
    swapped, transformers' own vectors move, and corellm's follow them."""
    for n, overrides in enumerate([dict(layer_types=["full_attention"] * 4),
                                   dict(rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 10.0},
                                                         "sliding_attention": {"rope_type": "default",
                                                                               "rope_theta": 1000.0}})]):
        directory = tmp_path / str(n)
        directory.mkdir()
        hf = make_modernbert(directory, tokenizer_json, seed=1, **overrides)
        got = embed(directory, [LONG], "mean_tokens")[0]
        torch.testing.assert_close(got, hf_rows(hf, encode(tokenizer_json, LONG)).mean(0), atol=2e-5, rtol=2e-5)
    base = tmp_path / "base"
    base.mkdir()
    make_modernbert(base, tokenizer_json, seed=1)
    plain = embed(base, [LONG], "mean_tokens")[0]
    for n in (0, 1):
        assert (embed(tmp_path / str(n), [LONG], "mean_tokens")[0] - plain).abs().max() > 1e-4


def test_the_older_config_form_gives_the_same_vectors(tmp_path, tokenizer_json):
    hf = make_modernbert(tmp_path, tokenizer_json, seed=2)
    want = embed(tmp_path, PROMPTS, "mean_tokens")
    cfg = json.loads((tmp_path / "config.json").read_text())
    for key in ("layer_types", "rope_parameters"):
        cfg.pop(key)
    cfg.update(global_attn_every_n_layers=3, global_rope_theta=160000.0, local_rope_theta=10000.0)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert [v.tolist() for v in embed(tmp_path, PROMPTS, "mean_tokens")] == [v.tolist() for v in want]
    del hf


@pytest.mark.parametrize("classifier_pooling", ["cls", "mean"])
def test_classifier_logits_are_transformers(tmp_path, tokenizer_json, classifier_pooling):
    hf = make_modernbert(tmp_path, tokenizer_json, seed=3, labels=("negative", "positive"),
                         classifier_pooling=classifier_pooling, classifier_bias=True)
    llm = LLM(str(tmp_path), dtype="float32", max_num_seqs=8)
    assert llm.labels == ("negative", "positive")
    for prompt, out in zip(PROMPTS, llm.classify(PROMPTS, PoolingParams(use_activation=False), use_tqdm=False)):
        with torch.no_grad():
            want = hf(torch.tensor([encode(tokenizer_json, prompt).ids])).logits[0].double()
        torch.testing.assert_close(torch.tensor(out.outputs.probs, dtype=torch.float64), want, atol=2e-5, rtol=2e-5)


def test_a_vector_is_the_same_alone_and_in_a_batch_in_bf16(tmp_path, tokenizer_json):
    make_modernbert(tmp_path, tokenizer_json, seed=4)
    (tmp_path / "1_Pooling").mkdir()
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_mean_tokens": True}))
    llm = LLM(str(tmp_path), dtype="bfloat16", max_num_seqs=8)
    alone = [llm.embed([p], use_tqdm=False)[0].outputs.embedding for p in PROMPTS]
    assert [o.outputs.embedding for o in llm.embed(PROMPTS, use_tqdm=False)] == alone
    assert [o.outputs.embedding for o in llm.embed(PROMPTS[::-1], use_tqdm=False)] == alone[::-1]


@pytest.mark.parametrize("change, says", [
    ({"rope_scaling": {"rope_type": "linear", "factor": 2.0}}, "scaled rotary positions"),
    ({"hidden_activation": "relu"}, "hidden_activation 'relu' is not supported"),
    ({"attention_bias": True}, "biases both or neither"),
    ({"layer_types": ["full_attention", "chunked_attention", "full_attention", "full_attention"]},
     "layer_types must name 4 layers"),
])
def test_what_corellm_does_not_compute_is_refused_by_name(tmp_path, tokenizer_json, change, says):
    make_modernbert(tmp_path, tokenizer_json, seed=5)
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, **change}))
    with pytest.raises(ValueError, match=says):
        LLM(str(tmp_path), dtype="float32")


def test_a_modernbert_cross_encoder_scores_each_pair(tmp_path, tokenizer_json):
    """LLM.score on a one-label ModernBertForSequenceClassification (gte-reranker-modernbert's
    form): the sigmoid of its logit on the pair's ids (ModernBERT reads no token types)."""
    hf = make_modernbert(tmp_path, tokenizer_json, seed=6, labels=("relevance",), classifier_pooling="mean")
    llm = LLM(str(tmp_path), dtype="float32", max_num_seqs=8)
    query, documents = "w10 w11 w12", ["w10 w11", LONG, "w12"]
    for document, out in zip(documents, llm.score(query, documents, use_tqdm=False)):
        ids = encode(tokenizer_json, query, document).ids
        assert out.prompt_token_ids == ids
        with torch.no_grad():
            logit = hf(torch.tensor([ids])).logits[0, 0]
        assert abs(out.outputs.score - torch.sigmoid(logit).item()) < 2e-5
