"""POST /v1/embeddings through the official openai client: the vectors are the engine's own
(LLM.embed, bit for bit), as floats or base64 float32, for strings and token ids; usage counts the
inputs' tokens; what is not made (dimensions) and bad inputs are 400s naming the field."""

from __future__ import annotations

import base64

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
