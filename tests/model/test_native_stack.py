"""The native decoder stack (one C++ call per step) against the per-op Python forward on tiny
random models of every architecture, in bf16: bit-identical for decode steps, batched or alone,
and for prefills and chunks; each sequence's logits independent of its batch."""

from __future__ import annotations

import pytest
import torch

from corellm import _core
from corellm.model import load_model
from corellm.model.native_stack import supports
from tests.model.runner import PagedRunner, greedy_decode
from tests.model.tiny_models import ARCHS, make_tiny_model

pytest.importorskip("transformers")
pytestmark = pytest.mark.skipif(not _core.kernels.bf16_gemm_available(), reason="needs AVX2 and FMA")


# Every architecture, Gemma 3's variant of the layer included (GeGLU, sandwich norms, scaled
# embeddings, sliding layers with their own window and rope base beside global ones).
NATIVE_ARCHS = sorted(ARCHS)


@pytest.fixture(scope="module", params=NATIVE_ARCHS)
def tiny_bf16(request, tmp_path_factory, tokenizer_json):
    directory = tmp_path_factory.mktemp(request.param)
    make_tiny_model(request.param, directory, tokenizer_json, seed=7)
    model = load_model(str(directory), dtype="bfloat16", progress=False).model
    assert supports(model)
    return model


def _prompts(lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 384, (n,), generator=g).tolist() for n in lengths]


def test_one_sequence_is_bit_identical_to_the_per_op_forward(tiny_bf16):
    prompts = _prompts([13])
    assert torch.equal(greedy_decode(tiny_bf16, prompts, 12, native=True), greedy_decode(tiny_bf16, prompts, 12, native=False))


def test_a_batch_is_bit_identical_to_the_per_op_forward_and_to_each_sequence_alone(tiny_bf16):
    prompts = _prompts([9, 21, 5, 30, 17, 2, 40, 11, 3], seed=2)
    together = greedy_decode(tiny_bf16, prompts, 8, native=True)
    assert torch.equal(together, greedy_decode(tiny_bf16, prompts, 8, native=False))
    assert torch.equal(together, greedy_decode(tiny_bf16, prompts, 8, native=True, together=False))


def test_a_bf16_stack_runs_every_step_whole(tiny_bf16):
    """The step split is for quantized projections (decoder_stack.cpp: on bf16 it measured no
    faster): a step of 20 decodes still runs every kernel on the whole team."""
    prompts = _prompts([4] * 20, seed=6)
    runner = PagedRunner(tiny_bf16, 16, len(prompts), native=True)
    last = runner.step(prompts)
    runner.step([[t] for t in last.argmax(-1).tolist()])
    assert runner.native_stack.last_groups == 1


def test_chunked_prefill_is_bit_identical_to_the_per_op_forward(tiny_bf16):
    prompt = _prompts([50], seed=3)[0]
    logits = {}
    for native in (True, False):
        runner = PagedRunner(tiny_bf16, 64, 1, block_size=8, native=native)
        runner.step([prompt[:8]])
        runner.step([prompt[8:11]])  # 3 query tokens over 8 cached ones
        logits[native] = runner.step([prompt[11:]])
    assert torch.equal(logits[True], logits[False])


def test_inputs_embeds_are_bit_identical_to_the_per_op_forward(tiny_bf16):
    """A LLaVA step: some rows of the embeddings replaced (image rows) before the decoder."""
    prompt = _prompts([24], seed=4)[0]
    with torch.inference_mode():
        embeds = tiny_bf16.embed_input_ids(torch.tensor(prompt, dtype=torch.int32))
        g = torch.Generator().manual_seed(5)
        embeds[5:15] = torch.randn(10, embeds.shape[1], generator=g).to(torch.bfloat16)
    logits = {}
    for native in (True, False):
        runner = PagedRunner(tiny_bf16, 64, 1, block_size=8, native=native)
        logits[native] = runner.step([prompt], inputs_embeds=embeds)
    assert torch.equal(logits[True], logits[False])
    plain = PagedRunner(tiny_bf16, 64, 1, block_size=8, native=True).step([prompt])
    assert not torch.equal(plain, logits[True])


def test_a_token_outside_the_vocabulary_is_refused(tiny_bf16):
    runner = PagedRunner(tiny_bf16, 16, 1, native=True)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        runner.step([[384]])


def test_gemma_sliding_layers_see_only_their_window(tiny_bf16):
    """Prompts longer than the tiny Gemma 3's and Gemma 2's window (16 tokens; their middle layer
    global): the native stack passes each layer its own window and rope table (and Gemma 2's soft
    cap), bit-identical to the per-op forward."""
    if tiny_bf16.config.architecture not in ("Gemma2ForCausalLM", "Gemma3ForCausalLM"):
        pytest.skip("Gemma 2 and 3 only")
    prompts = _prompts([40, 23], seed=6)
    native = greedy_decode(tiny_bf16, prompts, 6, native=True)
    assert torch.equal(native, greedy_decode(tiny_bf16, prompts, 6, native=False))
    windows = [layer.attn.sliding_window for layer in tiny_bf16.layers]
    assert windows == [16, 0, 16]
