"""GptOssCheckpoint: a gpt-oss HF checkpoint's expert and router tensors under the names every other
mixture of experts' take (Qwen3-MoE's: mlp.gate, mlp.experts.E.gate_proj / up_proj / down_proj),
as model/llama.py's split_fused_projections reads them.

The checkpoint holds each layer's experts stacked and transposed (x W):

    mlp.experts.gate_up_proj       [experts, hidden, 2 x intermediate]  gate and up columns interleaved
    mlp.experts.gate_up_proj_bias  [experts, 2 x intermediate]          (gate 2i, up 2i + 1)
    mlp.experts.down_proj          [experts, intermediate, hidden]
    mlp.experts.down_proj_bias     [experts, hidden]
    mlp.router.weight / .bias

or, in the official releases (quantization_config mxfp4), gate_up_proj and down_proj each as two
tensors, _blocks [experts, out, in / 32, 16] and _scales [experts, out, in / 32] (model/mxfp4.py),
out-major: those are kept as MXFP4 QuantizedTensors (keep_mxfp4: quantization "mxfp4", computed by
quant_gemm as they are, gate and up rows apart), or dequantized once both halves have come and split
as the others."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch

from corellm.model.mxfp4 import GGML_MXFP4, dequantize_mxfp4, gguf_rows
from corellm.model.quantized_tensor import QuantizedTensor

if TYPE_CHECKING:
    from corellm.model.model_config import ModelConfig

_STACKED = re.compile(r"^(model\.layers\.\d+\.mlp\.)"
                      r"(experts\.gate_up_proj|experts\.gate_up_proj_bias|experts\.down_proj|"
                      r"experts\.down_proj_bias|router\.weight|router\.bias)$")
_MXFP4 = re.compile(r"^(model\.layers\.\d+\.mlp\.)experts\.(gate_up_proj|down_proj)_(blocks|scales)$")


class GptOssCheckpoint:
    def __init__(self, config: ModelConfig, keep_mxfp4: bool = False):
        self.config = config
        self.keep_mxfp4 = keep_mxfp4
        self._halves: dict[tuple[str, str], dict[str, torch.Tensor]] = {}  # MXFP4 pairs still waiting for a half

    def takes(self, name: str) -> bool:
        """Whether `name` is one of the tensors split here."""
        return bool(_STACKED.match(name) or _MXFP4.match(name))

    def split(self, name: str, t: torch.Tensor | QuantizedTensor) -> Iterator[tuple[str, torch.Tensor | QuantizedTensor]]:
        """The per-expert tensors of `name` (nothing yet for an MXFP4 half whose pair is still to come)."""
        mxfp4 = _MXFP4.match(name)
        if mxfp4 is None:
            stacked = _STACKED.match(name)
            yield from self._experts(stacked.group(1), stacked.group(2), t)
            return
        prefix, projection, half = mxfp4.groups()
        halves = self._halves.setdefault((prefix, projection), {})
        halves[half] = t
        if len(halves) < 2:
            return
        del self._halves[(prefix, projection)]
        if self.keep_mxfp4:
            yield from self._mxfp4_experts(prefix, projection, halves["blocks"], halves["scales"])
            return
        weights = dequantize_mxfp4(halves["blocks"], halves["scales"], f"{prefix}experts.{projection}")
        yield from self._experts(prefix, "experts." + projection, weights.transpose(1, 2))

    def check_complete(self) -> None:
        """ValueError naming an MXFP4 half whose pair never came (after the last tensor)."""
        for (prefix, projection), halves in self._halves.items():
            have = next(iter(halves))
            raise ValueError(f"{self.config.source}: {prefix}experts.{projection}_{have} without its "
                             f"_{'scales' if have == 'blocks' else 'blocks'}")

    def _experts(self, prefix: str, kind: str, t: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
        """A layer's router or stacked experts (prefix: the layer's mlp.): each expert's weights
        transposed to [out, in], the gate's columns (the even ones) apart from up's."""
        c = self.config
        if kind.startswith("router."):
            yield prefix + "gate." + kind[len("router."):], t
            return
        if isinstance(t, QuantizedTensor):
            raise ValueError(f"{c.source}: gpt-oss's expert tensor {prefix + kind} in a quantized type is not "
                             f"supported")
        experts, inter, hidden = c.num_experts, c.moe_intermediate_size, c.hidden_size
        expected = {"experts.gate_up_proj": (experts, hidden, 2 * inter),
                    "experts.gate_up_proj_bias": (experts, 2 * inter),
                    "experts.down_proj": (experts, inter, hidden), "experts.down_proj_bias": (experts, hidden)}[kind]
        if tuple(t.shape) != expected:
            raise ValueError(f"{c.source}: tensor {prefix + kind} has shape {tuple(t.shape)}, but the config "
                             f"implies {expected}")
        suffix = "bias" if kind.endswith("_bias") else "weight"
        for e in range(experts):
            if kind.startswith("experts.gate_up_proj"):
                w = t[e] if suffix == "bias" else t[e].t()  # [2 inter(, hidden)], gate and up interleaved
                yield f"{prefix}experts.{e}.gate_proj.{suffix}", w[0::2]
                yield f"{prefix}experts.{e}.up_proj.{suffix}", w[1::2]
            else:
                yield f"{prefix}experts.{e}.down_proj.{suffix}", t[e] if suffix == "bias" else t[e].t()

    def _mxfp4_experts(self, prefix: str, projection: str, blocks: torch.Tensor,
                       scales: torch.Tensor) -> Iterator[tuple[str, QuantizedTensor]]:
        """A layer's MXFP4 gate_up_proj or down_proj kept in MXFP4, per expert: gate_up's even
        output rows the gate's, the odd ones up's."""
        c = self.config
        experts, inter, hidden = c.num_experts, c.moe_intermediate_size, c.hidden_size
        out, k = (2 * inter, hidden) if projection == "gate_up_proj" else (hidden, inter)
        if tuple(blocks.shape) != (experts, out, k // 32, 16) or tuple(scales.shape) != (experts, out, k // 32):
            raise ValueError(f"{c.source}: {prefix}experts.{projection}'s MXFP4 blocks {tuple(blocks.shape)} and "
                             f"scales {tuple(scales.shape)}, but the config implies {(experts, out, k // 32, 16)} "
                             f"and {(experts, out, k // 32)}")

        def kept(rows: slice, e: int) -> QuantizedTensor:
            b, s = blocks[e, rows], scales[e, rows]
            return QuantizedTensor.pack(GGML_MXFP4, gguf_rows(b, s), (b.shape[0], k))

        for e in range(experts):
            if projection == "gate_up_proj":
                yield f"{prefix}experts.{e}.gate_proj.weight", kept(slice(0, None, 2), e)
                yield f"{prefix}experts.{e}.up_proj.weight", kept(slice(1, None, 2), e)
            else:
                yield f"{prefix}experts.{e}.down_proj.weight", kept(slice(None), e)
