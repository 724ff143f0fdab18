"""An encoder-only model in a GGUF file, as llama.cpp's converter writes it: BERT and XLM-RoBERTa
("bert") and Nomic BERT ("nomic-bert") — its EncoderConfig from the file's keys, and its tensors
under the HF checkpoint's names (model/bert.py's): GGUFModelFile's encoder half."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np
import torch

from corellm.model import quantized_tensor
from corellm.model.encoder_config import GGUF_ENCODER_ARCHITECTURES, EncoderConfig
from corellm.model.model_config import UnsupportedModelError
from corellm.model.quantized_tensor import QuantizedTensor

if TYPE_CHECKING:
    from corellm.model.gguf_file import GGUFModelFile

_BLOCK = re.compile(r"^blk\.(\d+)\.(.+)$")
# llama.cpp's BERT names -> BertModel's (model/bert.py)
_BERT_GLOBAL_NAMES = {"token_embd.weight": "embeddings.word_embeddings.weight",
                      "position_embd.weight": "embeddings.position_embeddings.weight",
                      "token_types.weight": "embeddings.token_type_embeddings.weight",
                      "token_embd_norm.weight": "embeddings.LayerNorm.weight",
                      "token_embd_norm.bias": "embeddings.LayerNorm.bias"}
_BERT_LAYER_NAMES = {f"{gguf}.{kind}": f"{hf}.{kind}" for kind in ("weight", "bias") for gguf, hf in (
    ("attn_q", "attention.self.query"), ("attn_k", "attention.self.key"), ("attn_v", "attention.self.value"),
    ("attn_output", "attention.output.dense"), ("attn_output_norm", "attention.output.LayerNorm"),
    ("ffn_up", "intermediate.dense"), ("ffn_down", "output.dense"), ("layer_output_norm", "output.LayerNorm"))}
# llama.cpp's Nomic BERT names ("nomic-bert") -> the Hub checkpoint's (model/bert.py's _nomic_destinations)
_NOMIC_GLOBAL_NAMES = {"token_embd.weight": "embeddings.word_embeddings.weight",
                       "token_types.weight": "embeddings.token_type_embeddings.weight",
                       "token_embd_norm.weight": "emb_ln.weight", "token_embd_norm.bias": "emb_ln.bias"}
_NOMIC_LAYER_NAMES = {f"{gguf}.{kind}": f"{hf}.{kind}" for kind in ("weight", "bias") for gguf, hf in (
    ("attn_qkv", "attn.Wqkv"), ("attn_output", "attn.out_proj"), ("attn_output_norm", "norm1"),
    ("ffn_up", "mlp.fc11"), ("ffn_gate", "mlp.fc12"), ("ffn_down", "mlp.fc2"), ("layer_output_norm", "norm2"))}
# llama.cpp's pooling types (LLAMA_POOLING_TYPE_*) -> corellm's; 0 (none) gives none
_GGUF_POOLING_TYPES = {0: "", 1: "MEAN", 2: "CLS", 3: "LAST"}


def encoder_config(model_file: GGUFModelFile) -> EncoderConfig:
    """A BERT file's (llama.cpp's "bert": an embedding model; its rerankers' heads are not read), or
    a Nomic BERT's ("nomic-bert": rotary positions at rope.freq_base, SwiGLU)."""
    names = set(model_file.tensor_names)
    if names & {"cls.weight", "cls.output.weight"}:
        raise UnsupportedModelError(f"{model_file.path}: a BERT classifier (its cls tensors) is not supported in a GGUF "
                                    f"file; load the HF directory")
    if model_file.arch_field("attention.causal", False):
        raise UnsupportedModelError(f"{model_file.path}: a BERT file with causal attention is not supported")
    pooling = model_file.arch_field("pooling_type")
    if pooling not in (None, *_GGUF_POOLING_TYPES):
        raise UnsupportedModelError(f"{model_file.path}: pooling type {pooling} is not supported (0 none, 1 mean, "
                                    f"2 cls, 3 last)")
    types = next((t for t in model_file.reader.tensors if t.name == "token_types.weight"), None)
    nomic = model_file.arch == "nomic-bert"
    rotary = dict(hidden_act="silu", rope_theta=float(model_file.arch_field("rope.freq_base", 1000.0)), gated_mlp=True,
                  projection_bias="blk.0.attn_output.bias" in names) if nomic else {}
    return EncoderConfig(
        architecture=GGUF_ENCODER_ARCHITECTURES[model_file.arch],
        vocab_size=len(model_file.field("tokenizer.ggml.tokens")),
        hidden_size=int(model_file.arch_field("embedding_length")),
        intermediate_size=int(model_file.arch_field("feed_forward_length")),
        num_hidden_layers=int(model_file.arch_field("block_count")),
        num_attention_heads=int(model_file.arch_field("attention.head_count")),
        max_position_embeddings=int(model_file.arch_field("context_length")),
        type_vocab_size=1 if types is None else int(types.shape[1]),
        layer_norm_eps=float(model_file.arch_field("attention.layer_norm_epsilon", 1e-12)),
        pooling_type=_GGUF_POOLING_TYPES.get(pooling, ""),
        source=str(model_file.path), **rotary)


def encoder_weights(model_file: GGUFModelFile, dtype: torch.dtype, progress: bool, quantized: bool
                    ) -> Iterator[tuple[str, torch.Tensor | QuantizedTensor]]:
    """A BERT file's tensors under BertModel's names (model/bert.py; a Nomic BERT's under its Hub
    checkpoint's): the embeddings and norms dequantized, each projection's weight (q, k, v, or the
    three fused) a QuantizedTensor with `quantized` where quant_gemm computes its type."""
    from tqdm import tqdm

    d = int(model_file.arch_field("embedding_length"))
    nomic = model_file.arch == "nomic-bert"
    global_names, layer_names = (_NOMIC_GLOBAL_NAMES, _NOMIC_LAYER_NAMES) if nomic else \
        (_BERT_GLOBAL_NAMES, _BERT_LAYER_NAMES)
    layer_prefix = "encoder.layers" if nomic else "encoder.layer"
    for t in tqdm(model_file.reader.tensors, desc=f"Loading {model_file.path.name}", unit="tensor", disable=not progress,
                  leave=False):
        m = _BLOCK.match(t.name)
        part = m.group(2) if m else None
        if m and part.startswith("attn_qkv.") and not nomic:  # BERT's q, k and v fused: three row ranges of d
            kind = part.split(".", 1)[1]
            array = model_file.dequantized(t)
            for j, name in enumerate(("query", "key", "value")):
                yield (f"encoder.layer.{m.group(1)}.attention.self.{name}.{kind}",
                       torch.from_numpy(np.ascontiguousarray(array[j * d:(j + 1) * d])).to(dtype))
            continue
        name = global_names.get(t.name) if m is None else (
            f"{layer_prefix}.{m.group(1)}.{layer_names[part]}" if part in layer_names else None)
        if name is None:
            raise UnsupportedModelError(f"{model_file.path}: unexpected tensor {t.name!r}")
        ggml_type = int(t.tensor_type)
        if (quantized and m is not None and part.endswith(".weight") and len(t.shape) == 2
                and quantized_tensor.supported(ggml_type)):
            yield name, QuantizedTensor.pack(ggml_type, t.data, (int(t.shape[1]), int(t.shape[0])))
            continue
        yield name, torch.from_numpy(np.ascontiguousarray(model_file.dequantized(t))).to(dtype)
