"""Encoder-only models served (BERT: model/bert.py): an embedding model's /v1/embeddings are the
engine's own vectors (LLM.embed, bit for bit) and its /rerank the cosine similarities; a BERT
cross-encoder's /rerank and /score are LLM.score's, each pair with its token types, cut together
with its ids by truncate_prompt_tokens; generation is a 400 that says why."""

from __future__ import annotations

import pytest

from corellm import LLM
from tests.model.test_bert import make_encoder, write_bert_tokenizer
from tests.server.conftest import Server
from tests.server.http_calls import post

pytest.importorskip("transformers")

TEXTS = ["w5 w7 w9 w11", "w4 w8", "w100 w101 w102 w103 w104 w105"]


@pytest.fixture(scope="module")
def tokenizer_json(tmp_path_factory):
    return write_bert_tokenizer(tmp_path_factory.mktemp("tok"))


def _served(tmp_path_factory, tokenizer_json, name: str, **kwargs):
    directory = tmp_path_factory.mktemp(name)
    make_encoder("bert", directory, tokenizer_json, **kwargs)
    server = Server("--model", str(directory), "--dtype", "float32", "--max-model-len", "128")
    return server, LLM(str(directory), dtype="float32", max_num_seqs=8)


@pytest.fixture(scope="module")
def embedder(tmp_path_factory, tokenizer_json):
    server, offline = _served(tmp_path_factory, tokenizer_json, "embedder", seed=11, pooling="mean_tokens")
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
    assert [got[i] for i in range(len(want))] == pytest.approx(want, abs=1e-12)


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
    assert [got[i] for i in range(3)] == want
    status, body = post(server, "/score", {"text_1": query, "text_2": documents})
    assert status == 200 and [d["score"] for d in body["data"]] == want, body
    # Cut to its last 4 tokens ("w201 w202 w203 [SEP]", all of type 1): the same as those ids with those types.
    status, cut = post(server, "/score", {"text_1": query, "text_2": documents[1], "truncate_prompt_tokens": 4})
    assert status == 200, cut
    ids, types = offline.get_tokenizer().encode_pair(query, documents[1])
    same = offline.classify([{"prompt_token_ids": ids[-4:], "token_type_ids": types[-4:]}], use_tqdm=False)[0]
    assert cut["data"][0]["score"] == same.outputs.probs[0]
