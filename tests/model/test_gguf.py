"""GGUF loading: the SmolLM2 file's dequantized tensors equal transformers' GGUF loading; a tiny
model written to GGUF the way llama.cpp's converter writes it (Q/K permuted) gives transformers'
logits; unsupported inputs fail with errors naming the file and tensor."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from corellm.model import UnsupportedModelError, load_model
from corellm.model.gguf_file import GGUFModelFile
from corellm.model.loader import default_model_path
from tests.model.runner import assert_last_logits_match
from tests import quant_blocks
from tests.model.tiny_models import make_tiny_model

transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")


def test_smollm2_dequantized_tensors_equal_transformers_gguf_loading():
    path = default_model_path()
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                           dtype=torch.float32)
    want = hf.state_dict()
    seen = 0
    for name, tensor in GGUFModelFile(path).weights(torch.float32, progress=False):
        assert name in want, name
        assert torch.equal(tensor, want[name]), f"{name} differs"
        seen += 1
    assert seen == 30 * 9 + 2  # 9 tensors per layer, embedding, final norm (tied lm_head)


def permute_qk(w: np.ndarray, n_heads: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf permutation of Q/K (the inverse of what corellm undoes)."""
    return w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def add_model_fields(w, c) -> None:
    """An HF config's hyper-parameters as GGUF metadata (in w's architecture), and a placeholder
    tokenizer (tokens t0, t1, ...)."""
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    rope = getattr(c, "rope_parameters", None) or {}
    rope = rope.get("full_attention", rope)  # (Olmo 3's: one per layer type)
    w.add_rope_freq_base(float(getattr(c, "rope_theta", None) or rope["rope_theta"]))
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_vocab_size(c.vocab_size)
    w.add_tokenizer_model("gpt2")
    w.add_token_list([f"t{i}" for i in range(c.vocab_size)])
    w.add_token_types([1] * c.vocab_size)
    w.add_token_merges([])
    w.add_eos_token_id(2)


LLAMA_LAYER_TENSORS = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
                       "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
                       "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
                       "mlp.down_proj": "ffn_down"}


def write_tensors_and_close(w, hf_model, layer_tensors: dict[str, str], tensor_type: str = "F32",
                            permute: bool = True) -> None:
    """hf_model's tensors under GGUF names (layer_tensors: an HF layer module -> its GGUF name; q/k
    permuted as llama.cpp's converter permutes a "llama" file's), 2-D ones in tensor_type, then the
    file written."""
    c = hf_model.config
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    for name, t in hf_model.state_dict().items():
        a = t.float().numpy()
        if name.startswith("model.layers."):
            i, rest = name[len("model.layers."):].split(".", 1)
            stem, kind = rest.rsplit(".", 1)
            if permute and stem == "self_attn.q_proj":
                a = permute_qk(a, c.num_attention_heads)
            elif permute and stem == "self_attn.k_proj":
                a = permute_qk(a, c.num_key_value_heads)
            gname = f"blk.{i}.{layer_tensors[stem]}.{kind}"
        else:
            gname = names[name]
        if tensor_type != "F32" and a.ndim == 2:
            w.add_tensor(gname, quant_blocks.quantize(a, tensor_type),
                         raw_dtype=getattr(gguf.GGMLQuantizationType, tensor_type))
        else:
            w.add_tensor(gname, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_llama_gguf(hf_model, path, tensor_type=gguf.GGMLQuantizationType.F32):
    w = gguf.GGUFWriter(str(path), "llama")
    add_model_fields(w, hf_model.config)
    write_tensors_and_close(w, hf_model, LLAMA_LAYER_TENSORS, tensor_type.name)


@pytest.mark.parametrize("tensor_type", ["F32", "Q8_0"])
def test_tiny_llama_gguf_logits_match_transformers(tmp_path, tensor_type):
    hf = make_tiny_model("llama_tied", tmp_path / "hf")
    hf.config.tie_word_embeddings = False  # write an explicit output.weight too
    qtype = getattr(gguf.GGMLQuantizationType, tensor_type)
    path = tmp_path / "tiny.gguf"
    hf_state = {k: v for k, v in hf.state_dict().items()}
    hf_state.setdefault("lm_head.weight", hf.get_input_embeddings().weight)
    write_llama_gguf(hf, path, qtype)
    ours = load_model(str(path), dtype="float32", progress=False)
    assert ours.config.num_key_value_heads == 4 and not ours.config.tie_word_embeddings
    tol = dict(atol=2e-4, rtol=1e-4) if tensor_type == "F32" else dict(atol=0.05, rtol=0.05)
    assert_last_logits_match(ours.model, hf, list(range(5, 69)), **tol)


def test_unsupported_gguf_architecture_is_named(tmp_path):
    path = tmp_path / "phi.gguf"
    w = gguf.GGUFWriter(str(path), "phi2")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(UnsupportedModelError, match="GGUF architecture 'phi2' is not supported"):
        load_model(str(path))


def test_not_a_gguf_file(tmp_path):
    path = tmp_path / "junk.gguf"
    path.write_bytes(b"not a gguf file at all")
    with pytest.raises(ValueError, match="junk.gguf: not a readable GGUF file"):
        load_model(str(path))
