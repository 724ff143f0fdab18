"""A sequence classifier served: POST /classify (and /v1/classify) gives each input's label
probabilities — the engine's own (LLM.classify, bit for bit), the most probable label named — or
its logits (use_activation false); with a one-label classifier (a cross-encoder) /score and /rerank
give its score of each pair encoded together, as LLM.score does. Generation on a classifier, and
/classify on a model that is not one, are 400s that say so."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, processors

from corellm import LLM, PoolingParams
from tests.model.tiny_models import make_tiny_classifier
from tests.server.conftest import Server
from tests.server.http_calls import post

pytest.importorskip("transformers")

ENGINE = dict(max_model_len=512, kv_cache_memory=256 * 1024**2)
TEXTS = ["w5 w7 w9 w11", "w1 w2 w3"]


def write_tokenizer(directory) -> None:
    t = Tokenizer(models.WordLevel({f"w{i}": i for i in range(384)}, unk_token="w0"))
    t.pre_tokenizer = pre_tokenizers.Whitespace()
    t.post_processor = processors.TemplateProcessing(single="w1 $A", pair="w1 $A w2 $B:1 w2:1",
                                                     special_tokens=[("w1", 1), ("w2", 2)])
    t.save(str(directory / "tokenizer.json"))


def same_up_to_float32_gemm(got: list, want: list) -> bool:
    """The server's values against the offline engine's. These models run in float32, whose
    projections go through torch's GEMM: its sums depend on the step's row count, and the server may
    put a request's inputs in one step or several, or chunk a prompt otherwise than the offline
    engine (in bf16 they would be bit-identical either way)."""
    return len(got) == len(want) and all(g == pytest.approx(w, rel=1e-5, abs=1e-7) for g, w in zip(got, want))


@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
    """(the server, the same model offline) for a three-label classifier."""
    directory = tmp_path_factory.mktemp("classifier")
    make_tiny_classifier("llama3", directory, seed=3)
    write_tokenizer(directory)
    server = Server("--model", str(directory), "--dtype", "float32")
    yield server, LLM(str(directory), dtype="float32", **ENGINE)
    server.stop()


@pytest.fixture(scope="module")
def cross_encoder(tmp_path_factory):
    directory = tmp_path_factory.mktemp("cross_encoder")
    make_tiny_classifier("qwen2", directory, seed=7, labels=("relevance",))
    write_tokenizer(directory)
    server = Server("--model", str(directory), "--dtype", "float32")
    yield server, LLM(str(directory), dtype="float32", **ENGINE)
    server.stop()


def test_classify_gives_the_engines_probabilities_and_the_most_probable_label(classifier):
    server, offline = classifier
    assert "a sequence classifier of 3 label(s) (negative, neutral, positive): it serves /classify and " \
        "embeddings" in server.output()
    want = [o.outputs.probs for o in offline.classify(TEXTS, use_tqdm=False)]
    for path in ("/classify", "/v1/classify"):
        status, body = post(server, path, {"input": TEXTS})
        assert status == 200, body
        assert same_up_to_float32_gemm([d["probs"] for d in body["data"]], want)
        assert [d["index"] for d in body["data"]] == [0, 1]
        assert [d["num_classes"] for d in body["data"]] == [3, 3]
        assert [d["label"] for d in body["data"]] == [offline.labels[p.index(max(p))] for p in want]
        assert body["object"] == "list" and body["id"].startswith("classify-")
        assert body["usage"]["prompt_tokens"] == sum(len(offline.get_tokenizer().encode(t)) for t in TEXTS)
    status, body = post(server, "/invocations", {"input": TEXTS})  # SageMaker's route: the served model's task
    assert status == 200 and same_up_to_float32_gemm([d["probs"] for d in body["data"]], want)
    ids = offline.get_tokenizer().encode(TEXTS[0])
    status, body = post(server, "/classify", {"input": ids, "use_activation": False})
    assert status == 200 and same_up_to_float32_gemm([body["data"][0]["probs"]], [offline.classify(
        TEXTS[:1], PoolingParams(use_activation=False), use_tqdm=False)[0].outputs.probs])


@pytest.mark.parametrize("path, body, param", [
    ("/v1/completions", {"prompt": "w5 w6", "max_tokens": 2}, None),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "w5"}]}, None),
    ("/score", {"queries": "w5", "documents": ["w6"]}, "model"),
    ("/classify", {"input": "w5", "use_activation": True, "activation": False}, "activation"),
    ("/classify", {"input": []}, "input"),
])
def test_what_a_classifier_does_not_serve_is_a_400_that_says_so(classifier, path, body, param):
    server, _ = classifier
    status, answer = post(server, path, body)
    assert status == 400, answer
    if param is not None:
        assert answer["error"]["param"] == param
    if path.startswith("/v1/c"):
        assert "sequence classifier" in answer["error"]["message"]


def test_classify_on_a_generator_is_a_400(server):
    status, body = post(server, "/classify", {"input": "Hello"})
    assert status == 400 and body["error"]["param"] == "model"
    assert "is not a sequence classifier" in body["error"]["message"]


def test_score_and_rerank_with_a_cross_encoder_are_its_scores_of_each_pair(cross_encoder):
    server, offline = cross_encoder
    query, documents = "w10 w11 w12", ["w10 w11", "w200 w201 w202", "w12"]
    want = [o.outputs.score for o in offline.score(query, documents, use_tqdm=False)]
    status, body = post(server, "/score", {"queries": query, "documents": documents})
    assert status == 200 and same_up_to_float32_gemm([d["score"] for d in body["data"]], want)
    pairs = [offline.get_tokenizer().encode_pair(query, d)[0] for d in documents]
    assert body["usage"]["prompt_tokens"] == sum(len(p) for p in pairs)
    status, body = post(server, "/v1/rerank", {"query": query, "documents": documents, "top_n": 2})
    assert status == 200
    best = sorted(range(3), key=lambda i: -want[i])[:2]
    assert [r["index"] for r in body["results"]] == best
    assert [r["relevance_score"] for r in body["results"]] == [want[i] for i in best]


def test_a_causal_reranker_served_with_hf_overrides_reranks_as_offline(tmp_path):
    """`corellm serve MODEL --hf-overrides JSON`: vLLM's way to serve Qwen3-Reranker as a cross-encoder."""
    import json

    from tests.model.tiny_models import make_tiny_model

    make_tiny_model("qwen3", tmp_path, seed=4)
    write_tokenizer(tmp_path)
    overrides = {"architectures": ["Qwen3ForSequenceClassification"], "classifier_from_token": ["w7", "w9"],
                 "is_original_qwen3_reranker": True}
    query, documents = "w10 w11 w12", ["w10 w11", "w200 w201 w202", "w12"]
    want = [o.outputs.score for o in LLM(str(tmp_path), dtype="float32", hf_overrides=overrides, **ENGINE).score(
        query, documents, use_tqdm=False)]
    server = Server("--model", str(tmp_path), "--dtype", "float32", "--hf-overrides", json.dumps(overrides))
    try:
        status, body = post(server, "/rerank", {"query": query, "documents": documents})
        assert status == 200, body
        assert sorted((r["index"], r["relevance_score"]) for r in body["results"]) == list(enumerate(want))
    finally:
        server.stop()
