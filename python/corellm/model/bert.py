"""BertEncoder: an encoder-only model (EncoderConfig: BERT, RoBERTa, XLM-RoBERTa, Nomic BERT)
computing a step's inputs, each whole, into final hidden states, as transformers' BertModel /
XLMRobertaModel / NomicBertModel compute `last_hidden_state`; with a classification head, a pooled
row's label logits.

    h = LayerNorm(word[id] + type[token type] + position[offset + p])     (the embeddings)
    per layer (post-norm):
        a = concat over heads of softmax(q k^T / sqrt(d)) v, each input alone, every position seeing every other
        h = LayerNorm(h + a W_o + b_o)
        h = LayerNorm(h + gelu(h W_i + b_i) W_out + b_out)

Nomic BERT (rope_theta set, gated_mlp, no projection biases): no position table; q and k turned by
rotary embeddings (NeoX-style, over the whole head) at their positions; the MLP SwiGLU (in the
GEMM's store where the path fuses it: Linear.gated):
        h = LayerNorm(h + (silu(h W_gate) * (h W_up)) W_out)

The projections run through corellm's Linear (in bf16 on the CPU its packed GEMM: a row's result
does not depend on the batch; on the amx path the MLP's GELU is applied in the GEMM's store); the
attention through EncoderAttention (on the CPU corellm's attention kernel, bidirectional, the
whole step at once), so that an input's rows are the same whatever else the step holds. No KV cache:
an input is computed in one step (the engine schedules encoders without chunked prefill or prefix
caching), and nothing of it is kept for a later one.

Classification (classify(row), on the first token's row, fp32):
    bert_pooler   logits = W_c tanh(W_p row + b_p) + b_c       (BertForSequenceClassification)
    roberta_head  logits = W_o tanh(W_d row + b_d) + b_o       (RobertaForSequenceClassification)"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from corellm.model.attention_metadata import AttentionMetadata
from corellm.model.encoder_attention import EncoderAttention
from corellm.model.encoder_config import ENCODER_ACTIVATIONS, EncoderConfig
from corellm.model.encoder_model import EncoderModel
from corellm.model.layers import Linear
from corellm.model.rope import cos_sin_cache, default_inverse_frequencies
from corellm.ops.rotary import rotary_embedding

# Tensors a checkpoint may carry that an encoder's embeddings and classification do not read: the
# position-id buffer older files saved, a masked-LM or pre-training head, an embedding model's pooler.
_UNREAD_PREFIXES = ("cls.", "lm_head.")
_UNREAD_NAMES = ("embeddings.position_ids",)
# Prefixes transformers' task models put before the encoder's own names (base_model_prefix).
_ENCODER_PREFIXES = ("bert.", "roberta.")


class EncoderLayer:
    """One post-norm encoder layer: fused q/k/v (with biases unless projection_bias is off), the
    attention's output projection and norm, the GELU MLP (or SwiGLU: gate and up fused in mlp_in,
    gate's rows first) and its norm."""

    def __init__(self, config: EncoderConfig, dtype: torch.dtype, device: torch.device):
        d, i, bias = config.hidden_size, config.intermediate_size, config.projection_bias
        self.config = config
        self.qkv = Linear(3 * d, d, bias, dtype, device)
        self.attn_out = Linear(d, d, bias, dtype, device)
        self.mlp_in = Linear(2 * i if config.gated_mlp else i, d, bias, dtype, device)
        self.mlp_out = Linear(d, i, bias, dtype, device)
        self.attn_norm = (torch.empty(d, dtype=dtype, device=device), torch.empty(d, dtype=dtype, device=device))
        self.mlp_norm = (torch.empty(d, dtype=dtype, device=device), torch.empty(d, dtype=dtype, device=device))

    def linears(self) -> list[Linear]:
        return [self.qkv, self.attn_out, self.mlp_in, self.mlp_out]

    def forward(self, h: torch.Tensor, attention: EncoderAttention, positions: torch.Tensor,
                rotary_cos_sin: torch.Tensor | None) -> torch.Tensor:
        """attention: the step's (its inputs' bounds); rotary_cos_sin: the rotary table (model/rope.py's),
        which turns q and k at `positions` in place; None: positions are in h already (a position table)."""
        c = self.config
        eps, d = c.layer_norm_eps, c.hidden_size
        qkv = self.qkv(h)
        if rotary_cos_sin is not None:
            rotary_embedding(positions, qkv[:, :d], qkv[:, d:2 * d], c.head_dim, rotary_cos_sin, is_neox=True)
        context = attention(qkv)
        h = F.layer_norm(self.attn_out(context) + h, (d,), *self.attn_norm, eps)
        approximate = ENCODER_ACTIVATIONS[c.hidden_act]
        if c.gated_mlp:
            inner = self.mlp_in.gated(h, "silu")
        elif approximate == "none":
            inner = self.mlp_in.gelu(h)
        else:
            inner = F.gelu(self.mlp_in(h), approximate=approximate)
        return F.layer_norm(self.mlp_out(inner) + h, (d,), *self.mlp_norm, eps)


class BertEncoder(EncoderModel):
    def __init__(self, config: EncoderConfig, dtype: torch.dtype = torch.bfloat16,
                 device: str | torch.device = "cpu"):
        super().__init__(config, dtype, device)
        d = config.hidden_size
        empty = lambda *shape: torch.empty(shape, dtype=dtype, device=self.device)  # noqa: E731
        self.word_embeddings = empty(config.vocab_size, d)
        # A position table, or (rotary positions) the rotary table: [positions, head_dim] fp32, cos then sin
        self.position_embeddings = None if config.rope_theta else empty(config.max_position_embeddings, d)
        self.rotary_cos_sin = None
        if config.rope_theta:
            self.rotary_cos_sin = cos_sin_cache(None, config.max_position_embeddings, default_inverse_frequencies(
                config.head_dim, config.rope_theta)).to(self.device)
        self.token_type_embeddings = empty(config.type_vocab_size, d)
        self.embedding_norm = (empty(d), empty(d))
        self.layers = [EncoderLayer(config, dtype, self.device) for _ in range(config.num_hidden_layers)]
        # The classification head (None: an embedding model): two linear maps with a tanh between.
        self.head: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        if config.classifier_kind is not None:
            self.head = (empty(d, d), empty(d), empty(len(config.classifier_labels), d),
                         empty(len(config.classifier_labels)))

    # ------------------------------------------------------------------ weights
    def _destinations(self) -> dict[str, tuple[torch.Tensor | Linear, int, int]]:
        """The encoder's tensor names (without a task model's prefix) -> (where, row offset, rows)."""
        if self.config.family == "nomic_bert":
            return self._nomic_destinations()
        whole = lambda t: (t, 0, t.shape[0])  # noqa: E731
        dest: dict[str, tuple[torch.Tensor | Linear, int, int]] = {
            "embeddings.word_embeddings.weight": whole(self.word_embeddings),
            "embeddings.position_embeddings.weight": whole(self.position_embeddings),
            "embeddings.token_type_embeddings.weight": whole(self.token_type_embeddings),
            "embeddings.LayerNorm.weight": whole(self.embedding_norm[0]),
            "embeddings.LayerNorm.bias": whole(self.embedding_norm[1]),
        }
        d = self.config.hidden_size
        for i, layer in enumerate(self.layers):
            p = f"encoder.layer.{i}."
            for j, part in enumerate(("query", "key", "value")):  # rows j*d .. (j+1)*d of the fused q/k/v
                dest[f"{p}attention.self.{part}.weight"] = (layer.qkv, j * d, d)
                dest[f"{p}attention.self.{part}.bias"] = (layer.qkv.bias, j * d, d)
            for name, linear in (("attention.output.dense", layer.attn_out), ("intermediate.dense", layer.mlp_in),
                                 ("output.dense", layer.mlp_out)):
                dest[f"{p}{name}.weight"] = (linear, 0, linear.shape[0])
                dest[f"{p}{name}.bias"] = whole(linear.bias)
            for name, (weight, bias) in (("attention.output.LayerNorm", layer.attn_norm),
                                         ("output.LayerNorm", layer.mlp_norm)):
                dest[f"{p}{name}.weight"] = whole(weight)
                dest[f"{p}{name}.bias"] = whole(bias)
        if self.head is not None:
            inner, outer = (("pooler.dense", "classifier") if self.config.classifier_kind == "bert_pooler"
                            else ("classifier.dense", "classifier.out_proj"))
            for name, t in zip([f"{inner}.weight", f"{inner}.bias", f"{outer}.weight", f"{outer}.bias"], self.head):
                dest[name] = whole(t)
        return dest

    def _nomic_destinations(self) -> dict[str, tuple[torch.Tensor | Linear, int, int]]:
        """Nomic BERT's names, as its Hub checkpoints (and transformers' save_pretrained) write them:
        q, k and v fused in Wqkv; fc11 the MLP's up, fc12 its gate."""
        whole = lambda t: (t, 0, t.shape[0])  # noqa: E731
        dest: dict[str, tuple[torch.Tensor | Linear, int, int]] = {
            "embeddings.word_embeddings.weight": whole(self.word_embeddings),
            "embeddings.token_type_embeddings.weight": whole(self.token_type_embeddings),
            "emb_ln.weight": whole(self.embedding_norm[0]),
            "emb_ln.bias": whole(self.embedding_norm[1]),
        }
        i = self.config.intermediate_size
        for n, layer in enumerate(self.layers):
            p = f"encoder.layers.{n}."
            parts = {"attn.Wqkv": (layer.qkv, 0), "attn.out_proj": (layer.attn_out, 0), "mlp.fc12": (layer.mlp_in, 0),
                     "mlp.fc11": (layer.mlp_in, i), "mlp.fc2": (layer.mlp_out, 0)}
            for name, (linear, offset) in parts.items():
                rows = i if name in ("mlp.fc11", "mlp.fc12") else linear.shape[0]
                dest[f"{p}{name}.weight"] = (linear, offset, rows)
                if linear.bias is not None:
                    dest[f"{p}{name}.bias"] = (linear.bias, offset, rows)
            for name, (weight, bias) in (("norm1", layer.attn_norm), ("norm2", layer.mlp_norm)):
                dest[f"{p}{name}.weight"] = whole(weight)
                dest[f"{p}{name}.bias"] = whole(bias)
        return dest

    @staticmethod
    def _encoder_name(name: str) -> str:
        """A checkpoint's tensor name as _destinations names it: a task model's prefix (bert., roberta.)
        dropped, and the LayerNorm's gamma / beta of older files read as weight / bias."""
        for prefix in _ENCODER_PREFIXES:
            if name.startswith(prefix):
                name = name[len(prefix):]
                break
        if "LayerNorm." in name:
            name = name.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias")
        return name

    def _unread(self, name: str) -> bool:
        """An embedding model's pooler, masked-LM heads and the position-id buffer."""
        return (name.startswith(_UNREAD_PREFIXES) or name in _UNREAD_NAMES
                or (self.head is None and name.startswith("pooler.")))

    def _plain_tensors(self) -> list[torch.Tensor | None]:
        tensors = [self.word_embeddings, self.position_embeddings, self.token_type_embeddings, *self.embedding_norm,
                   *(self.head or ())]
        for layer in self.layers:
            tensors += [*layer.attn_norm, *layer.mlp_norm]
        return tensors

    # ------------------------------------------------------------------ forward
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionMetadata,
                token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        """input_ids, positions: int32 [num_tokens], each input's tokens whole and in order (positions 0
        .. n-1), where attn.query_start_loc puts them; token_type_ids: int32 [num_tokens] (None: all 0)
        -> the final hidden states [num_tokens, hidden]."""
        c = self.config
        types = torch.zeros_like(input_ids) if token_type_ids is None else token_type_ids
        # transformers' order of the two sums (each rounded to the dtype), then the norm
        h = F.embedding(input_ids, self.word_embeddings) + F.embedding(types, self.token_type_embeddings)
        if self.position_embeddings is not None:
            h = h + F.embedding(positions + c.position_offset, self.position_embeddings)
        h = F.layer_norm(h, (c.hidden_size,), *self.embedding_norm, c.layer_norm_eps)
        attention = EncoderAttention(attn.query_start_loc.tolist(), c.num_attention_heads, c.head_dim, h.dtype,
                                     h.device)
        for layer in self.layers:
            h = layer.forward(h, attention, positions, self.rotary_cos_sin)
        return h

    def classify(self, row: torch.Tensor) -> torch.Tensor:
        """The first token's final row (fp32 [hidden]) -> label logits, fp32 [num_labels]."""
        if self.head is None:
            raise ValueError("classify needs a sequence-classification model")
        inner_w, inner_b, outer_w, outer_b = (t.float().to(row.device) for t in self.head)
        return F.linear(torch.tanh(F.linear(row, inner_w, inner_b)), outer_w, outer_b)
