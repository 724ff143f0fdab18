"""ModernBertEncoder: ModernBERT (EncoderConfig family "modernbert": gte-modernbert-base,
modernbert-embed-base, gte-reranker-modernbert-base) computing a step's inputs, each whole, into
final hidden states, as transformers' ModernBertModel computes `last_hidden_state`; with a
classification head, a pooled row's label logits.

    h = LayerNorm(word[id])                                  (no position table, no token types)
    per layer (pre-norm; layer 0 has no attention norm):
        x = LayerNorm(h)
        q, k turned by rotary embeddings at their positions: base rope_theta in the full-attention
          layers, rope_local_theta in the sliding ones
        a = concat over heads of softmax(q k^T / sqrt(d)) v, each input alone; in a sliding layer a
          position sees those at most local_window away (transformers' |i - j| <= local_attention / 2)
        h = h + a W_o
        g, u = the two halves of LayerNorm(h) W_i
        h = h + (gelu(g) * u) W_o'                           (silu for hidden_act silu: granite-embedding r2)
    h = LayerNorm(h)                                         (the final norm)

The norms have no biases unless norm_bias; nor do the projections unless projection_bias.
Classification (classify(row), fp32, on the first token's row or the mean of the rows, as the
config's classifier_pooling says):
    logits = W_c LayerNorm(gelu(W_d row + b_d)) + b_c"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from corellm.model.attention_metadata import AttentionMetadata
from corellm.model.encoder_attention import EncoderAttention
from corellm.model.encoder_config import EncoderConfig
from corellm.model.encoder_model import EncoderModel
from corellm.model.layers import Linear
from corellm.model.rope import cos_sin_cache, default_inverse_frequencies
from corellm.ops.rotary import rotary_embedding

# A masked-LM checkpoint's head (ModernBertForMaskedLM: head.*, decoder.*), which an embedding model
# does not read; the prefix transformers' task models put before the encoder's names.
_MLM_PREFIXES = ("head.", "decoder.")
_MODEL_PREFIX = "model."
# hidden_act -> Linear.gated's activation
_GATED = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "silu": "silu"}


def _norm(d: int, bias: bool, dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, torch.Tensor | None]:
    return (torch.empty(d, dtype=dtype, device=device),
            torch.empty(d, dtype=dtype, device=device) if bias else None)


class ModernBertLayer:
    def __init__(self, config: EncoderConfig, index: int, dtype: torch.dtype, device: torch.device):
        d, i, bias = config.hidden_size, config.intermediate_size, config.projection_bias
        self.config = config
        self.attn_norm = None if index == 0 else _norm(d, config.norm_bias, dtype, device)
        self.qkv = Linear(3 * d, d, bias, dtype, device)
        self.attn_out = Linear(d, d, bias, dtype, device)
        self.mlp_norm = _norm(d, config.norm_bias, dtype, device)
        self.mlp_in = Linear(2 * i, d, bias, dtype, device)  # Wi: gelu's half, then the half it multiplies
        self.mlp_out = Linear(d, i, bias, dtype, device)
        self.sliding = bool(config.layer_types) and config.layer_types[index] == "sliding_attention"

    def linears(self) -> list[Linear]:
        return [self.qkv, self.attn_out, self.mlp_in, self.mlp_out]

    def forward(self, h: torch.Tensor, attention: EncoderAttention, positions: torch.Tensor,
                rotary_cos_sin: torch.Tensor) -> torch.Tensor:
        """attention: the step's (its inputs' bounds); rotary_cos_sin: this layer's kind's rotary table."""
        c = self.config
        d, eps = c.hidden_size, c.layer_norm_eps
        x = h if self.attn_norm is None else F.layer_norm(h, (d,), *self.attn_norm, eps)
        qkv = self.qkv(x)
        rotary_embedding(positions, qkv[:, :d], qkv[:, d:2 * d], c.head_dim, rotary_cos_sin, is_neox=True)
        context = attention(qkv, window=c.local_window if self.sliding else 0)
        h = h + self.attn_out(context)
        # GeGLU (or SwiGLU), in the GEMM's store where the path fuses it (Linear.gated)
        inner = self.mlp_in.gated(F.layer_norm(h, (d,), *self.mlp_norm, eps), _GATED[c.hidden_act])
        return h + self.mlp_out(inner)


class ModernBertEncoder(EncoderModel):
    def __init__(self, config: EncoderConfig, dtype: torch.dtype = torch.bfloat16,
                 device: str | torch.device = "cpu"):
        super().__init__(config, dtype, device)
        d = config.hidden_size
        self.word_embeddings = torch.empty((config.vocab_size, d), dtype=dtype, device=self.device)
        self.embedding_norm = _norm(d, config.norm_bias, dtype, self.device)
        self.layers = [ModernBertLayer(config, n, dtype, self.device) for n in range(config.num_hidden_layers)]
        self.final_norm = _norm(d, config.norm_bias, dtype, self.device)
        # The rotary tables by layer kind: [positions, head_dim] fp32, cos then sin
        self.rotary_cos_sin = {
            kind: cos_sin_cache(None, config.max_position_embeddings,
                                default_inverse_frequencies(config.head_dim, theta)).to(self.device)
            for kind, theta in (("full", config.rope_theta), ("sliding", config.rope_local_theta)) if theta}
        # The classification head (None: an embedding model): dense (+ bias), its norm, the classifier
        self.head: tuple[torch.Tensor | None, ...] | None = None
        if config.classifier_kind is not None:
            labels = len(config.classifier_labels)
            norm = _norm(d, config.norm_bias, dtype, self.device)
            self.head = (torch.empty((d, d), dtype=dtype, device=self.device),
                         torch.empty(d, dtype=dtype, device=self.device) if config.classifier_bias else None,
                         *norm, torch.empty((labels, d), dtype=dtype, device=self.device),
                         torch.empty(labels, dtype=dtype, device=self.device))

    # ------------------------------------------------------------------ weights
    def _destinations(self) -> dict[str, tuple[torch.Tensor | Linear, int, int]]:
        """transformers' ModernBertModel names (without the task model's "model.") -> (where, row offset, rows)."""
        dest: dict[str, tuple[torch.Tensor | Linear, int, int]] = {}

        def put(name: str, t: torch.Tensor | Linear | None) -> None:
            if t is not None:
                dest[name] = (t, 0, t.shape[0])

        put("embeddings.tok_embeddings.weight", self.word_embeddings)
        for prefix, norm in (("embeddings.norm", self.embedding_norm), ("final_norm", self.final_norm)):
            put(f"{prefix}.weight", norm[0])
            put(f"{prefix}.bias", norm[1])
        for n, layer in enumerate(self.layers):
            p = f"layers.{n}."
            for name, linear in (("attn.Wqkv", layer.qkv), ("attn.Wo", layer.attn_out), ("mlp.Wi", layer.mlp_in),
                                 ("mlp.Wo", layer.mlp_out)):
                put(f"{p}{name}.weight", linear)
                put(f"{p}{name}.bias", linear.bias)
            for name, norm in (("attn_norm", layer.attn_norm), ("mlp_norm", layer.mlp_norm)):
                if norm is not None:
                    put(f"{p}{name}.weight", norm[0])
                    put(f"{p}{name}.bias", norm[1])
        if self.head is not None:
            names = ("head.dense.weight", "head.dense.bias", "head.norm.weight", "head.norm.bias", "classifier.weight",
                     "classifier.bias")
            for name, t in zip(names, self.head):
                put(name, t)
        return dest

    @staticmethod
    def _encoder_name(name: str) -> str:
        return name[len(_MODEL_PREFIX):] if name.startswith(_MODEL_PREFIX) else name

    def _unread(self, name: str) -> bool:
        return self.head is None and name.startswith(_MLM_PREFIXES)

    def _plain_tensors(self) -> list[torch.Tensor | None]:
        tensors = [self.word_embeddings, *self.embedding_norm, *self.final_norm, *(self.head or ())]
        for layer in self.layers:
            tensors += [*(layer.attn_norm or ()), *layer.mlp_norm]
        return tensors

    # ------------------------------------------------------------------ forward
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionMetadata,
                token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        """As BertEncoder.forward; ModernBERT reads no token types (the input processor lets only type 0 in)."""
        c = self.config
        h = F.layer_norm(F.embedding(input_ids, self.word_embeddings), (c.hidden_size,), *self.embedding_norm,
                         c.layer_norm_eps)
        attention = EncoderAttention(attn.query_start_loc.tolist(), c.num_attention_heads, c.head_dim, h.dtype,
                                     h.device)
        for layer in self.layers:
            h = layer.forward(h, attention, positions, self.rotary_cos_sin["sliding" if layer.sliding else "full"])
        return F.layer_norm(h, (c.hidden_size,), *self.final_norm, c.layer_norm_eps)

    def classify(self, row: torch.Tensor) -> torch.Tensor:
        """The pooled row (fp32 [hidden]: the first token's or the mean, classifier_pooling) -> label
        logits, fp32 [num_labels]."""
        if self.head is None:
            raise ValueError("classify needs a sequence-classification model")
        dense_w, dense_b, norm_w, norm_b, out_w, out_b = (None if t is None else t.float().to(row.device)
                                                          for t in self.head)
        inner = F.gelu(F.linear(row, dense_w, dense_b))
        inner = F.layer_norm(inner, (self.config.hidden_size,), norm_w, norm_b, self.config.layer_norm_eps)
        return F.linear(inner, out_w, out_b)
