"""POST /v1/embeddings through the official openai client: the vectors are the engine's own
(LLM.embed, bit for bit), as floats or base64 float32, for strings and token ids; usage counts the
inputs' tokens; what is not made (dimensions: SmolLM2 is no Matryoshka model) and bad inputs are 400s
naming the field. /score and
/rerank: the cosine similarities of the same vectors, per pair and ranked."""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request

import numpy as np
import openai
import pytest

from corellm import LLM

MODEL = "SmolLM2-135M-Instruct"
TEXTS = ["The cat sat on the mat.", "Quantum computers use qubits."]


@pytest.fixture(scope="module")
def offline():
    return LLM(max_model_len=512, kv_cache_memory=64 * 1024**2)


def test_vectors_are_the_engines(client, offline):
    out = client.embeddings.create(model=MODEL, input=TEXTS)
    want = [o.outputs.embedding for o in offline.embed(TEXTS, use_tqdm=False)]
    assert [d.embedding for d in out.data] == want and [d.index for d in out.data] == [0, 1]
    assert np.linalg.norm(want[0]) == pytest.approx(1.0, abs=1e-6) and len(want[0]) == 576
    ids = [offline.get_tokenizer().encode(t) for t in TEXTS]
    assert out.usage.prompt_tokens == out.usage.total_tokens == sum(len(i) for i in ids)
    # token ids in, one list or several; base64 out: the same float32 values
    assert client.embeddings.create(model=MODEL, input=ids[0]).data[0].embedding == want[0]
    raw = client.embeddings.with_raw_response.create(model=MODEL, input=ids, encoding_format="base64").http_response
    for d, vector in zip(raw.json()["data"], want):
        assert np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4").tolist() == vector
    # vLLM's normalize false: the pooled row as it is
    plain = client.embeddings.create(model=MODEL, input=TEXTS[0], extra_body={"normalize": False}).data[0].embedding
    assert np.allclose(np.asarray(plain) / np.linalg.norm(plain), want[0], atol=1e-6)


@pytest.mark.parametrize("body, param", [
    ({"dimensions": 64}, "dimensions"),
    ({"input": ""}, "input"),
    ({"input": []}, "input"),
    ({"input": "word " * 600}, "input"),  # past the 512-token context
    ({"input": [[1, 2], [-1]]}, "input"),
    ({"encoding_format": "int8"}, "encoding_format"),
])
def test_bad_requests_name_the_field(client, body, param):
    with pytest.raises(openai.BadRequestError) as err:
        client.embeddings.create(**{"model": MODEL, "input": "Hi", **body})
    assert err.value.body["param"].startswith(param), err.value.body
    if param == "dimensions":
        assert "is not a Matryoshka embedding model" in err.value.body["message"]


def post(server, path: str, body: dict) -> tuple[int, dict]:
    req = urllib.request.Request(server.url + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


DOCS = ["Paris is the capital of France.", "Bananas are yellow.", "France's capital city is Paris."]


def test_scores_are_cosine_similarities_of_the_vectors(server, offline):
    query = "What is the capital of France?"
    vectors = {t: np.asarray(o.outputs.embedding, dtype=np.float64)
               for t, o in zip([query] + DOCS, offline.embed([query] + DOCS, use_tqdm=False))}
    want = [float(vectors[query] @ vectors[d]) for d in DOCS]
    status, body = post(server, "/score", {"queries": query, "documents": DOCS})
    assert status == 200 and [d["score"] for d in body["data"]] == pytest.approx(want, abs=1e-9)
    assert [d["index"] for d in body["data"]] == [0, 1, 2]
    # vLLM's older names, under /v1; pairwise lists
    status, older = post(server, "/v1/score", {"text_1": [query, DOCS[0]], "text_2": [DOCS[0], DOCS[2]]})
    assert status == 200 and [d["score"] for d in older["data"]] == pytest.approx(
        [want[0], float(vectors[DOCS[0]] @ vectors[DOCS[2]])], abs=1e-9)
    # rerank: best first, the top_n best
    for path in ("/rerank", "/v1/rerank", "/v2/rerank"):
        status, ranked = post(server, path, {"query": query, "documents": DOCS, "top_n": 2})
        assert status == 200
        best = sorted(range(3), key=lambda i: -want[i])[:2]
        assert [r["index"] for r in ranked["results"]] == best
        assert [r["relevance_score"] for r in ranked["results"]] == pytest.approx([want[i] for i in best], abs=1e-9)
        assert ranked["results"][0]["document"]["text"] == DOCS[best[0]]
    status, bare = post(server, "/rerank", {"query": query, "documents": DOCS, "return_documents": False})
    assert len(bare["results"]) == 3 and "document" not in bare["results"][0] and bare["usage"]["total_tokens"] > 0


def test_scores_cut_their_texts_as_embeddings_do(server):
    """truncate_prompt_tokens with truncation_side on /score and /rerank: the texts are cut as
    /v1/embeddings cuts them ("right" keeps the first k tokens), then compared."""
    query, doc = "Paris is lovely in spring, they say.", "Paris is the capital of France, a large country."
    for side in ("left", "right"):
        cut = {"truncate_prompt_tokens": 4, "truncation_side": side}
        status, emb = post(server, "/v1/embeddings", {"input": [query, doc], **cut})
        assert status == 200
        want = float(np.dot(emb["data"][0]["embedding"], emb["data"][1]["embedding"]))
        status, scored = post(server, "/score", {"queries": query, "documents": doc, **cut})
        assert status == 200 and scored["data"][0]["score"] == pytest.approx(want, abs=1e-6)
        assert scored["usage"]["prompt_tokens"] == 8
        status, ranked = post(server, "/rerank", {"query": query, "documents": [doc], **cut})
        assert status == 200 and ranked["results"][0]["relevance_score"] == pytest.approx(want, abs=1e-6)
    # the two sides cut different tokens (and "left" is the default)
    status, right = post(server, "/score", {"queries": query, "documents": doc, "truncate_prompt_tokens": 4,
                                            "truncation_side": "right"})
    status, left = post(server, "/score", {"queries": query, "documents": doc, "truncate_prompt_tokens": 4})
    assert right["data"][0]["score"] != pytest.approx(left["data"][0]["score"], abs=1e-3)
    status, err = post(server, "/rerank", {"query": query, "documents": [doc], "truncation_side": "right"})
    assert status == 400 and err["error"]["param"] == "truncation_side"


@pytest.mark.parametrize("path, body, param", [
    ("/score", {"queries": "a", "text_1": "a", "documents": "b"}, "queries"),
    ("/score", {"queries": "a"}, "documents"),
    ("/score", {"queries": ["a", "b"], "documents": ["c", "d", "e"]}, "queries"),
    ("/score", {"queries": "a", "documents": ["word " * 600]}, "documents"),
    ("/rerank", {"query": "word " * 600, "documents": ["b"]}, "query"),
    ("/rerank", {"query": "a", "documents": []}, "documents"),
    ("/rerank", {"query": "a", "documents": ["b"], "top_n": -1}, "top_n"),
])
def test_bad_score_requests_name_the_field(server, path, body, param):
    status, err = post(server, path, body)
    assert status == 400 and err["error"]["param"].startswith(param), err
