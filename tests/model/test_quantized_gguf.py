"""A tiny Llama written to GGUF in each quantized type (every matrix, the embedding too) and run
as it is (quantization "gguf"), against transformers (fp32) running the file's dequantized
weights — what transformers' own GGUF loading computes. Activations are quantized to int8 per
32 values, so logits move slightly; measured here, the worst logit differs by under 2% of the
largest (fp32 activations), and the greedy tokens agree wherever transformers' top-2 margin is
at least 0.25. The native decoder stack gives the per-op path's bits on quantized weights too, also where it
cuts a step into groups of sequences run by separate threads (the step split)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from corellm import _core
from corellm.model import load_model
from tests import quant_blocks
from tests.model.runner import PagedRunner
from tests.model.test_gguf import write_llama_gguf
from tests.model.tiny_models import make_tiny_model

transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

# Every matrix's k a multiple of 256: the K types' super-block.
SHAPE = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2)
PROMPT = [int(t) for t in np.random.default_rng(0).integers(3, 384, size=48)]


@pytest.fixture(scope="module", params=quant_blocks.ALL_TYPES)
def quantized_pair(request, tmp_path_factory):
    """(type name, corellm's loaded model, transformers' model on the dequantized weights)."""
    tmp = tmp_path_factory.mktemp(request.param)
    hf = make_tiny_model("llama_tied", tmp / "hf", **SHAPE)
    hf.config.tie_word_embeddings = False  # the file gets an output.weight (the same values, quantized alike)
    with torch.no_grad():  # logits spread wide enough for greedy margins (the input norm undoes it)
        hf.lm_head.weight.mul_(20.0)
    path = tmp / "tiny.gguf"
    write_llama_gguf(hf, path, getattr(gguf.GGMLQuantizationType, request.param))
    with torch.no_grad():
        for p in hf.parameters():
            if p.ndim == 2:
                a = p.float().numpy()
                p.copy_(torch.from_numpy(quant_blocks.dequantize(quant_blocks.quantize(a, request.param),
                                                                 request.param).reshape(a.shape)))
    return request.param, path, hf


def reference(hf, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf(torch.tensor([ids])).logits[0, -1].float()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_logits_near_transformers_on_the_dequantized_weights(quantized_pair, dtype):
    type_name, path, hf = quantized_pair
    ours = load_model(str(path), dtype=dtype, progress=False, use_cache=False)
    assert ours.quantization == "gguf"
    assert {q.type_name for layer in ours.model.layers for _, q in layer.attn.qkv_proj.quantized} == {type_name}
    assert ours.model.embed.quantized.type_name == type_name
    got = PagedRunner(ours.model, 64, 1).step([PROMPT])[0]
    want = reference(hf, PROMPT)
    rel = (got - want).abs().max() / want.abs().max()
    assert rel < (0.02 if dtype == "float32" else 0.04), f"{type_name} {dtype}: worst logit off by {rel:.3%}"


def test_greedy_tokens_follow_transformers_while_the_margin_is_clear(quantized_pair):
    type_name, path, hf = quantized_pair
    ours = load_model(str(path), dtype="float32", progress=False, use_cache=False)
    runner = PagedRunner(ours.model, 96, 1)
    ids, logits = list(PROMPT), runner.step([PROMPT])[0]
    compared = 0
    for _ in range(24):
        want = reference(hf, ids)
        top2 = torch.topk(want, 2).values
        if top2[0] - top2[1] < 0.25:
            break
        assert int(logits.argmax()) == int(want.argmax()), f"{type_name}: step {compared} differs"
        ids.append(int(want.argmax()))
        logits = runner.step([[ids[-1]]])[0]
        compared += 1
    assert compared >= 4, f"{type_name}: only {compared} steps had a clear margin"


@pytest.fixture
def bf16_model(quantized_pair):
    """corellm's model of the file in bf16, the native stack's dtype."""
    _, path, _ = quantized_pair
    return load_model(str(path), progress=False, use_cache=False).model


def test_native_stack_gives_the_per_op_bits(bf16_model):
    chunks = [PROMPT[:20], PROMPT[20:21], PROMPT[21:40]]
    op, native = PagedRunner(bf16_model, 64, 1), PagedRunner(bf16_model, 64, 1, native=True)
    for chunk in chunks:
        assert torch.equal(native.step([chunk]), op.step([chunk]))


def _split_expected() -> bool:
    """Whether the native stack cuts a big step into groups run by its threads here
    (decoder_stack.cpp's groups_for: a team of two threads, not the amx path)."""
    return _core.kernels.openmp_threads() == 2 and _core.kernels.cpu_isa() != "amx"


def _assert_groups(runner: PagedRunner, groups: int):
    """The last step ran in `groups` groups where the split is expected here, else whole."""
    assert runner.native_stack.last_groups == (groups if _split_expected() else 1)


def test_a_split_step_gives_the_per_op_bits_and_each_sequence_alone(bf16_model):
    """20 sequences: their prefill step is cut into four groups and their decode steps into two
    (8 tokens a group at least); every token's logits are those of the per-op forward and of the
    sequence run alone."""
    rng = np.random.default_rng(6)
    prompts = [[int(t) for t in rng.integers(3, 384, size=n)] for n in rng.integers(2, 30, size=20)]
    native, op = PagedRunner(bf16_model, 64, 20, native=True), PagedRunner(bf16_model, 64, 20)
    alone = [PagedRunner(bf16_model, 64, 1, native=True) for _ in prompts]
    chunks = prompts
    for step in range(4):
        got = native.step(chunks)
        _assert_groups(native, 4 if step == 0 else 2)
        assert torch.equal(got, op.step(chunks))
        assert torch.equal(got, torch.cat([runner.step([c]) for runner, c in zip(alone, chunks)]))
        chunks = [[t] for t in got.argmax(-1).tolist()]


def test_an_uneven_step_runs_whole(bf16_model):
    """Decodes beside one long prefill chunk would leave one thread waiting: not split."""
    runner = PagedRunner(bf16_model, 64, 9, native=True)
    runner.step([[5]] * 8 + [PROMPT[:40]])
    assert runner.native_stack.last_groups == 1


def test_a_refusal_in_one_group_of_a_split_step_is_raised(bf16_model):
    """A kernel's error inside one thread's group reaches the caller as the error it is."""
    runner = PagedRunner(bf16_model, 16, 20, native=True)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        runner.step([[3]] * 19 + [[384]])
    ok = PagedRunner(bf16_model, 16, 20, native=True)
    ok.step([[3]] * 20)
    _assert_groups(ok, 2)


def test_a_split_step_with_input_rows_gives_the_per_op_bits(bf16_model):
    """A LLaVA-like step (some embedding rows replaced) cut into groups: each group reads its own
    tokens' rows."""
    rng = np.random.default_rng(7)
    prompts = [[int(t) for t in rng.integers(3, 384, size=n)] for n in rng.integers(8, 20, size=20)]
    flat = [t for p in prompts for t in p]
    with torch.inference_mode():
        embeds = bf16_model.embed_input_ids(torch.tensor(flat, dtype=torch.int32))
        g = torch.Generator().manual_seed(8)
        embeds[40:90] = torch.randn(50, embeds.shape[1], generator=g).to(embeds.dtype)
    native, op = PagedRunner(bf16_model, 64, 20, native=True), PagedRunner(bf16_model, 64, 20)
    got = native.step(prompts, inputs_embeds=embeds)
    _assert_groups(native, 4)
    assert torch.equal(got, op.step(prompts, inputs_embeds=embeds))
