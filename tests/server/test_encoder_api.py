"""Encoder-only models served (BERT: model/bert.py): an embedding model's /v1/embeddings are the
engine's own vectors (LLM.embed, bit for bit) and its /rerank the cosine similarities; a BERT
cross-encoder's /rerank and /score are LLM.score's, each pair with its token types, cut together
with its ids by truncate_prompt_tokens; generation is a 400 that says why. A Matryoshka model's
(config.json's matryoshka_dimensions) `dimensions` gives its vectors' first values, normalized again."""

from __future__ import annotations

import json

import numpy as np
import pytest

from corellm import LLM, PoolingParams
from tests.model.test_bert import make_encoder, write_bert_tokenizer
from tests.server.conftest import Server
from tests.server.http_calls import post

pytest.importorskip("transformers")

TEXTS = ["w5 w7 w9 w11", "w4 w8", "w100 w101 w102 w103 w104 w105"]


@pytest.fixture(scope="module")
def tokenizer_json(tmp_path_factory):
    return write_bert_tokenizer(tmp_path_factory.mktemp("tok"))


MATRYOSHKA_DIMENSIONS = [8, 16, 32]


def _served(tmp_path_factory, tokenizer_json, name: str, matryoshka: bool = False, **kwargs):
    directory = tmp_path_factory.mktemp(name)
    make_encoder("bert", directory, tokenizer_json, **kwargs)
    if matryoshka:  # as jina-embeddings-v3's config.json declares its lengths
        config = json.loads((directory / "config.json").read_text())
        (directory / "config.json").write_text(json.dumps({**config, "matryoshka_dimensions": MATRYOSHKA_DIMENSIONS}))
    server = Server("--model", str(directory), "--dtype", "float32", "--max-model-len", "128")
    return server, LLM(str(directory), dtype="float32", max_num_seqs=8)


@pytest.fixture(scope="module")
def embedder(tmp_path_factory, tokenizer_json):
    server, offline = _served(tmp_path_factory, tokenizer_json, "embedder", seed=11, pooling="mean_tokens",
                               matryoshka=True)
    yield server, offline
    server.stop()


@pytest.fixture(scope="module")
def cross_encoder(tmp_path_factory, tokenizer_json):
    server, offline = _served(tmp_path_factory, tokenizer_json, "cross_encoder", seed=12, labels=("relevance",))
    yield server, offline
    server.stop()


def test_embeddings_are_the_engines(embedder):
    server, offline = embedder
    assert "an encoder-only model (BertModel)" in server.output()
    status, body = post(server, "/v1/embeddings", {"input": TEXTS})
    assert status == 200, body
    assert [d["embedding"] for d in body["data"]] == [o.outputs.embedding for o in offline.embed(TEXTS, use_tqdm=False)]
    assert body["usage"]["prompt_tokens"] == sum(len(t.split()) + 2 for t in TEXTS)


def test_an_input_longer_than_the_context_is_cut_by_truncate_prompt_tokens(embedder):
    """-1 keeps as many tokens as the context holds (127 of 128 positions: one is the position of the
    token that ends a request); without it the input is a 400 naming the limit."""
    server, offline = embedder
    long = " ".join(f"w{10 + i}" for i in range(200))
    status, body = post(server, "/v1/embeddings", {"input": long})
    assert status == 400 and "maximum context length is 128 tokens. However, your input has 202 tokens; an input " \
        "takes at most 127 tokens" in body["error"]["message"], body
    status, body = post(server, "/v1/embeddings", {"input": long, "truncate_prompt_tokens": -1})
    assert status == 200 and body["usage"]["prompt_tokens"] == 127, body
    ids = offline.get_tokenizer().encode(long)[-127:]
    assert body["data"][0]["embedding"] == offline.embed([{"prompt_token_ids": ids}], use_tqdm=False)[0].outputs.embedding


def test_rerank_with_an_embedding_model_gives_cosine_similarities(embedder):
    server, offline = embedder
    status, body = post(server, "/rerank", {"query": TEXTS[0], "documents": TEXTS[1:], "top_n": 0})
    assert status == 200, body
    want = [o.outputs.score for o in offline.score(TEXTS[0], TEXTS[1:], use_tqdm=False)]
    got = {r["index"]: r["relevance_score"] for r in body["results"]}
    # float32: torch's GEMM sums depend on the step's rows, which the server and the offline engine
    # may cut differently (bf16 would be bit-identical)
    assert [got[i] for i in range(len(want))] == pytest.approx(want, rel=1e-5, abs=1e-7)


def test_generation_is_refused_by_name(embedder):
    server, _ = embedder
    for path, body in (("/v1/completions", {"prompt": "w5", "max_tokens": 2}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": "w5"}]})):
        status, reply = post(server, path, body)
        assert status == 400 and "is an encoder" in reply["error"]["message"], reply


def test_a_cross_encoders_scores_are_llm_score_with_token_types(cross_encoder):
    server, offline = cross_encoder
    query, documents = "w10 w11 w12", ["w10 w11", "w200 w201 w202 w203", "w12"]
    want = [o.outputs.score for o in offline.score(query, documents, use_tqdm=False)]
    status, body = post(server, "/rerank", {"query": query, "documents": documents})
    assert status == 200, body
    got = {r["index"]: r["relevance_score"] for r in body["results"]}
    assert [got[i] for i in range(3)] == pytest.approx(want, rel=1e-5, abs=1e-7)  # float32: as above
    status, body = post(server, "/score", {"text_1": query, "text_2": documents})
    assert status == 200 and [d["score"] for d in body["data"]] == pytest.approx(want, rel=1e-5, abs=1e-7), body
    # Cut to its last 4 tokens ("w201 w202 w203 [SEP]", all of type 1): the same as those ids with those types.
    status, cut = post(server, "/score", {"text_1": query, "text_2": documents[1], "truncate_prompt_tokens": 4})
    assert status == 200, cut
    ids, types = offline.get_tokenizer().encode_pair(query, documents[1])
    same = offline.classify([{"prompt_token_ids": ids[-4:], "token_type_ids": types[-4:]}], use_tqdm=False)[0]
    assert cut["data"][0]["score"] == same.outputs.probs[0]


def test_dimensions_keep_a_matryoshka_models_first_values(embedder):
    """dimensions=n: the pooled vector's first n values, L2-normalized (vLLM's order), the same on the
    server and offline; a length the config does not list, or past the hidden size, is a 400."""
    server, offline = embedder
    whole = offline.embed(TEXTS, PoolingParams(normalize=False), use_tqdm=False)
    for n in MATRYOSHKA_DIMENSIONS:
        status, body = post(server, "/v1/embeddings", {"input": TEXTS, "dimensions": n})
        assert status == 200, body
        short = offline.embed(TEXTS, PoolingParams(dimensions=n), use_tqdm=False)
        for d, o, w in zip(body["data"], short, whole):
            assert d["embedding"] == o.outputs.embedding and len(d["embedding"]) == n
            first = np.asarray(w.outputs.embedding[:n], dtype=np.float64)
            assert np.allclose(d["embedding"], first / np.linalg.norm(first), atol=1e-6)
    for n, says in ((12, "supports the Matryoshka lengths [8, 16, 32], got 12"), (65, "1 to 64 values, got 65")):
        status, body = post(server, "/v1/embeddings", {"input": TEXTS[0], "dimensions": n})
        assert status == 400 and body["error"]["param"] == "dimensions" and says in body["error"]["message"], body
        with pytest.raises(ValueError, match=says.replace("[", r"\[").replace("]", r"\]")):
            offline.embed(TEXTS[0], PoolingParams(dimensions=n), use_tqdm=False)

