"""The step's logits written into one reused tensor on the CPU (worker/logits_buffer.py): the
buffer's views and growth, Linear's `out=` on each of its CPU paths (the same values as a fresh
tensor), and the engine's tokens and logprobs unchanged by the reuse across steps."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from corellm import LLM, SamplingParams
from corellm.model import load_model
from corellm.model.layers import Linear
from corellm.model.quantized_tensor import QuantizedTensor
from corellm.worker.logits_buffer import LogitsBuffer

CPU = torch.device("cpu")


def test_views_grow_to_a_power_of_two_and_stay():
    buf = LogitsBuffer(vocab_size=100, max_rows=48, device=CPU)
    assert buf.nbytes == 0
    a = buf.rows(3)
    assert a.shape == (3, 100) and a.dtype == torch.float32 and a.is_contiguous()
    assert buf.nbytes == 4 * 100 * 4  # 3 rows -> 4
    b = buf.rows(2)
    assert b.data_ptr() == a.data_ptr()  # the same storage, no new tensor
    c = buf.rows(20)  # grows to 32 rows
    assert c.shape == (20, 100) and buf.nbytes == 32 * 100 * 4
    d = buf.rows(40)  # capped at max_rows
    assert d.shape == (40, 100) and buf.nbytes == 48 * 100 * 4
    assert buf.rows(48).data_ptr() == d.data_ptr()
    assert buf.rows(1).shape == (1, 100)


def test_more_rows_than_max_or_a_gpu_get_none():
    assert LogitsBuffer(vocab_size=10, max_rows=8, device=CPU).rows(9) is None
    assert LogitsBuffer(vocab_size=10, max_rows=8, device=torch.device("cuda")).rows(2) is None
    with pytest.raises(ValueError, match="vocab_size and max_rows must be positive"):
        LogitsBuffer(vocab_size=10, max_rows=0, device=CPU)


def _dense_linear(n: int, k: int, dtype: torch.dtype, bias: bool) -> Linear:
    gen = torch.Generator().manual_seed(0)
    lin = Linear(n, k, bias, dtype, CPU)
    lin.load(0, (torch.randn(n, k, generator=gen) * 0.05).to(dtype))
    if bias:
        lin.bias.copy_(torch.randn(n, generator=gen).to(dtype))
    lin.finalize()
    return lin


def _quantized_linear(n: int, k: int) -> Linear:
    gguf = pytest.importorskip("gguf")
    from tests.quant_blocks import quantize

    w = np.random.default_rng(0).standard_normal((n, k)).astype(np.float32) * 0.05
    lin = Linear(n, k, False, torch.bfloat16, CPU)
    lin.load(0, QuantizedTensor.pack(int(gguf.GGMLQuantizationType.Q8_0), quantize(w, "Q8_0"), (n, k)))
    lin.finalize()
    assert lin.quantized
    return lin


@pytest.mark.parametrize("kind", ["packed bf16", "packed bf16 + bias", "fp32 (torch)", "quantized Q8_0"])
def test_linear_writes_into_out(kind):
    n, k, m = 96, 64, 5
    if kind == "quantized Q8_0":
        lin = _quantized_linear(n, k)
    else:
        lin = _dense_linear(n, k, torch.float32 if kind.startswith("fp32") else torch.bfloat16, "bias" in kind)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(1)).to(lin.dtype)
    fresh = lin(x, out_dtype=torch.float32)
    out = torch.full((m, n), float("nan"))
    got = lin(x, out_dtype=torch.float32, out=out)
    assert got is out
    assert torch.equal(out, fresh)


def test_linear_refuses_an_out_of_the_wrong_shape_or_type():
    lin = _dense_linear(32, 64, torch.bfloat16, False)
    x = torch.randn(4, 64).bfloat16()
    with pytest.raises(ValueError, match=r"out must have shape \(4, 32\), got \(4, 31\)"):
        lin(x, out_dtype=torch.float32, out=torch.empty(4, 31))
    with pytest.raises(ValueError, match="out must be a contiguous torch.float32 tensor, got torch.bfloat16"):
        lin(x, out_dtype=torch.float32, out=torch.empty(4, 32, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="not contiguous"):
        lin(x, out_dtype=torch.float32, out=torch.empty(32, 4).T)


@pytest.fixture(scope="module")
def loaded():
    return load_model(None, progress=False)


def test_engine_output_is_unchanged_by_the_reuse(loaded):
    """Greedy tokens and their logprobs for 12 requests of different lengths (so steps of
    different row counts reuse and grow the buffer) equal a run where every step's logits are a
    fresh tensor; the runner's buffer is used."""
    prompts = [{"prompt_token_ids": [(7 * i + 3 * j) % 4000 + 10 for j in range(5 + 3 * i)]} for i in range(12)]
    params = [SamplingParams(temperature=0, max_tokens=6 + i % 4, logprobs=2, ignore_eos=True) for i in range(12)]

    def run(reuse: bool):
        llm = LLM(loaded_model=loaded, max_model_len=256, kv_cache_memory=32 * 1024**2, max_num_seqs=8)
        buffer = llm.engine_core.model_runner.logits_buffer
        if not reuse:
            buffer.rows = lambda n: None
        outs = llm.generate(prompts, params, use_tqdm=False)
        return ([(o.outputs[0].token_ids, [[(t, lp.logprob) for t, lp in sorted(d.items())] for d in o.outputs[0].logprobs])
                 for o in outs], buffer.nbytes)

    reused, nbytes = run(reuse=True)
    fresh, _ = run(reuse=False)
    assert nbytes > 0
    assert reused == fresh
