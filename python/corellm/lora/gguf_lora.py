"""A llama.cpp LoRA adapter file (GGUF, as llama.cpp's convert_lora_to_gguf.py writes it and
llama-server's --lora loads it) read as a PEFT adapter's updates.

The file: general.type "adapter", adapter.type "lora", adapter.lora.alpha, general.architecture
(the base model's, which must be the served model's); per updated weight W a pair
`blk.{i}.{attn_q,...}.weight.lora_a` (A [r, in]) and `.lora_b` (B [out, r]), in any type the gguf
package dequantizes (F32, F16, BF16, Q8_0, ...). The converter permutes q's and k's rows for rope
as it does the model's (llama and mistral): B's rows are un-permuted back to the HF layout. Scale:
alpha / r, or 1 where alpha is 0 (llama.cpp's rule). Norm updates, which llama.cpp skips, and
updates of the embedding or the output are refused by name here, never skipped."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import torch

from corellm.model.gguf_file import PERMUTED_ARCHITECTURES, hf_name, unpermute_qk
from corellm.model.model_config import GGUF_ARCHITECTURE_OF, ModelConfig

_HF_WEIGHT = re.compile(r"^model\.layers\.(\d+)\.(\w+\.\w+)\.weight$")
# HF projection name (of gguf_file.hf_name) -> PEFT module name
_PROJECTIONS = {"self_attn.q_proj": "q_proj", "self_attn.k_proj": "k_proj", "self_attn.v_proj": "v_proj",
                "self_attn.o_proj": "o_proj", "mlp.gate_proj": "gate_proj", "mlp.up_proj": "up_proj",
                "mlp.down_proj": "down_proj", "self_attn.qkv_proj": "qkv_proj", "mlp.gate_up_proj": "gate_up_proj"}


def read_gguf_lora(name: str, path: Path, config: ModelConfig) -> tuple[dict, float]:
    """({(layer, module): {"A", "B"}}, alpha) of the file; ValueError naming what does not fit."""
    from gguf.quants import dequantize

    from corellm.model.gguf_reader import GGUFContents

    try:
        reader = GGUFContents(path)
    except Exception as e:  # noqa: BLE001 - a damaged file fails in many ways
        raise ValueError(f"LoRA adapter {name!r}: {path} is not a readable GGUF file ({type(e).__name__}: {e})") from None
    fields = reader.fields
    if fields.get("general.type") != "adapter" or fields.get("adapter.type") != "lora":
        raise ValueError(f"LoRA adapter {name!r}: {path} is not a LoRA adapter GGUF (general.type "
                         f"{fields.get('general.type')!r}, adapter.type {fields.get('adapter.type')!r})")
    arch = fields.get("general.architecture")
    if arch != GGUF_ARCHITECTURE_OF.get(config.architecture):
        raise ValueError(f"LoRA adapter {name!r}: {path} is for architecture {arch!r}, the model is "
                         f"{config.architecture}")
    permute = arch in PERMUTED_ARCHITECTURES
    pairs: dict = {}
    for t in reader.tensors:
        base, _, part = t.name.rpartition(".")
        m = _HF_WEIGHT.match(hf_name(base, arch) or "") if part in ("lora_a", "lora_b") else None
        module = _PROJECTIONS.get(m.group(2)) if m else None
        if module is None:
            raise ValueError(f"LoRA adapter {name!r}: tensor {t.name!r} is not an update corellm applies (only the "
                             f"decoder layers' attn_q, attn_k, attn_v, attn_output, ffn_gate, ffn_up, ffn_down; "
                             f"Phi-3's attn_qkv)")
        layer = int(m.group(1))
        try:
            array = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
        except NotImplementedError:
            raise ValueError(f"LoRA adapter {name!r}: tensor {t.name!r} has type {t.tensor_type.name}, which the gguf "
                             f"package cannot dequantize") from None
        if not array.flags.writeable:  # a memory-mapped F32 tensor
            array = array.copy()
        if part == "lora_b" and permute and module in ("q_proj", "k_proj") and array.ndim == 2:
            heads = config.num_attention_heads if module == "q_proj" else config.num_key_value_heads
            array = unpermute_qk(array, heads)
        pairs.setdefault((layer, module), {})["A" if part == "lora_a" else "B"] = torch.from_numpy(
            np.ascontiguousarray(array))
    if not pairs:
        raise ValueError(f"LoRA adapter {name!r}: {path} holds no LoRA tensors")
    return pairs, float(fields.get("adapter.lora.alpha", 0.0) or 0.0)
