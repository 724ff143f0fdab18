"""The Llama-family building blocks over corellm's ops: attention with a paged KV cache, the
SwiGLU (or GeGLU) MLP, and the decoder layer that chains them with RMSNorm and the residual stream.

Weights are fused at load time: q, k, v projections -> one qkv matrix; gate and up -> gate_up.

A change to the layer math here goes into the native decoder stack too
(cpp/src/model/decoder_stack.cpp): tests/model/test_native_stack.py holds the two bit-identical."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from corellm import ops
from corellm.distributed.parallel_state import TensorParallel
from corellm.native import _core
from corellm.ops._checks import check_shape
from corellm.model.attention_metadata import AttentionMetadata
from corellm.model.model_config import ModelConfig
from corellm.model.quantized_tensor import QuantizedTensor
from corellm.model.scaled_weight import ScaledWeight

if TYPE_CHECKING:
    from corellm.lora.lora_batch import LoraBatch
    from corellm.model.tensor_parallel import WholeRowColumns

KVCache = tuple[torch.Tensor, torch.Tensor]  # (key_cache, value_cache) of one layer
# y (in place) += the step's LoRA updates of a projection ("qkv", "o", "gate_up", "down") on its input x; y returned.
LoraUpdate = Callable[[torch.Tensor, torch.Tensor, str], torch.Tensor]


_GEMM = _core.kernels.bf16_gemm_available()
_GELU_FUSED = _GEMM and _core.kernels.bf16_gemm_gelu_fused()  # the process's path stores gelu(y) (amx)


def _gelu_and_mul(y: torch.Tensor) -> torch.Tensor:
    """gelu(gate) * up of y [m, 2d] by torch (GELU's erf form, which no unfused corellm op has)."""
    d = y.shape[1] // 2
    return F.gelu(y[:, :d]) * y[:, d:]


# A gated activation's name (Linear.gated) -> its unfused op
_GATED_ACTIVATIONS = {"silu": ops.silu_and_mul, "gelu_tanh": ops.gelu_tanh_and_mul, "gelu": _gelu_and_mul}

# A shared weight (a tied LM head's embedding) keeps its row-major form for the embedding lookup;
# packing a second copy is worth it up to this size (beyond: oneDNN on the row-major form).
_SHARED_PACK_MAX_ELEMENTS = 64 * 1024 * 1024


_ONEDNN = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")


def _as_gemm_input(x: torch.Tensor) -> torch.Tensor:
    """x as the packed GEMM reads it: bf16 rows with unit column stride (a copy only where not)."""
    return x if x.stride(-1) == 1 and x.dtype == torch.bfloat16 else x.to(torch.bfloat16).contiguous()


class Linear:
    """y = x W^T (+ b). The weight is loaded in parts (q, k and v rows of a fused qkv), each dense
    or a QuantizedTensor (a GGUF quantized type kept as it is, on the CPU). After loading:
    - every part quantized: y is computed part by part by the quantized GEMM (quant_gemm.h),
      parts of one type fused into one;
    - on a GPU with --quantization fp8 / int8: quantized at load per output channel for the
      scaled GEMM (ScaledWeight: CUTLASS's W8A8 kernels), activations quantized per token;
    - else dense: on the CPU in bf16 the weight is packed once for corellm's GEMM
      (cpp/include/corellm/kernels/packed_gemm.h: each row's result independent of the batch;
      bench/kernels.py compares it with oneDNN); where that kernel is missing (not bf16, or a
      weight too large to pack twice) oneDNN's blocked layout is used instead, as torch's CPU
      freezing pass does. Quantized parts beside dense ones are dequantized into it."""

    def __init__(self, out_features: int, in_features: int, bias: bool, dtype: torch.dtype, device: torch.device):
        self.shape = (out_features, in_features)
        self.dtype, self.device = dtype, device
        # The dense weight [out, in], allocated when a dense part arrives (or shared: a tied LM head's embedding).
        self.weight: torch.Tensor | None = None
        self.bias = torch.empty(out_features, dtype=dtype, device=device) if bias else None
        # The weight in corellm's GEMM panel layout (bf16_gemm_pack), or None; public: the native
        # decoder stack (model/native_stack.py) runs on it too.
        self.packed: torch.Tensor | None = None
        self._onednn_packed: torch.Tensor | None = None  # oneDNN's blocked layout (fallback)
        # (first output row, tensor) per quantized part, in row order; public for the native stack.
        self.quantized: list[tuple[int, QuantizedTensor]] = []
        self.scaled: ScaledWeight | None = None  # the GPU's fp8 / int8 weight (finalize's scaled_type)

    def load(self, offset: int, tensor: torch.Tensor | QuantizedTensor) -> None:
        """Rows [offset, offset + len) of the weight (the caller checked the shape)."""
        if isinstance(tensor, QuantizedTensor):
            self.quantized.append((offset, tensor))
            return
        if self.weight is None:
            self.weight = torch.empty(self.shape, dtype=self.dtype, device=self.device)
        self.weight[offset : offset + tensor.shape[0]].copy_(tensor)

    def finalize(self, keep_weight: bool = False, scaled_type: str | None = None) -> None:
        """Lays the loaded weight out for the kernels, then drops the row-major form unless
        keep_weight (it is shared: a tied LM head's embedding). scaled_type ("fp8" / "int8", on a
        GPU): the weight is quantized for the scaled GEMM instead, when its shape allows
        (ScaledWeight.supports; otherwise it stays dense, and weight_bytes shows it)."""
        if self.quantized:
            self._finalize_quantized()
            if self.quantized:
                return
        w = self.weight
        if scaled_type is not None and w is not None and not keep_weight and ScaledWeight.supports(self.shape):
            self.scaled = ScaledWeight.quantize(w, scaled_type)
            self.weight = None
            return
        if w is None or w.device.type != "cpu" or w.dtype != torch.bfloat16:
            return
        n, k = self.shape
        if _GEMM and (not keep_weight or n * k <= _SHARED_PACK_MAX_ELEMENTS):
            self.packed = torch.empty(_core.kernels.bf16_gemm_packed_size(n, k), dtype=torch.bfloat16)
            _core.kernels.bf16_gemm_pack(w.data_ptr(), self.packed.data_ptr(), n, k)
            if not keep_weight:
                self.weight = None
        elif _ONEDNN:
            self._onednn_packed = torch.ops.mkldnn._reorder_linear_weight(w, None)

    def _finalize_quantized(self) -> None:
        parts = sorted(self.quantized, key=lambda p: p[0])
        if self.weight is not None or self.device.type != "cpu":  # beside dense rows, or not on the CPU
            for offset, q in parts:
                self.load(offset, q.dequantize(torch.float32))
            self.quantized = []
            return
        covered = 0
        for offset, q in parts:
            if offset != covered:
                raise ValueError(f"quantized linear {self.shape}: rows from {covered} to {offset} were not loaded")
            covered += q.shape[0]
        fused = QuantizedTensor.concat([q for _, q in parts]) if len(parts) > 1 else None
        self.quantized = [(0, fused)] if fused is not None else parts

    def __call__(self, x: torch.Tensor, out_dtype: torch.dtype | None = None,
                 out: torch.Tensor | None = None) -> torch.Tensor:
        """x [m, in] -> [m, out] in the weight's dtype, or out_dtype (float32 from the packed and
        quantized GEMMs: their fp32 sums, not rounded to bf16 first). out: where to write it (a
        contiguous [m, out] tensor of that dtype, e.g. a buffer the caller reuses: the packed and
        quantized GEMMs write into it; the other paths copy their result there); returned."""
        y_dtype = out_dtype or self.dtype
        if out is not None:
            check_shape("Linear", "out", out, (x.shape[0], self.shape[0]))
            if out.dtype != y_dtype or not out.is_contiguous():
                raise ValueError(f"Linear: out must be a contiguous {y_dtype} tensor, got {out.dtype}"
                                 f"{'' if out.is_contiguous() else ', not contiguous'}")
        if self.quantized:
            return self._quantized_call(x, y_dtype, out)
        if self.packed is not None:
            n, k = self.shape
            x = _as_gemm_input(x)
            f32 = y_dtype == torch.float32
            y = out if out is not None else torch.empty((x.shape[0], n), dtype=torch.float32 if f32 else torch.bfloat16)
            _core.kernels.bf16_gemm(x.data_ptr(), x.stride(0), self.packed.data_ptr(),
                                    0 if self.bias is None else self.bias.data_ptr(), y.data_ptr(), n, x.shape[0],
                                    n, k, _core.kernels.DTYPE_F32 if f32 else _core.kernels.DTYPE_BF16)
            return y
        if self.scaled is not None:
            y = self.scaled.matmul(x)
            if self.bias is not None:
                y += self.bias
        elif self._onednn_packed is not None:
            y = torch.ops.mkldnn._linear_pointwise(x.contiguous(), self._onednn_packed, self.bias, "none", [], "")
        else:
            y = F.linear(x, self.weight, self.bias)
        if out is not None:
            return out.copy_(y)
        return y.to(y_dtype)

    def gelu(self, x: torch.Tensor) -> torch.Tensor:
        """gelu(x W^T + b) in the weight's dtype, GELU in its erf form (BERT's MLP). Where the weight
        is packed and the process's path fuses it (amx: bf16_gemm_gelu), in the GEMM's store: each
        value rounded to bf16 as y would be, then GELU (erf within 1.5e-7), rounded again; else this
        linear, then torch's GELU. Either way a row's result does not depend on the batch."""
        if self.packed is None or not _GELU_FUSED:
            return F.gelu(self(x))
        n, k = self.shape
        x = _as_gemm_input(x)
        y = torch.empty((x.shape[0], n), dtype=torch.bfloat16)
        _core.kernels.bf16_gemm_gelu(x.data_ptr(), x.stride(0), self.packed.data_ptr(),
                                     0 if self.bias is None else self.bias.data_ptr(), y.data_ptr(), n, x.shape[0],
                                     n, k)
        return y

    def gated(self, x: torch.Tensor, activation: str = "silu") -> torch.Tensor:
        """act(gate) * up of this linear's output [m, 2d] (gate's columns first: a fused gate and up
        projection), [m, d] in the weight's dtype; act: "silu" (SwiGLU), "gelu_tanh" or "gelu" (GeGLU,
        GELU's tanh or erf form). Where the weight is packed and the process's path fuses it
        (bf16_gemm_gated: amx, avx512bf16, avx512, d a multiple of 32), in the GEMM's store without
        writing the [m, 2d] output — silu and gelu_tanh with ops.silu_and_mul's / gelu_tanh_and_mul's
        arithmetic, the same bits; gelu with the erf of gelu_erf16 (within 1.5e-7) on the rounded
        gate, the product rounded once; else this linear, then those ops (gelu: torch's, each step
        rounded to the dtype). One way per process and model: a row's result does not depend on the batch."""
        if activation not in _GATED_ACTIVATIONS:
            raise ValueError(f"Linear.gated: activation must be one of {', '.join(_GATED_ACTIVATIONS)}, "
                             f"got {activation!r}")
        n, k = self.shape
        if self.packed is None or not _core.kernels.bf16_gemm_gated_fused(n):
            return _GATED_ACTIVATIONS[activation](self(x))
        x = _as_gemm_input(x)
        y = torch.empty((x.shape[0], n // 2), dtype=torch.bfloat16)
        _core.kernels.bf16_gemm_gated(x.data_ptr(), x.stride(0), self.packed.data_ptr(),
                                      0 if self.bias is None else self.bias.data_ptr(), y.data_ptr(), n // 2,
                                      x.shape[0], n, k, activation)
        return y

    def _quantized_call(self, x: torch.Tensor, out_dtype: torch.dtype, out: torch.Tensor | None) -> torch.Tensor:
        y = out if out is not None else torch.empty((x.shape[0], self.shape[0]), dtype=out_dtype)
        # A bf16 bias is added by the kernel before its one rounding; an fp32 one after, the same sum.
        in_kernel = self.bias is not None and self.bias.dtype == torch.bfloat16
        for offset, q in self.quantized:
            rows = q.shape[0]
            bias = self.bias[offset : offset + rows] if in_kernel else None
            q.matmul_into(x, y[:, offset : offset + rows], bias)
        if self.bias is not None and not in_kernel:
            y += self.bias.to(out_dtype)
        return y


class Embedding:
    """The token embedding table [vocab, hidden]: dense, or a QuantizedTensor whose rows are
    dequantized on lookup."""

    def __init__(self, vocab_size: int, hidden_size: int, dtype: torch.dtype, device: torch.device):
        self.shape = (vocab_size, hidden_size)
        self.dtype, self.device = dtype, device
        self.weight: torch.Tensor | None = None
        self.quantized: QuantizedTensor | None = None

    def load(self, offset: int, tensor: torch.Tensor | QuantizedTensor) -> None:
        if isinstance(tensor, QuantizedTensor):
            if self.device.type == "cpu":
                self.quantized = tensor
                return
            tensor = tensor.dequantize(torch.float32)
        if self.weight is None:
            self.weight = torch.empty(self.shape, dtype=self.dtype, device=self.device)
        self.weight[offset : offset + tensor.shape[0]].copy_(tensor)

    def __call__(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.quantized is not None:
            return self.quantized.dequantize_rows(input_ids, self.dtype)
        return F.embedding(input_ids, self.weight)


class Attention:
    def __init__(self, config: ModelConfig, dtype: torch.dtype, device: torch.device, layer: int = 0,
                 tp: TensorParallel = TensorParallel(), qk_whole: WholeRowColumns | None = None):
        """config: this rank's share of the model (tensor parallelism: its heads); o_proj's partial
        output is summed over the group. qk_whole: OLMoE's whole-row q/k norms over a group, where
        this rank's columns sit in the whole rows (its q_norm and k_norm are then the whole rows')."""
        self.tp = tp
        self.qk_whole = qk_whole
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.q_size, self.kv_size = config.q_size, config.kv_size
        self.scale = config.attention_scale
        self.softcap = config.attn_logit_softcapping  # Gemma 2 (0: none)
        self.use_rope = config.layer_uses_rope(layer)  # False: a NoPE layer (SmolLM3)
        self.rope_interleaved = config.rope_interleaved  # ERNIE 4.5: GPT-J's pairs, not NeoX's halves
        self.eps = config.rms_norm_eps
        self.sliding_window = config.layer_window(layer)
        empty = lambda *shape: torch.empty(shape, dtype=dtype, device=device)  # noqa: E731
        # qkv [q+2kv, hidden] (q, k, v projections fused), o [hidden, q]
        self.qkv_proj = Linear(self.q_size + 2 * self.kv_size, config.hidden_size, config.attention_bias, dtype, device)
        self.o_proj = Linear(config.hidden_size, self.q_size, config.attention_output_bias, dtype, device)
        # gpt-oss: a sink logit per head [heads] fp32 in each row's softmax denominator (None: none)
        self.sinks = torch.empty(self.num_heads, dtype=torch.float32, device=device) if config.attention_sinks \
            else None
        # Per head [head_dim] (Qwen3, Gemma 3), or over the whole rows [q] and [kv] (OLMoE).
        self.qk_norm_whole = config.qk_norm_whole
        q_norm_size, k_norm_size = (self.q_size, self.kv_size) if config.qk_norm_whole else (self.head_dim,) * 2
        if qk_whole is not None:
            q_norm_size, k_norm_size = qk_whole.q_whole, qk_whole.kv_whole
        self.q_norm = empty(q_norm_size) if config.qk_norm else None
        self.k_norm = empty(k_norm_size) if config.qk_norm else None

    def forward(self, positions: torch.Tensor, h: torch.Tensor, attn: AttentionMetadata, kv_cache: KVCache,
                cos_sin_cache: torch.Tensor, lora: LoraUpdate | None = None) -> torch.Tensor:
        """lora: adds the step's LoRA adapters' updates to a projection's output (LoraBatch.add)."""
        num_tokens = h.shape[0]
        qkv = self.qkv_proj(h)  # [num_tokens, q + 2kv]
        if lora is not None:
            lora(qkv, h, "qkv")
        q = qkv[:, : self.q_size]
        k = qkv[:, self.q_size : self.q_size + self.kv_size]
        v = qkv[:, self.q_size + self.kv_size :]
        if self.q_norm is not None and self.qk_whole is not None:  # OLMoE over a group
            q, k = self._gathered_qk_norm(q, k)
        elif self.q_norm is not None and self.qk_norm_whole:  # OLMoE: over each token's whole q and k
            q, k = ops.rms_norm(q, self.q_norm, self.eps), ops.rms_norm(k, self.k_norm, self.eps)
        elif self.q_norm is not None:  # Qwen3, Gemma 3: RMSNorm over each head's dims
            q = ops.rms_norm(q.reshape(-1, self.head_dim), self.q_norm, self.eps).view(num_tokens, -1)
            k = ops.rms_norm(k.reshape(-1, self.head_dim), self.k_norm, self.eps).view(num_tokens, -1)
        if self.use_rope:
            ops.rotary_embedding(positions, q, k, self.head_dim, cos_sin_cache, is_neox=not self.rope_interleaved)
        key_cache, value_cache = kv_cache
        ops.reshape_and_cache(k, v, key_cache, value_cache, attn.slot_mapping)
        out = ops.paged_attention(q, key_cache, value_cache, attn.block_table, attn.seq_lens,
                                  attn.query_start_loc, self.scale, self.sliding_window,
                                  max_query_len=attn.max_query_len or None, max_seq_len=attn.max_seq_len or None,
                                  softcap=self.softcap, sinks=self.sinks)
        o = self.o_proj(out)
        if lora is not None:
            lora(o, out, "o")
        return self.tp.all_reduce(o)

    def _gathered_qk_norm(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q and k normed over each token's whole q and k rows, gathered from the group: every rank
        writes its columns into rows of zeros and the rows are all-reduced (adding zeros is exact),
        so every rank norms the rows one process would; this rank's columns of them."""
        w = self.qk_whole
        rows = q.new_zeros(q.shape[0], w.q_whole + w.kv_whole)
        rows[:, w.q_start:w.q_start + self.q_size] = q
        if w.writes_k:
            rows[:, w.q_whole + w.k_start:w.q_whole + w.k_start + self.kv_size] = k
        self.tp.all_reduce(rows)
        q_rows = ops.rms_norm(rows[:, :w.q_whole], self.q_norm, self.eps)
        k_rows = ops.rms_norm(rows[:, w.q_whole:], self.k_norm, self.eps)
        return q_rows[:, w.q_start:w.q_start + self.q_size], k_rows[:, w.k_start:w.k_start + self.kv_size]


class MLP:
    def __init__(self, config: ModelConfig, dtype: torch.dtype, device: torch.device,
                 tp: TensorParallel = TensorParallel(), intermediate_size: int | None = None, bias: bool = False):
        """intermediate_size: the gate's and up's rows (default: the config's; an expert's: its own);
        bias: gate_up and down have biases (gpt-oss's experts)."""
        self.tp = tp  # down_proj's partial output is summed over the group
        inter = intermediate_size or config.intermediate_size
        # gate_up [2 * intermediate, hidden] (gate and up fused), down [hidden, intermediate]
        self.gate_up_proj = Linear(2 * inter, config.hidden_size, bias, dtype, device)
        self.down_proj = Linear(config.hidden_size, inter, bias, dtype, device)
        # SwiGLU, GeGLU (Gemma: GELU's tanh approximation) or gpt-oss's clamped SwiGLU; act(gate) * up
        # in fp32, rounded once.
        if config.hidden_activation == "gelu_pytorch_tanh":
            self.gated_activation = ops.gelu_tanh_and_mul
        elif config.hidden_activation == "swigluoai":
            self.gated_activation = functools.partial(ops.swigluoai_and_mul, alpha=config.swiglu_alpha,
                                                      limit=config.swiglu_limit)
        else:
            self.gated_activation = ops.silu_and_mul

    def forward(self, h: torch.Tensor, lora: LoraUpdate | None = None) -> torch.Tensor:
        if lora is None:
            return self.tp.all_reduce(self.down_proj(self.gated_activation(self.gate_up_proj(h))))
        gate_up = lora(self.gate_up_proj(h), h, "gate_up")  # before the activation
        act = self.gated_activation(gate_up)
        return self.tp.all_reduce(lora(self.down_proj(act), act, "down"))

    def linears(self) -> list[Linear]:
        return [self.gate_up_proj, self.down_proj]


class SparseMoe:
    """A mixture-of-experts MLP (Mixtral, Qwen3-MoE, Qwen2-MoE, OLMoE): a router [num_experts,
    hidden] rates the experts for each token; the token runs the top_k best, each a gated MLP of
    its own, and its output is their outputs summed by the router's weights. In steps:
      logits = router(h) in fp32;  (ids, weights) = ops.moe_route(logits)   per token
      for each expert that some token chose, in expert order: its tokens' rows of h, gathered,
        through the expert's MLP, into rows[t * top_k + j] (the token's j-th choice)
      out = ops.moe_combine(rows, weights)   per token, in fp32, rounded once
    With a shared expert (Qwen2-MoE), every token also runs it, and the combine adds its output
    times sigmoid(its gate's logit) before the one rounding (ERNIE 4.5's, ungated: its output). ERNIE
    4.5 chooses by p + a learned bias per expert (selection_bias), the weights still p; gpt-oss's router
    and experts have biases, and its weights are the softmax of the top k's logits (the renormalized
    p). Every step is row by row (the GEMMs
    compute a row alike whichever rows share the call), so a token's result does not depend on the
    step's other tokens. The native decoder stack (decoder_stack.cpp's sparse_mlp) runs the same
    steps. Under tensor parallelism every rank holds a slice of each expert's intermediate rows
    and the whole router: it routes as the others do, and its combined output is a partial sum,
    summed over the group once."""

    def __init__(self, config: ModelConfig, dtype: torch.dtype, device: torch.device,
                 tp: TensorParallel = TensorParallel()):
        self.tp = tp  # the experts' MLPs are not reduced one by one: their weighted sum is, once
        self.top_k, self.renormalize = config.num_experts_per_tok, config.norm_topk_prob
        self.renormalize_min = config.moe_renormalize_min
        self.router = Linear(config.num_experts, config.hidden_size, config.moe_router_bias, dtype, device)
        # ERNIE 4.5's per-expert bias on the choice (fp32 [experts]); None: none
        self.selection_bias = torch.empty(config.num_experts, dtype=torch.float32, device=device) \
            if config.moe_selection_bias else None
        self.experts = [MLP(config, dtype, device, intermediate_size=config.moe_intermediate_size,
                            bias=config.expert_bias) for _ in range(config.num_experts)]
        shared = config.shared_expert_intermediate_size
        self.shared_expert = MLP(config, dtype, device, intermediate_size=shared) if shared else None
        self.shared_expert_gate = Linear(1, config.hidden_size, False, dtype, device) \
            if shared and config.shared_expert_gated else None

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        shared = shared_gate = None
        if self.shared_expert is not None:
            shared = self.shared_expert.forward(h)
            if self.shared_expert_gate is not None:
                shared_gate = self.shared_expert_gate(h, out_dtype=torch.float32).view(-1)
        ids, weights = ops.moe_route(self.router(h, out_dtype=torch.float32), self.top_k, self.renormalize,
                                     self.selection_bias, self.renormalize_min)
        rows = torch.empty((h.shape[0] * self.top_k, h.shape[1]), dtype=h.dtype, device=h.device)
        choices = ids.view(-1).long()  # choice p = t * top_k + j
        order = torch.argsort(choices, stable=True)
        counts = torch.bincount(choices, minlength=len(self.experts)).tolist()
        start = 0
        for expert, count in zip(self.experts, counts):
            if count:
                picked = order[start : start + count]
                rows[picked] = expert.forward(h[picked // self.top_k])
                start += count
        return self.tp.all_reduce(ops.moe_combine(rows, weights, shared=shared, shared_gate=shared_gate))

    def linears(self) -> list[Linear]:
        mlps = self.experts + ([self.shared_expert] if self.shared_expert is not None else [])
        gate = [self.shared_expert_gate] if self.shared_expert_gate is not None else []
        return [self.router, *gate] + [linear for mlp in mlps for linear in mlp.linears()]


class DecoderLayer:
    def __init__(self, config: ModelConfig, dtype: torch.dtype, device: torch.device, layer: int = 0,
                 tp: TensorParallel = TensorParallel(), qk_whole: WholeRowColumns | None = None):
        """qk_whole: Attention's."""
        self.eps = config.rms_norm_eps
        self.index = layer
        norm = lambda: torch.empty(config.hidden_size, dtype=dtype, device=device)  # noqa: E731
        # Before the attention and before the MLP (Gemma's pre_feedforward_layernorm); OLMo 2 has neither.
        self.input_norm = norm() if config.pre_norms else None
        self.post_attention_norm = norm() if config.pre_norms else None
        # Gemma's sandwich norms: on the attention's output and on the MLP's, before each joins the stream.
        self.attention_output_norm = norm() if config.sandwich_norms else None
        self.mlp_output_norm = norm() if config.sandwich_norms else None
        self.residual_multiplier = config.residual_multiplier  # on the attention's and the MLP's outputs
        self.attn = Attention(config, dtype, device, layer, tp, qk_whole)
        # A mixture of experts' sparse layers: SparseMoe.
        self.mlp = SparseMoe(config, dtype, device, tp) if config.layer_is_sparse(layer) \
            else MLP(config, dtype, device, tp)

    def forward(self, positions: torch.Tensor, h: torch.Tensor, residual: torch.Tensor | None,
                attn: AttentionMetadata, kv_cache: KVCache, cos_sin_cache: torch.Tensor,
                lora: LoraBatch | None = None):
        """The residual stream is carried un-normalized: the layer's output is (h, residual) and
        the stream after it is h + residual (added by the next norm, fused). lora: the step's
        tokens' LoRA adapters, whose updates go into the projections' outputs."""
        update = None if lora is None else functools.partial(lora.add, layer=self.index)
        if self.input_norm is None:  # OLMo 2: the stream itself goes in
            residual = h if residual is None else residual + h
            h = residual
        elif residual is None:
            residual = h
            h = ops.rms_norm(h, self.input_norm, self.eps)
        else:
            h, residual = ops.fused_add_rms_norm(h, residual, self.input_norm, self.eps)
        h = self.attn.forward(positions, h, attn, kv_cache, cos_sin_cache, update)
        if self.attention_output_norm is not None:
            h = ops.rms_norm(h, self.attention_output_norm, self.eps)
        if self.residual_multiplier != 1.0:  # Granite
            ops.scale(h, self.residual_multiplier)
        if self.post_attention_norm is None:
            residual = residual + h
            h = residual
        else:
            h, residual = ops.fused_add_rms_norm(h, residual, self.post_attention_norm, self.eps)
        h = self.mlp.forward(h) if isinstance(self.mlp, SparseMoe) else self.mlp.forward(h, update)
        if self.mlp_output_norm is not None:
            h = ops.rms_norm(h, self.mlp_output_norm, self.eps)
        if self.residual_multiplier != 1.0:
            ops.scale(h, self.residual_multiplier)
        return h, residual

    def norms(self) -> list[torch.Tensor]:
        """The layer's weights outside its linear layers: its norms (and gpt-oss's attention sinks)."""
        return [t for t in (self.input_norm, self.post_attention_norm, self.attention_output_norm,
                            self.mlp_output_norm, self.attn.q_norm, self.attn.k_norm, self.attn.sinks) if t is not None]

    def linears(self) -> list[Linear]:
        return [self.attn.qkv_proj, self.attn.o_proj, *self.mlp.linears()]
