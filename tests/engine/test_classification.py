"""Sequence classifiers (transformers' *ForSequenceClassification: a decoder whose last prompt row
times a score matrix gives label logits) through LLM.classify and, with one label (a cross-encoder),
LLM.score — against transformers in fp32 on tiny random models; in bf16 a prompt's probabilities are
bit-identical alone, in a batch and cut into 16-token chunks; generation is refused on a classifier
and classification on a generator, by name."""

from __future__ import annotations

import json

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers, processors

from corellm import LLM, PoolingParams, TokensPrompt
from corellm.model.model_config import ModelConfig
from tests.model.tiny_models import make_tiny_classifier, make_tiny_model

transformers = pytest.importorskip("transformers")

ENGINE = dict(max_model_len=256, kv_cache_memory=32 * 1024**2)
PROMPTS = ["w5 w7 w9 w11 w13", "w1 w2", "w300 w17 w17 w17 w4 w99 w100 w101 w250 w3 w8 w60 w61 w62 w63 w64 w65 w66 w67",
           "w42"]


@pytest.fixture(scope="module")
def tokenizer_json(tmp_path_factory):
    """Words w0..w383 as ids 0..383; w1 opens every input, and a pair (a cross-encoder's) is
    "w1 A w2 B w2", as a BERT-style template puts its [CLS] and [SEP]."""
    t = Tokenizer(models.WordLevel({f"w{i}": i for i in range(384)}, unk_token="w0"))
    t.pre_tokenizer = pre_tokenizers.Whitespace()
    t.post_processor = processors.TemplateProcessing(single="w1 $A", pair="w1 $A w2 $B:1 w2:1",
                                                     special_tokens=[("w1", 1), ("w2", 2)])
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    t.save(str(path))
    return path


def encode(tokenizer_json, first: str, second: str | None = None) -> list[int]:
    return Tokenizer.from_file(str(tokenizer_json)).encode(first, second).ids


@pytest.mark.parametrize("arch", ["llama3", "qwen2", "qwen3", "gemma2", "gemma3", "mixtral"])
def test_probabilities_and_logits_are_transformers(arch, tmp_path, tokenizer_json):
    hf = make_tiny_classifier(arch, tmp_path, tokenizer_json, seed=3)
    llm = LLM(str(tmp_path), dtype="float32", **ENGINE)
    assert llm.labels == ("negative", "neutral", "positive")
    probs = llm.classify(PROMPTS, use_tqdm=False)
    logits = llm.classify(PROMPTS, PoolingParams(use_activation=False), use_tqdm=False)
    for prompt, p, raw in zip(PROMPTS, probs, logits):
        ids = encode(tokenizer_json, prompt)
        assert p.prompt_token_ids == ids and p.outputs.num_classes == 3
        with torch.no_grad():
            want = hf(torch.tensor([ids])).logits[0].double()
        torch.testing.assert_close(torch.tensor(raw.outputs.probs, dtype=torch.float64), want, atol=2e-4, rtol=1e-4)
        torch.testing.assert_close(torch.tensor(p.outputs.probs, dtype=torch.float64), torch.softmax(want, 0),
                                   atol=1e-4, rtol=1e-4)


def test_a_prompts_probabilities_do_not_depend_on_the_batch_or_the_chunks(tmp_path, tokenizer_json):
    make_tiny_classifier("llama3", tmp_path, tokenizer_json, seed=5)
    alone = LLM(str(tmp_path), dtype="bfloat16", **ENGINE)
    chunked = LLM(loaded_model=alone.loaded, max_num_batched_tokens=16, max_num_seqs=2, **ENGINE)
    want = [alone.classify([p], use_tqdm=False)[0].outputs.probs for p in PROMPTS]
    assert [o.outputs.probs for o in chunked.classify(PROMPTS, use_tqdm=False)] == want
    assert [o.outputs.probs for o in alone.classify(PROMPTS, use_tqdm=False)] == want
    assert [o.outputs.probs for o in chunked.classify(PROMPTS, use_tqdm=False)] == want  # prefix-cache hits now


def test_a_cross_encoder_scores_each_pair_encoded_together(tmp_path, tokenizer_json):
    """A one-label classifier: LLM.score is its sigmoid on the tokenizer's pair encoding of
    (query, document) — here "w1 query w2 document w2" — as transformers reads the pair."""
    hf = make_tiny_classifier("qwen2", tmp_path, tokenizer_json, seed=7, labels=("relevance",))
    llm = LLM(str(tmp_path), dtype="float32", **ENGINE)
    query, documents = "w10 w11 w12", ["w10 w11", "w200 w201 w202 w203", "w12"]
    scores = llm.score(query, documents, use_tqdm=False)
    for document, out in zip(documents, scores):
        ids = encode(tokenizer_json, query, document)
        assert out.prompt_token_ids == ids and ids[0] == 1 and ids.count(2) == 2
        with torch.no_grad():
            want = torch.sigmoid(hf(torch.tensor([ids])).logits[0, 0].double()).item()
        assert out.outputs.score == pytest.approx(want, abs=1e-5)
    pairwise = llm.score([query, {"prompt": "w3"}], documents[:2], use_tqdm=False)
    assert [o.prompt_token_ids for o in pairwise] == [encode(tokenizer_json, query, documents[0]),
                                                      encode(tokenizer_json, "w3", documents[1])]
    with pytest.raises(ValueError, match="a cross-encoder scores texts, encoding each pair together: data_2 must "
                                         "be a text, got"):
        llm.score(query, TokensPrompt(prompt_token_ids=[5, 6]), use_tqdm=False)


def test_generation_on_a_classifier_and_classification_on_a_generator_are_refused(tmp_path, tokenizer_json):
    make_tiny_classifier("llama3", tmp_path / "classifier", tokenizer_json)
    classifier = LLM(str(tmp_path / "classifier"), dtype="float32", **ENGINE)
    with pytest.raises(ValueError, match=r"this model is a sequence classifier \(3 labels: negative, neutral, "
                                         r"positive\), which has no language-model head: it serves classify, score"):
        classifier.generate("w5 w6", use_tqdm=False)
    with pytest.raises(ValueError, match=r"needs one label \(a cross-encoder's relevance\); this model has 3"):
        classifier.score("w5", "w6", use_tqdm=False)
    assert len(classifier.embed("w5 w6", use_tqdm=False)[0].outputs.embedding) == 64  # its hidden states still
    make_tiny_model("llama3", tmp_path / "generator", tokenizer_json)
    generator = LLM(str(tmp_path / "generator"), dtype="float32", **ENGINE)
    assert generator.labels == ()
    with pytest.raises(ValueError, match="classify: this model is not a sequence classifier"):
        generator.classify("w5 w6", use_tqdm=False)


def test_a_classifiers_labels_come_from_its_config(tmp_path, tokenizer_json):
    make_tiny_classifier("llama3", tmp_path, tokenizer_json, labels=("no", "yes"))
    cfg = json.loads((tmp_path / "config.json").read_text())
    config = ModelConfig.from_hf_config(cfg)
    assert config.classifier_labels == ("no", "yes") and config.architecture == "LlamaForCausalLM"
    assert config.tie_word_embeddings  # the embedding stands in for the LM head the checkpoint lacks
    assert ModelConfig.from_hf_config({**cfg, "id2label": None, "num_labels": 3}).classifier_labels == (
        "LABEL_0", "LABEL_1", "LABEL_2")
    with pytest.raises(ValueError, match=r"id2label names ids \[0, 1\], num_labels is 3"):
        ModelConfig.from_hf_config({**cfg, "num_labels": 3})
    with pytest.raises(ValueError, match="is not supported; corellm runs .*, the sequence classifiers .* the encoders"):
        ModelConfig.from_hf_config({**cfg, "architectures": ["DebertaV2ForSequenceClassification"]})


@pytest.mark.parametrize("arch", ["qwen3", "qwen2"])  # an LM head of its own; the embedding tied as one
def test_a_causal_reranker_read_as_a_cross_encoder_is_its_yes_no_softmax(arch, tmp_path, tokenizer_json):
    """vLLM's hf_overrides for Qwen3-Reranker: the causal checkpoint as a Qwen3ForSequenceClassification
    whose one label's row is the LM head's "yes" row minus its "no" row (from_2_way_softmax), so
    that LLM.score is the softmax of the (no, yes) logits at the pair's last position; with
    no_post_processing, LLM.classify is the softmax over the named tokens' logits."""
    hf = make_tiny_model(arch, tmp_path, tokenizer_json, seed=4)
    overrides = {"architectures": [f"{'Qwen3' if arch == 'qwen3' else 'Qwen2'}ForSequenceClassification"],
                 "classifier_from_token": ["w7", "w9"], "is_original_qwen3_reranker": True}
    llm = LLM(str(tmp_path), dtype="float32", hf_overrides=overrides, **ENGINE)
    assert llm.labels == ("w9",)
    query, documents = "w10 w11 w12", ["w10 w11", "w200 w201 w202 w203"]
    for document, out in zip(documents, llm.score(query, documents, use_tqdm=False)):
        ids = encode(tokenizer_json, query, document)
        with torch.no_grad():
            last = hf(torch.tensor([ids])).logits[0, -1].double()
        assert out.outputs.score == pytest.approx(torch.softmax(last[[7, 9]], 0)[1].item(), abs=1e-5)
    three = LLM(str(tmp_path), dtype="float32", **ENGINE, hf_overrides={
        **overrides, "classifier_from_token": ["w3", "w4", "w5"], "is_original_qwen3_reranker": False})
    assert three.labels == ("w3", "w4", "w5")
    out = three.classify(PROMPTS[:2], use_tqdm=False)
    for prompt, o in zip(PROMPTS[:2], out):
        with torch.no_grad():
            last = hf(torch.tensor([encode(tokenizer_json, prompt)])).logits[0, -1].double()
        torch.testing.assert_close(torch.tensor(o.outputs.probs, dtype=torch.float64), torch.softmax(last[[3, 4, 5]], 0),
                                   atol=1e-5, rtol=1e-5)


def test_hf_overrides_that_cannot_apply_are_refused(tmp_path, tokenizer_json):
    make_tiny_model("qwen3", tmp_path, tokenizer_json)
    base = {"architectures": ["Qwen3ForSequenceClassification"]}
    with pytest.raises(ValueError, match=r"from_2_way_softmax takes two tokens \(false, true\), got \['w7'\]"):
        LLM(str(tmp_path), hf_overrides={**base, "classifier_from_token": ["w7"], "method": "from_2_way_softmax"},
            **ENGINE)
    with pytest.raises(ValueError, match="classifier_from_token 'nope nope' is not one token of the tokenizer"):
        LLM(str(tmp_path), hf_overrides={**base, "classifier_from_token": ["nope nope"]}, **ENGINE)
    with pytest.raises(ValueError, match="hf_overrides must be a dict of config.json fields"):
        LLM(str(tmp_path), hf_overrides=["architectures"], **ENGINE)
    with pytest.raises(ValueError, match=r"hf_overrides \(\['architectures'\]\) apply to an HF model directory's "
                                         r"config.json; .*\.gguf is not one"):
        LLM(hf_overrides=base, **ENGINE)  # the default model: a GGUF file


def test_a_lora_adapter_classifies_as_its_merged_model(tmp_path, tokenizer_json):
    """LLM.classify / LLM.score with lora_request (vLLM's): a PEFT adapter of the decoder's projections
    gives the probabilities of transformers' classifier with the adapter merged, the base model's
    without it, in one batch."""
    from corellm import LoRARequest
    from tests.lora_adapters import make_lora_adapter, merged

    hf = make_tiny_classifier("llama3", tmp_path / "model", tokenizer_json, seed=6)
    config = json.loads((tmp_path / "model" / "config.json").read_text())
    adapted = merged(hf, make_lora_adapter(tmp_path / "adapter", config, rank=8, seed=2, std=0.2))
    llm = LLM(str(tmp_path / "model"), dtype="float32", enable_lora=True, max_lora_rank=8, **ENGINE)
    lora = LoRARequest("adapter", 1, str(tmp_path / "adapter"))
    got = llm.classify(PROMPTS[:2] * 2, lora_request=[lora, lora, None, None], use_tqdm=False)
    for i, (prompt, out) in enumerate(zip(PROMPTS[:2] * 2, got)):
        with torch.no_grad():
            want = (adapted if i < 2 else hf)(torch.tensor([encode(tokenizer_json, prompt)])).logits[0].double()
        torch.testing.assert_close(torch.tensor(out.outputs.probs, dtype=torch.float64), torch.softmax(want, 0),
                                   atol=1e-4, rtol=1e-4)
    assert got[0].outputs.probs != got[2].outputs.probs
    with pytest.raises(ValueError, match="score's lora_request is one LoRARequest for every pair"):
        llm.score("w1", "w2", lora_request=[lora], use_tqdm=False)
