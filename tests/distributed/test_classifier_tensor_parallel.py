"""A sequence classifier with tensor parallelism: three ranks (9 heads, 3 KV heads, as SmolLM2's)
give one process's label probabilities (fp32: the all-reduces sum the ranks' shares in another
order, so to within float rounding); the score matrix is whole on every rank and applied on rank 0."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from corellm import LLM  # noqa: E402
from tests.model.tiny_models import make_tiny_classifier, make_tiny_model  # noqa: E402

NINE_HEADS = dict(hidden_size=72, num_attention_heads=9, num_key_value_heads=3, intermediate_size=144)


@pytest.mark.parametrize("from_tokens", [False, True])
def test_three_ranks_classify_as_one_process(tmp_path, tokenizer_json, from_tokens):
    """from_tokens: a causal checkpoint read as a classifier (hf_overrides' classifier_from_token):
    its score rows taken from the LM head before the vocabulary is cut between the ranks."""
    overrides = None
    if from_tokens:
        make_tiny_model("llama3", tmp_path, tokenizer_json, seed=9, **NINE_HEADS)
        overrides = {"architectures": ["LlamaForSequenceClassification"], "classifier_from_token": ["w3", "w300"]}
    else:
        make_tiny_classifier("llama3", tmp_path, tokenizer_json, seed=9, **NINE_HEADS)
    prompts = ["w5 w7 w9 w11", "w1 w2", "w100 w101 w102 w103 w104 w105 w106 w107 w108 w109 w110 w111 w112 w113"]
    common = dict(dtype="float32", max_model_len=256, kv_cache_memory=32 * 1024**2, hf_overrides=overrides)
    one = [o.outputs.probs for o in LLM(str(tmp_path), **common).classify(prompts, use_tqdm=False)]
    llm = LLM(str(tmp_path), tensor_parallel_size=3, **common)
    try:
        three = [o.outputs.probs for o in llm.classify(prompts, use_tqdm=False)]
    finally:
        llm.shutdown()  # its workers and this process's place in their group
    assert [x for p in three for x in p] == pytest.approx([x for p in one for x in p], abs=1e-5)
    assert max(max(p) for p in one) - min(min(p) for p in one) > 0.05  # probabilities that tell labels apart
