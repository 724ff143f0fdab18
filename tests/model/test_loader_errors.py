"""Loading fails with an error that names the file and the tensor or field at fault."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from corellm.model import UnsupportedModelError, load_model, resolve_model_path
from corellm.model.loader import default_model_path
from tests.model.tiny_models import make_tiny_model


@pytest.fixture
def tiny_dir(tmp_path):
    make_tiny_model("qwen2", tmp_path)
    from tokenizers import Tokenizer, models

    Tokenizer(models.WordLevel({"a": 0}, unk_token="a")).save(str(tmp_path / "tokenizer.json"))
    return tmp_path


def test_tiny_dir_loads(tiny_dir):
    m = load_model(str(tiny_dir), progress=False)
    assert m.model.dtype == torch.bfloat16  # "auto" on the CPU
    assert m.config.attention_bias and m.config.family == "qwen2"


def test_missing_model_path():
    with pytest.raises(FileNotFoundError, match="no-such-model.*no such file or directory"):
        resolve_model_path("no-such-model")


def test_default_short_names_resolve_to_the_embedded_gguf():
    for name in (None, "SmolLM2-135M-Instruct", "smollm2"):
        assert resolve_model_path(name) == default_model_path()


def test_unsupported_architecture(tiny_dir):
    cfg = json.loads((tiny_dir / "config.json").read_text())
    cfg["architectures"] = ["GPTNeoXForCausalLM"]
    (tiny_dir / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedModelError, match="config.json: architecture 'GPTNeoXForCausalLM' is not supported"):
        load_model(str(tiny_dir))


def test_shape_mismatch_names_file_and_tensor(tiny_dir):
    path = tiny_dir / "model.safetensors"
    tensors = load_file(str(path))
    tensors["model.layers.1.mlp.up_proj.weight"] = torch.zeros(7, 64)
    save_file(tensors, str(path))
    with pytest.raises(ValueError, match=r"tensor 'model.layers.1.mlp.up_proj.weight' has shape \(7, 64\), "
                                         r"but the config implies \(160, 64\)"):
        load_model(str(tiny_dir))


def test_missing_tensor_is_named(tiny_dir):
    path = tiny_dir / "model.safetensors"
    tensors = load_file(str(path))
    del tensors["model.layers.2.self_attn.k_proj.bias"]
    save_file(tensors, str(path))
    with pytest.raises(ValueError, match="missing tensors \\['model.layers.2.self_attn.k_proj.bias'\\]"):
        load_model(str(tiny_dir))


def test_pickled_weights_are_refused(tiny_dir):
    (tiny_dir / "model.safetensors").unlink()
    (tiny_dir / "pytorch_model.bin").write_bytes(b"\x80\x04pickle")
    with pytest.raises(FileNotFoundError, match="pickled weights are not loaded"):
        load_model(str(tiny_dir))


def test_sharded_checkpoint_with_index(tiny_dir):
    tensors = load_file(str(tiny_dir / "model.safetensors"))
    (tiny_dir / "model.safetensors").unlink()
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    weight_map = {}
    for file, keys in shards.items():
        save_file({k: tensors[k] for k in keys}, str(tiny_dir / file))
        weight_map.update({k: file for k in keys})
    (tiny_dir / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    m = load_model(str(tiny_dir), dtype="float32", progress=False)
    torch.testing.assert_close(m.model.norm, tensors["model.norm.weight"])


def test_missing_shard_is_named(tiny_dir):
    (tiny_dir / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"x": "gone.safetensors"}}))
    with pytest.raises(FileNotFoundError, match="gone.safetensors"):
        load_model(str(tiny_dir))


def test_missing_tokenizer(tiny_dir):
    (tiny_dir / "tokenizer.json").unlink()
    with pytest.raises(FileNotFoundError, match="no tokenizer.json or tokenizer.model"):
        load_model(str(tiny_dir))


@pytest.mark.parametrize("dtype", ["float16", "int8", torch.float16])
def test_bad_dtype(tiny_dir, dtype):
    with pytest.raises(ValueError, match="is not supported"):
        load_model(str(tiny_dir), dtype=dtype)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_cuda_device_without_a_gpu_says_so(tiny_dir):
    with pytest.raises(ValueError, match="needs an NVIDIA GPU and a CUDA build of torch"):
        load_model(str(tiny_dir), device="cuda")
