"""Embedding requests (PoolingParams, LLM.embed) against HF transformers (fp32) on the same GGUF: the
vector is transformers' last_hidden_state (the final norm's output) pooled as the engine's
pooling_type says — the last token's row, the mean of the rows, the first token's row — and
L2-normalized unless asked not to. Served in bf16, a prompt's vector is bit-identical alone, in a
batch, cut into 16-token chunks, and through the prefix cache."""

from __future__ import annotations

import pytest
import torch

from corellm import LLM, PoolingParams, TokensPrompt
from corellm.model import load_model
from corellm.model.loader import default_model_path
from tests.engine.prompts import PROMPTS

transformers = pytest.importorskip("transformers")

ENGINE = dict(max_model_len=512, kv_cache_memory=96 * 1024**2)


@pytest.fixture(scope="module")
def hf_base():
    path = default_model_path()
    return transformers.AutoModel.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def fp32_model():
    return load_model(dtype="float32", quantization="none", progress=False)


@pytest.mark.parametrize("pooling_type", ["LAST", "MEAN", "CLS"])
def test_vectors_are_transformers_hidden_states_pooled(hf_base, fp32_model, pooling_type):
    llm = LLM(loaded_model=fp32_model, pooling_type=pooling_type, max_num_batched_tokens=32, **ENGINE)
    prompts = PROMPTS[:4]
    got = llm.embed(prompts, use_tqdm=False)
    raw = llm.embed(prompts, PoolingParams(normalize=False), use_tqdm=False)
    for prompt, normalized, plain in zip(prompts, got, raw):
        ids = normalized.prompt_token_ids
        assert ids == llm.get_tokenizer().encode(prompt)
        with torch.no_grad():
            hidden = hf_base(torch.tensor([ids])).last_hidden_state[0].double()
        want = {"LAST": hidden[-1], "MEAN": hidden.mean(dim=0), "CLS": hidden[0]}[pooling_type]
        vector = torch.tensor(plain.outputs.embedding, dtype=torch.float64)
        assert vector.shape == (576,)
        assert (vector - want).abs().max() < 2e-3 * want.abs().max(), pooling_type
        unit = torch.tensor(normalized.outputs.embedding, dtype=torch.float64)
        assert unit.norm() == pytest.approx(1.0, abs=1e-6)
        assert torch.nn.functional.cosine_similarity(unit, want, dim=0) > 0.99999


def test_score_is_the_cosine_of_transformers_vectors(hf_base, fp32_model):
    """LLM.score (vLLM's, with an embedding model): one prompt against each of many, or pairwise; the
    cosine similarity of the two pooled vectors, here against transformers' last rows."""
    llm = LLM(loaded_model=fp32_model, pooling_type="LAST", **ENGINE)
    tok = llm.get_tokenizer()

    def reference(a: str, b: str) -> float:
        with torch.no_grad():
            rows = [hf_base(torch.tensor([tok.encode(t)])).last_hidden_state[0, -1].double() for t in (a, b)]
        return torch.nn.functional.cosine_similarity(rows[0], rows[1], dim=0).item()

    query, documents = PROMPTS[0], PROMPTS[1:4]
    many = llm.score(query, documents, use_tqdm=False)
    assert [o.outputs.score for o in many] == pytest.approx([reference(query, d) for d in documents], abs=1e-4)
    assert many[0].prompt_token_ids == tok.encode(query) + tok.encode(documents[0])
    pairwise = llm.score([query, TokensPrompt(prompt_token_ids=tok.encode(documents[0]))], documents[1:3],
                         use_tqdm=False)
    assert [o.outputs.score for o in pairwise] == pytest.approx(
        [reference(query, documents[1]), reference(documents[0], documents[2])], abs=1e-4)
    assert llm.score(query, query, use_tqdm=False)[0].outputs.score == pytest.approx(1.0, abs=1e-6)
    with pytest.raises(ValueError, match="2 data_1 for 3 data_2: give one of data_1, or as many as data_2"):
        llm.score(PROMPTS[:2], documents, use_tqdm=False)


@pytest.mark.parametrize("pooling_type", ["LAST", "MEAN"])
def test_a_vector_does_not_depend_on_the_batch_the_chunks_or_the_cache(pooling_type):
    alone = LLM(pooling_type=pooling_type, **ENGINE)
    chunked = LLM(loaded_model=alone.loaded, pooling_type=pooling_type, max_num_batched_tokens=16, max_num_seqs=4,
                  **ENGINE)
    prompts = [PROMPTS[0] * 3, PROMPTS[1], PROMPTS[0] * 3 + " And more."]  # the third shares the first's prefix
    want = [alone.embed([p], use_tqdm=False)[0].outputs.embedding for p in prompts]
    assert [o.outputs.embedding for o in chunked.embed(prompts, use_tqdm=False)] == want
    assert [o.outputs.embedding for o in chunked.embed(prompts, use_tqdm=False)] == want  # prefix-cache hits now
    # embedding requests beside generation: the generated tokens are those of a generation alone
    from corellm import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=12)
    text = alone.generate([PROMPTS[2]], params, use_tqdm=False)[0].outputs[0].token_ids
    processed = [chunked.input_processor.process(f"mix-{i}", p, PoolingParams()) for i, p in enumerate(prompts)]
    processed.append(chunked.input_processor.process("mix-gen", PROMPTS[2], params))
    outs = {o.request_id: o for o in chunked._run(processed, use_tqdm=False)}
    assert [outs[f"mix-{i}"].embedding for i in range(3)] == want
    assert outs["mix-gen"].outputs[0].token_ids == text


def test_pooling_configuration():
    from corellm.pooling_params import pooling_type_of

    with pytest.raises(ValueError, match="normalize must be a bool"):
        PoolingParams(normalize="yes")
    with pytest.raises(ValueError, match="pooling_type must be one of LAST, MEAN, CLS"):
        pooling_type_of(default_model_path(), "max")
    assert pooling_type_of(default_model_path(), "mean") == "MEAN"
    assert pooling_type_of(default_model_path(), None) == "LAST"  # no sentence-transformers config


def test_the_sentence_transformers_pooling_config_decides(tmp_path):
    from corellm.pooling_params import pooling_type_of

    (tmp_path / "1_Pooling").mkdir()
    config = tmp_path / "1_Pooling" / "config.json"
    config.write_text('{"word_embedding_dimension": 1024, "pooling_mode_cls_token": false, '
                      '"pooling_mode_mean_tokens": true, "pooling_mode_lasttoken": false}')
    assert pooling_type_of(tmp_path, None) == "MEAN"
    config.write_text('{"pooling_mode_max_tokens": true, "pooling_mode_mean_tokens": false}')
    with pytest.raises(ValueError, match="corellm pools by one of"):
        pooling_type_of(tmp_path, None)
