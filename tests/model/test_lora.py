"""LoRA adapters in the model: logits equal transformers' on the same model with the updates
merged into its weights (fp32); in bf16 a sequence's logits are bit-identical whatever the step
holds (other adapters, the base model), and the native decoder stack's equal the per-op layers';
and an adapter corellm cannot apply is refused by name."""

from __future__ import annotations

import json

import numpy as np

import pytest
import torch

from corellm import _core
from corellm.lora import load_lora_adapter
from corellm.model import load_model
from tests.lora_adapters import ATTENTION, MLP, PHI3_MODULES, make_lora_adapter, merged
from tests.model.runner import PagedRunner
from tests.model.tiny_models import make_tiny_model

pytest.importorskip("transformers")


def _prompts(lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 384, (n,), generator=g).tolist() for n in lengths]


@pytest.mark.parametrize("arch,modules,rslora", [("llama3", ATTENTION + MLP, False), ("qwen3", ("q_proj", "v_proj"), True),
                                                  ("gemma3", ("o_proj", "gate_proj", "down_proj"), False),
                                                  ("phi3", PHI3_MODULES, False)])
def test_logits_match_transformers_with_the_updates_merged(arch, modules, rslora, tmp_path, tokenizer_json):
    hf = make_tiny_model(arch, tmp_path / "model", tokenizer_json)
    config = json.loads((tmp_path / "model" / "config.json").read_text())
    config = config.get("text_config", config)
    updates = make_lora_adapter(tmp_path / "adapter", config, rank=6, modules=modules, use_rslora=rslora,
                                layers=[0, 2])
    ours = load_model(str(tmp_path / "model"), dtype="float32", progress=False)
    adapter = load_lora_adapter("a", str(tmp_path / "adapter"), ours.config, max_lora_rank=16)
    ids = _prompts([40])[0]
    runner = PagedRunner(ours.model, 64, 1, block_size=8, lora_adapters=[adapter])
    first = runner.step([ids[:25]], lora=[0])
    rest = torch.cat([runner.step([[t]], lora=[0]) for t in ids[25:]])
    want = merged(hf, updates)(torch.tensor([ids])).logits[0].detach()
    torch.testing.assert_close(first[0], want[24], atol=2e-4, rtol=1e-4)
    torch.testing.assert_close(rest, want[25:], atol=2e-4, rtol=1e-4)
    base = hf(torch.tensor([ids])).logits[0].detach()
    assert (want - base).abs().max() > 0.05  # the update matters


@pytest.fixture(scope="module")
def bf16_with_adapters(tmp_path_factory, tokenizer_json):
    root = tmp_path_factory.mktemp("lora_bf16")
    make_tiny_model("llama3", root / "model", tokenizer_json, seed=7)
    config = json.loads((root / "model" / "config.json").read_text())
    make_lora_adapter(root / "a", config, rank=8, seed=1)
    make_lora_adapter(root / "b", config, rank=4, modules=("q_proj", "up_proj", "down_proj"), seed=2)
    model = load_model(str(root / "model"), dtype="bfloat16", progress=False)
    adapters = [load_lora_adapter(n, str(root / n), model.config, max_lora_rank=8, dtype=torch.bfloat16)
                for n in ("a", "b")]
    return model.model, adapters


def _run(model, adapters, prompts, lora, native, steps=6):
    """Prefill (in chunks of 9) and greedy decode of the sequences together; logits per step."""
    runner = PagedRunner(model, 64, len(prompts), block_size=8, native=native, lora_adapters=adapters)
    for start in range(0, max(map(len, prompts)), 9):
        last = runner.step([p[start:start + 9] for p in prompts], lora=lora)
    out = [last]
    for _ in range(steps):
        last = runner.step([[int(t)] for t in last.argmax(-1)], lora=lora)
        out.append(last)
    return torch.stack(out)


@pytest.mark.skipif(not _core.kernels.bf16_gemm_available(), reason="needs AVX2 and FMA")
def test_each_sequence_is_bit_identical_alone_and_among_other_adapters(bf16_with_adapters):
    model, adapters = bf16_with_adapters
    prompts = _prompts([30, 30, 30], seed=3)  # equal lengths: every sequence in every step
    lora = [0, -1, 1]
    together = _run(model, adapters, prompts, lora, native=True)
    for i, slot in enumerate(lora):
        alone = _run(model, adapters, [prompts[i]], [slot], native=True)
        assert torch.equal(together[:, i], alone[:, 0]), f"sequence {i} (slot {slot})"
    assert torch.equal(together, _run(model, adapters, prompts, lora, native=False))  # the per-op layers
    base = _run(model, adapters, prompts, [-1, -1, -1], native=True)
    assert torch.equal(base[:, 1], together[:, 1]) and not torch.equal(base[:, 0], together[:, 0])


def _write(tmp_path, **config_extra):
    config = json.loads((tmp_path / "model" / "config.json").read_text())
    return make_lora_adapter(tmp_path / "adapter", config, rank=4, extra_config=config_extra)


@pytest.fixture
def tiny_model(tmp_path, tokenizer_json):
    make_tiny_model("llama3", tmp_path / "model", tokenizer_json)
    return load_model(str(tmp_path / "model"), dtype="float32", progress=False)


def test_an_adapter_corellm_cannot_apply_is_refused_by_name(tiny_model, tmp_path):
    load = lambda rank=16: load_lora_adapter("x", str(tmp_path / "adapter"), tiny_model.config, max_lora_rank=rank)  # noqa: E731
    with pytest.raises(ValueError, match="is not a directory"):
        load()
    _write(tmp_path)
    assert load().rank == 4
    with pytest.raises(ValueError, match=r"rank 4, above max_lora_rank \(2\)"):
        load(rank=2)
    for key, value in (("use_dora", True), ("modules_to_save", ["lm_head"]), ("bias", "all"),
                       ("alpha_pattern", {"q_proj": 4})):
        _write(tmp_path, **{key: value})
        with pytest.raises(ValueError, match=f"{key}=.* is not supported"):
            load()
    from safetensors.torch import load_file, save_file

    _write(tmp_path)
    weights = tmp_path / "adapter" / "adapter_model.safetensors"
    tensors = load_file(str(weights))
    save_file({**tensors, "base_model.model.lm_head.lora_A.weight": torch.zeros(4, 64)}, str(weights))
    with pytest.raises(ValueError, match="lm_head.lora_A.weight' is not an update corellm applies"):
        load()
    name = "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"
    save_file({**tensors, name: torch.zeros(63, 4)}, str(weights))
    with pytest.raises(ValueError, match=r"layer 0's q_proj: lora_A \(4, 64\) and lora_B \(63, 4\) do not fit"):
        load()
    save_file({k: v for k, v in tensors.items() if k != name}, str(weights))
    with pytest.raises(ValueError, match="lora_A without its lora_B"):
        load()
    beyond = {k.replace("layers.0.", "layers.9."): v.clone() for k, v in tensors.items() if "layers.0." in k}
    save_file({**tensors, **beyond}, str(weights))
    with pytest.raises(ValueError, match="layer 9's down_proj: the model has 3 layers"):
        load()
    weights.unlink()
    with pytest.raises(ValueError, match="no adapter_model.safetensors"):
        load()


def test_an_adapter_is_found_by_hub_id_in_the_local_cache(tiny_model, tmp_path, monkeypatch):
    snapshot = tmp_path / "hub" / "models--someone--tiny-lora" / "snapshots" / "abc123"
    config = json.loads((tmp_path / "model" / "config.json").read_text())
    make_lora_adapter(snapshot, config, rank=2)
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text("abc123")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    adapter = load_lora_adapter("x", "someone/tiny-lora", tiny_model.config, max_lora_rank=8)
    assert adapter.rank == 2 and adapter.path == str(snapshot)
    with pytest.raises(ValueError, match="`hf download someone/other` first"):
        load_lora_adapter("x", "someone/other", tiny_model.config, max_lora_rank=8)


def _llama_permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter's row order for q and k (its LlamaModel.permute), which a GGUF holds."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf_lora(path, updates: dict, alpha: float, config: dict, arch: str = "llama") -> None:
    """The updates of make_lora_adapter as llama.cpp's convert_lora_to_gguf.py writes them (F32)."""
    import gguf

    w = gguf.GGUFWriter(str(path), arch=arch)
    w.add_string("general.type", "adapter")
    w.add_string("adapter.type", "lora")
    w.add_float32("adapter.lora.alpha", alpha)
    names = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output",
             "gate_proj": "ffn_gate", "up_proj": "ffn_up", "down_proj": "ffn_down",
             "qkv_proj": "attn_qkv", "gate_up_proj": "ffn_up"}  # (Phi-3's fused ones)
    heads = {"q_proj": config["num_attention_heads"], "k_proj": config["num_key_value_heads"]} \
        if arch in ("llama", "mistral") else {}
    for (layer, module), (a, b, _) in sorted(updates.items()):
        b = b.numpy()
        if module in heads:
            b = _llama_permute(b, heads[module])
        w.add_tensor(f"blk.{layer}.{names[module]}.weight.lora_a", np.ascontiguousarray(a.numpy()))
        w.add_tensor(f"blk.{layer}.{names[module]}.weight.lora_b", np.ascontiguousarray(b))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.parametrize("arch, gguf_arch, modules", [("llama3", "llama", ATTENTION + MLP),
                                                       ("phi3", "phi3", PHI3_MODULES)])
def test_a_llama_cpp_gguf_adapter_loads_as_the_same_peft_adapter(arch, gguf_arch, modules, tmp_path, tokenizer_json):
    make_tiny_model(arch, tmp_path / "model", tokenizer_json)
    model = load_model(str(tmp_path / "model"), dtype="float32", progress=False)
    config = json.loads((tmp_path / "model" / "config.json").read_text())
    updates = make_lora_adapter(tmp_path / "adapter", config, rank=4, alpha=8.0, modules=modules)
    write_gguf_lora(tmp_path / "adapter.gguf", updates, 8.0, config, arch=gguf_arch)
    peft = load_lora_adapter("p", str(tmp_path / "adapter"), model.config, max_lora_rank=8)
    from_gguf = load_lora_adapter("g", str(tmp_path / "adapter.gguf"), model.config, max_lora_rank=8)
    for mine, theirs in zip(peft.layers, from_gguf.layers):
        assert mine.keys() == theirs.keys() == {"qkv", "o", "gate_up", "down"}
        for projection in mine:
            for p, q in zip(mine[projection], theirs[projection]):
                assert (p.col_offset, p.scale) == (q.col_offset, q.scale)
                assert torch.equal(p.a_t, q.a_t) and torch.equal(p.b_t, q.b_t), projection
    write_gguf_lora(tmp_path / "qwen.gguf", updates, 8.0, config, arch="qwen2")
    with pytest.raises(ValueError, match=f"is for architecture 'qwen2', the model is {model.config.architecture}"):
        load_lora_adapter("g", str(tmp_path / "qwen.gguf"), model.config, max_lora_rank=8)
