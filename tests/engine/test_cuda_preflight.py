"""What a GPU run needs from corellm._cuda, checked here without a GPU (a GPU run is too scarce to
spend on a shape or binding error): every model and kernel case that a CUDA test or the GPU
benchmarks build has a head size the CUDA attention is built for; a model whose head size has no
CUDA kernel is refused by name when it loads; the CUDA sampler takes _core's SamplingBatch."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from corellm.model.loader import check_head_size_on_device, load_model_config
from corellm.native import _core, _cuda
from corellm.ops._backend import cuda_attention_head_sizes, cuda_available
from tests.model.tiny_models import ARCHS, TINY

pytestmark = pytest.mark.skipif(not cuda_available(), reason="corellm._cuda is not built here")

BENCH = Path(__file__).resolve().parents[2] / "bench"


def test_the_architectures_head_sizes_are_built():
    # Llama 3.x 8B / 70B, Qwen2 / Qwen3, Mistral 7B: 128; SmolLM2, Llama-3.2-1B: 64; Phi-2 and
    # StableLM: 80; Phi-3: 96; Gemma: 256.
    assert {64, 80, 96, 128, 256} <= set(cuda_attention_head_sizes())


def test_the_tiny_test_models_have_a_cuda_head_size():
    for arch, (_, _, extra) in ARCHS.items():
        config = {**TINY, **extra}
        head = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
        assert head in cuda_attention_head_sizes(), arch


def bench_module(name: str):
    """A module of bench/ (not a package: imported from its folder)."""
    sys.path.insert(0, str(BENCH))
    try:
        return __import__(name)
    finally:
        sys.path.remove(str(BENCH))


def test_the_benchmark_shapes_have_a_cuda_head_size():
    for name, shape in bench_module("random_model").SHAPES.items():
        assert shape["head_dim"] in cuda_attention_head_sizes(), name
    for name, (_, _, head_size) in bench_module("cuda_kernels").SHAPES.items():
        assert head_size in cuda_attention_head_sizes(), name


def test_the_kernel_test_cases_have_a_cuda_head_size():
    from tests.ops.test_attention import CASES
    from tests.ops.test_cuda_ops import DECODE_CASES, PREFILL_CASES

    heads = [c[3] for c in CASES] + [c[3] for c in DECODE_CASES] + [c[3] for c in PREFILL_CASES]
    assert set(heads) <= set(cuda_attention_head_sizes())


def test_the_default_model_has_a_cuda_head_size():
    try:
        config = load_model_config()
    except FileNotFoundError:
        pytest.skip("the default model is not installed")
    check_head_size_on_device(config, torch.device("cuda"))


def test_a_head_size_without_a_kernel_is_refused_by_name(tmp_path):
    pytest.importorskip("transformers")
    from tests.engine.test_cuda_engine import save_word_tokenizer
    from tests.model.tiny_models import make_tiny_model

    save_word_tokenizer(tmp_path)
    make_tiny_model("qwen3", tmp_path, head_dim=72)
    config = load_model_config(tmp_path)
    check_head_size_on_device(config, torch.device("cpu"))  # the CPU kernels take any even head size
    with pytest.raises(ValueError, match=r"head_dim 72 has no CUDA attention kernel .*head sizes 16, 32"):
        check_head_size_on_device(config, torch.device("cuda"))


def test_the_cuda_sampler_takes_the_cores_sampling_batch():
    """One struct type for both modules (bound by _core, shared with _cuda): the CUDA binding
    accepts the batch and reaches the launcher's own checks (nothing is launched for a bad shape)."""
    with pytest.raises(ValueError, match="bad sampling batch shape"):
        _cuda.sample(_core.kernels.SamplingBatch(), 0)
