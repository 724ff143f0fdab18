"""Encoder-only models (BERT, RoBERTa, XLM-RoBERTa: model/bert.py) through LLM.embed, LLM.classify
and LLM.score, against transformers in fp32 on tiny random models: the embeddings (CLS and MEAN
pooling of last_hidden_state), a classifier's logits, a cross-encoder's pair with its token types;
in bf16 an input's vector is bit-identical alone and in a batch; generation, token types on a
decoder and the options an encoder lacks are refused by name."""

from __future__ import annotations

import json

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers, processors

from corellm import LLM, PoolingParams, SamplingParams, TokensPrompt
from corellm.model.encoder_config import EncoderConfig

transformers = pytest.importorskip("transformers")

ENGINE = dict(max_num_seqs=8)
TINY = dict(vocab_size=384, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
            max_position_embeddings=128, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
# (config class, model class) per family; XLM-R numbers positions from padding_idx + 1 and has one token type.
FAMILIES = {"bert": ("BertConfig", "BertModel", dict(type_vocab_size=2)),
            "xlm-roberta": ("XLMRobertaConfig", "XLMRobertaModel", dict(type_vocab_size=1, pad_token_id=1,
                                                                       max_position_embeddings=130)),
            "roberta": ("RobertaConfig", "RobertaModel", dict(type_vocab_size=1, pad_token_id=1,
                                                             max_position_embeddings=130, hidden_act="gelu_new")),
            # rotary positions (its default base, 1000), SwiGLU, projections without biases
            "nomic": ("NomicBertConfig", "NomicBertModel", dict(type_vocab_size=2, hidden_act="silu"))}
PROMPTS = ["w5 w7 w9 w11 w13", "w3", "w300 w17 w17 w17 w4 w99 w100 w101 w250 w3 w8 w60 w61 w62 w63 w64 w65 w66",
           "w42 w43"]


def write_bert_tokenizer(directory):
    """Words w0..w383 as ids 0..383; BERT's template: "w2 A w3" for one text, "w2 A w3 B w3" for a
    pair, whose second text and last separator are token type 1. Returns the tokenizer.json's path."""
    t = Tokenizer(models.WordLevel({f"w{i}": i for i in range(384)}, unk_token="w0"))
    t.pre_tokenizer = pre_tokenizers.Whitespace()
    t.post_processor = processors.TemplateProcessing(single="w2 $A w3", pair="w2 $A w3 $B:1 w3:1",
                                                     special_tokens=[("w2", 2), ("w3", 3)])
    path = directory / "tokenizer.json"
    t.save(str(path))
    return path


@pytest.fixture(scope="module")
def tokenizer_json(tmp_path_factory):
    return write_bert_tokenizer(tmp_path_factory.mktemp("tok"))


def make_encoder(family: str, directory, tokenizer_json, seed: int = 0, labels: tuple[str, ...] | None = None,
                 pooling: str | None = None, **overrides):
    """The tiny random encoder of `family` (a sequence classifier over `labels` unless None), its
    biases and norm weights drawn too; saved with the tokenizer (and a sentence-transformers
    pooling config naming `pooling`); returned in fp32, eval mode."""
    config_cls, model_cls, extra = FAMILIES[family]
    fields = {**TINY, **extra, **overrides}
    if labels is not None:
        fields.update(num_labels=len(labels), id2label=dict(enumerate(labels)),
                      label2id={name: i for i, name in enumerate(labels)})
        model_cls = model_cls.replace("Model", "ForSequenceClassification")
    torch.manual_seed(seed)
    model = getattr(transformers, model_cls)(getattr(transformers, config_cls)(**fields)).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            norm = "LayerNorm" in name or "layernorm" in name  # (BERT's names; Nomic BERT's)
            if name.endswith("bias") or norm:
                p.normal_(1.0 if norm and name.endswith("weight") else 0.0, 0.2)
            elif "classifier" in name or "pooler" in name:
                p.normal_(0.0, 0.3)
    model.save_pretrained(directory, safe_serialization=True)
    (directory / "tokenizer.json").write_bytes(tokenizer_json.read_bytes())
    if pooling is not None:
        (directory / "1_Pooling").mkdir()
        (directory / "1_Pooling" / "config.json").write_text(json.dumps({f"pooling_mode_{pooling}": True}))
    return model


def encode(tokenizer_json, first: str, second: str | None = None):
    return Tokenizer.from_file(str(tokenizer_json)).encode(first, second)


def hf_hidden(hf, encoding) -> torch.Tensor:
    """transformers' last_hidden_state of one input, float64 [n, hidden]."""
    base = getattr(hf, hf.base_model_prefix, hf)
    with torch.no_grad():
        return base(torch.tensor([encoding.ids]), token_type_ids=torch.tensor([encoding.type_ids])
                    ).last_hidden_state[0].double()


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("pooling", ["cls_token", "mean_tokens"])
def test_embeddings_are_transformers_pooled(family, pooling, tmp_path, tokenizer_json):
    hf = make_encoder(family, tmp_path, tokenizer_json, seed=1, pooling=pooling)
    llm = LLM(str(tmp_path), dtype="float32", **ENGINE)
    outputs = llm.embed(PROMPTS, PoolingParams(normalize=False), use_tqdm=False)
    for prompt, out in zip(PROMPTS, outputs):
        encoding = encode(tokenizer_json, prompt)
        assert out.prompt_token_ids == encoding.ids
        rows = hf_hidden(hf, encoding)
        want = rows[0] if pooling == "cls_token" else rows.mean(0)
        torch.testing.assert_close(torch.tensor(out.outputs.embedding, dtype=torch.float64), want,
                                   atol=2e-5, rtol=2e-5)
    normalized = llm.embed(PROMPTS[:1], use_tqdm=False)[0].outputs.embedding
    assert abs(sum(x * x for x in normalized) - 1.0) < 1e-5


def test_an_encoder_pools_cls_without_a_pooling_config(tmp_path, tokenizer_json):
    hf = make_encoder("bert", tmp_path, tokenizer_json, seed=2)
    llm = LLM(str(tmp_path), dtype="float32", **ENGINE)
    out = llm.embed([PROMPTS[0]], PoolingParams(normalize=False), use_tqdm=False)[0]
    want = hf_hidden(hf, encode(tokenizer_json, PROMPTS[0]))[0]
    torch.testing.assert_close(torch.tensor(out.outputs.embedding, dtype=torch.float64), want, atol=2e-5, rtol=2e-5)


def test_token_types_reach_the_embedding(tmp_path, tokenizer_json):
    """A TokensPrompt's token_type_ids select the token-type rows, as transformers' do."""
    hf = make_encoder("bert", tmp_path, tokenizer_json, seed=3, pooling="mean_tokens")
    llm = LLM(str(tmp_path), dtype="float32", **ENGINE)
    encoding = encode(tokenizer_json, "w10 w11 w12", "w200 w201")
    assert set(encoding.type_ids) == {0, 1}
    typed, untyped = llm.embed([TokensPrompt(prompt_token_ids=encoding.ids, token_type_ids=encoding.type_ids),
                                TokensPrompt(prompt_token_ids=encoding.ids)], PoolingParams(normalize=False),
                               use_tqdm=False)
    torch.testing.assert_close(torch.tensor(typed.outputs.embedding, dtype=torch.float64),
                               hf_hidden(hf, encoding).mean(0), atol=2e-5, rtol=2e-5)
    assert max(abs(a - b) for a, b in zip(typed.outputs.embedding, untyped.outputs.embedding)) > 1e-2


def test_an_inputs_vector_does_not_depend_on_the_batch_in_bf16(tmp_path, tokenizer_json):
    make_encoder("xlm-roberta", tmp_path, tokenizer_json, seed=4, pooling="mean_tokens")
    llm = LLM(str(tmp_path), dtype="bfloat16", **ENGINE)
    alone = [llm.embed([p], use_tqdm=False)[0].outputs.embedding for p in PROMPTS]
    assert [o.outputs.embedding for o in llm.embed(PROMPTS, use_tqdm=False)] == alone
    assert [o.outputs.embedding for o in llm.embed(PROMPTS[::-1], use_tqdm=False)] == alone[::-1]


@pytest.mark.parametrize("family", ["bert", "xlm-roberta"])
def test_classifier_logits_are_transformers(family, tmp_path, tokenizer_json):
    hf = make_encoder(family, tmp_path, tokenizer_json, seed=5, labels=("negative", "neutral", "positive"))
    llm = LLM(str(tmp_path), dtype="float32", **ENGINE)
    assert llm.labels == ("negative", "neutral", "positive")
    logits = llm.classify(PROMPTS, PoolingParams(use_activation=False), use_tqdm=False)
    probs = llm.classify(PROMPTS, use_tqdm=False)
    for prompt, raw, p in zip(PROMPTS, logits, probs):
        encoding = encode(tokenizer_json, prompt)
        with torch.no_grad():
            want = hf(torch.tensor([encoding.ids]), token_type_ids=torch.tensor([encoding.type_ids])).logits[0].double()
        torch.testing.assert_close(torch.tensor(raw.outputs.probs, dtype=torch.float64), want, atol=2e-5, rtol=2e-5)
        torch.testing.assert_close(torch.tensor(p.outputs.probs, dtype=torch.float64), torch.softmax(want, 0),
                                   atol=2e-5, rtol=2e-5)


def test_a_bert_cross_encoder_scores_each_pair_with_its_token_types(tmp_path, tokenizer_json):
    """LLM.score on a one-label BERT classifier: the sigmoid of its logit on the pair's encoding,
    the second text as token type 1 (as sentence-transformers' CrossEncoder feeds transformers)."""
    hf = make_encoder("bert", tmp_path, tokenizer_json, seed=6, labels=("relevance",))
    llm = LLM(str(tmp_path), dtype="float32", **ENGINE)
    query, documents = "w10 w11 w12", ["w10 w11", "w200 w201 w202 w203", "w12"]
    scores = llm.score(query, documents, use_tqdm=False)
    for document, out in zip(documents, scores):
        encoding = encode(tokenizer_json, query, document)
        assert out.prompt_token_ids == encoding.ids
        with torch.no_grad():
            logit = hf(torch.tensor([encoding.ids]), token_type_ids=torch.tensor([encoding.type_ids])).logits[0, 0]
            untyped = hf(torch.tensor([encoding.ids])).logits[0, 0]
        assert abs(out.outputs.score - torch.sigmoid(logit).item()) < 2e-5
        assert abs(out.outputs.score - torch.sigmoid(untyped).item()) > 1e-3  # the types matter here


def test_generation_and_what_an_encoder_lacks_are_refused(tmp_path, tokenizer_json):
    make_encoder("bert", tmp_path, tokenizer_json, seed=7)
    llm = LLM(str(tmp_path), dtype="float32", **ENGINE)
    with pytest.raises(ValueError, match="encoder .*not generation"):
        llm.generate(["w5 w6"], SamplingParams(max_tokens=3), use_tqdm=False)
    with pytest.raises(ValueError, match="not a sequence classifier"):
        llm.classify(["w5 w6"], use_tqdm=False)
    with pytest.raises(ValueError, match=r"token_type_ids must be 2 integers .*\[0, 2\)"):
        llm.embed([TokensPrompt(prompt_token_ids=[2, 5], token_type_ids=[0, 2])], use_tqdm=False)
    with pytest.raises(ValueError, match="token_type_ids must be 2 integers"):
        llm.embed([TokensPrompt(prompt_token_ids=[2, 5], token_type_ids=[0])], use_tqdm=False)
    with pytest.raises(ValueError, match="tensor parallelism is not supported for an encoder-only model"):
        LLM(str(tmp_path), dtype="float32", tensor_parallel_size=2)
    with pytest.raises(ValueError, match="LoRA adapters are not supported for an encoder-only model"):
        LLM(str(tmp_path), dtype="float32", enable_lora=True)
    with pytest.raises(ValueError, match=r"max_model_len \(200\) exceeds the model's context length \(128"):
        LLM(str(tmp_path), dtype="float32", max_model_len=200)
    with pytest.raises(ValueError, match="kv_cache_dtype fp8: an encoder-only model .* keeps no KV cache"):
        LLM(str(tmp_path), dtype="bfloat16", kv_cache_dtype="fp8")


def test_an_input_is_computed_whole_and_its_length_bounded(tmp_path, tokenizer_json):
    """No chunked prefill and no prefix caching for an encoder: a step budget below the context is
    raised to it, and a repeated input is computed again (its vector the same); an input of the
    whole context is refused by name."""
    make_encoder("bert", tmp_path, tokenizer_json, seed=8, pooling="mean_tokens")
    llm = LLM(str(tmp_path), dtype="bfloat16", max_num_batched_tokens=16, **ENGINE)
    config = llm.engine_core.scheduler_config
    assert (config.max_num_batched_tokens, config.enable_chunked_prefill, config.enable_prefix_caching) == \
        (128, False, False)
    long = " ".join(f"w{10 + i}" for i in range(100))
    first, again = llm.embed([long, long], use_tqdm=False)
    assert first.outputs.embedding == again.outputs.embedding
    with pytest.raises(ValueError, match=r"The input \(128 tokens\) is too long .* at most 127 tokens"):
        llm.embed([TokensPrompt(prompt_token_ids=[5] * 128)], use_tqdm=False)


def test_token_types_on_a_decoder_are_refused(tmp_path, tokenizer_json):
    from tests.model.tiny_models import make_tiny_model

    make_tiny_model("llama3", tmp_path, tokenizer_json)
    llm = LLM(str(tmp_path), dtype="float32", max_model_len=64, kv_cache_memory=8 * 1024**2)
    with pytest.raises(ValueError, match="reads no token types"):
        llm.embed([TokensPrompt(prompt_token_ids=[2, 5], token_type_ids=[0, 0])], use_tqdm=False)


def test_config_refusals_name_the_field(tmp_path):
    base = {"architectures": ["BertModel"], "vocab_size": 10, "hidden_size": 8, "intermediate_size": 16,
            "num_hidden_layers": 1, "num_attention_heads": 2}
    assert EncoderConfig.from_hf_config(base).max_input_positions == 512
    # sentence-transformers' max_seq_length, where shorter than the positions, bounds the input
    assert EncoderConfig.from_hf_config(base, sentence_config={"max_seq_length": 256}).max_input_positions == 256
    assert EncoderConfig.from_hf_config(base, sentence_config={"max_seq_length": 1024}).max_input_positions == 512
    with pytest.raises(ValueError, match="max_seq_length must be an integer >= 2, got '256'"):
        EncoderConfig.from_hf_config(base, sentence_config={"max_seq_length": "256"})
    with pytest.raises(ValueError, match="position_embedding_type 'relative_key'"):
        EncoderConfig.from_hf_config({**base, "position_embedding_type": "relative_key"})
    with pytest.raises(ValueError, match="hidden_act 'swish'"):
        EncoderConfig.from_hf_config({**base, "hidden_act": "swish"})
    with pytest.raises(ValueError, match="is_decoder"):
        EncoderConfig.from_hf_config({**base, "is_decoder": True})
    with pytest.raises(ValueError, match="multi_label_classification"):
        EncoderConfig.from_hf_config({**base, "architectures": ["BertForSequenceClassification"],
                                      "problem_type": "multi_label_classification"})
    roberta = EncoderConfig.from_hf_config({**base, "architectures": ["XLMRobertaModel"], "pad_token_id": 1,
                                            "max_position_embeddings": 514})
    assert (roberta.position_offset, roberta.max_input_positions) == (2, 512)


def test_checkpoint_names_are_read_as_transformers_reads_them_and_bad_ones_named(tmp_path, tokenizer_json):
    """An older file's LayerNorm gamma / beta and a task model's "bert." prefix load as transformers
    loads them (the same vectors); a tensor the model has no place for, one of the wrong shape and a
    missing one are ValueErrors naming the tensor. A masked-LM head beside the encoder is not read."""
    from safetensors.torch import load_file, save_file

    make_encoder("bert", tmp_path, tokenizer_json, seed=9, pooling="mean_tokens")
    want = LLM(str(tmp_path), dtype="float32", **ENGINE).embed(PROMPTS, use_tqdm=False)
    tensors = load_file(str(tmp_path / "model.safetensors"))

    def save(named: dict) -> None:
        save_file(named, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})

    renamed = {"bert." + k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
               for k, v in tensors.items()}
    save({**renamed, "cls.predictions.bias": torch.zeros(384)})
    got = LLM(str(tmp_path), dtype="float32", **ENGINE).embed(PROMPTS, use_tqdm=False)
    assert [o.outputs.embedding for o in got] == [o.outputs.embedding for o in want]
    save({**tensors, "encoder.layer.0.attention.self.rotary.weight": torch.zeros(4)})
    with pytest.raises(ValueError, match="unexpected tensor 'encoder.layer.0.attention.self.rotary.weight'"):
        LLM(str(tmp_path), dtype="float32", **ENGINE)
    save({**tensors, "encoder.layer.1.attention.self.key.weight": torch.zeros(64, 32)})
    with pytest.raises(ValueError, match=r"'encoder.layer.1.attention.self.key.weight' has shape \(64, 32\), but the "
                                         r"config implies \(64, 64\)"):
        LLM(str(tmp_path), dtype="float32", **ENGINE)
    save({k: v for k, v in tensors.items() if k != "encoder.layer.1.output.LayerNorm.bias"})
    with pytest.raises(ValueError, match=r"missing tensors \['encoder.layer.1.output.LayerNorm.bias'\]"):
        LLM(str(tmp_path), dtype="float32", **ENGINE)
