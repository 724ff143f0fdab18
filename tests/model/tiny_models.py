"""Tiny random HF models of each supported architecture, saved as safetensors directories."""

from __future__ import annotations

from pathlib import Path

import torch

TINY = dict(vocab_size=384, hidden_size=64, intermediate_size=160, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-5)

PHI3_SHORT_FACTORS = [1.0, 1.1, 1.3, 1.6, 2.0, 2.5]  # one per rotary frequency
PHI3_LONG_FACTORS = [1.0, 1.5, 2.5, 4.0, 6.0, 9.0]

ARCHS = {
    "llama3": ("LlamaConfig", "LlamaForCausalLM",
               dict(rope_theta=50000.0, tie_word_embeddings=False,
                    rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                  "high_freq_factor": 4.0, "original_max_position_embeddings": 64})),
    "llama_tied": ("LlamaConfig", "LlamaForCausalLM", dict(tie_word_embeddings=True, num_key_value_heads=4)),
    # SmolLM3: a Llama whose every n-th layer turns no rotary embedding (NoPE; here the middle one)
    "smollm3": ("SmolLM3Config", "SmolLM3ForCausalLM",
                dict(no_rope_layers=[1, 0, 1], rope_theta=50000.0, tie_word_embeddings=True, pad_token_id=0)),
    # ERNIE 4.5: a Llama whose rotary turns each head's pairs (2i, 2i + 1) (GPT-J's), not its halves
    "ernie4_5": ("Ernie4_5Config", "Ernie4_5ForCausalLM",
                 dict(head_dim=16, rope_theta=500000.0, tie_word_embeddings=True, use_bias=False, pad_token_id=0)),
    # GLM (glm-edge, GLM-4-9B-chat-hf) and GLM-4 (GLM-4-0414): q/k/v biases, gate and up fused in the
    # checkpoint, rotary on the first half of each head's dims, in interleaved pairs; GLM-4 adds norms
    # on the attention's and the MLP's outputs
    "glm": ("GlmConfig", "GlmForCausalLM", dict(head_dim=16, tie_word_embeddings=False, pad_token_id=0)),
    "glm4": ("Glm4Config", "Glm4ForCausalLM", dict(head_dim=16, tie_word_embeddings=False, pad_token_id=0)),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(sliding_window=None, tie_word_embeddings=False)),
    "mistral_window": ("MistralConfig", "MistralForCausalLM", dict(sliding_window=16, tie_word_embeddings=False)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(tie_word_embeddings=True, rope_theta=1e6)),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(tie_word_embeddings=False, head_dim=32)),
    # Gemma 3: sliding-window layers (window 16, rope base 10k) around a global one (rope 1M),
    # attention scaled by query_pre_attn_scalar, GeGLU, sandwich norms, scaled embeddings.
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM",
               dict(head_dim=16, sliding_window=16, query_pre_attn_scalar=24, tie_word_embeddings=True,
                    layer_types=["sliding_attention", "full_attention", "sliding_attention"])),
    # Gemma 2: Gemma 3's layers without q/k norms, sliding and global layers alternating, one rope
    # base; its attention scores and logits soft-capped, with caps small enough to change this
    # random model's small scores and logits (each cap alone moves the logits by 0.03-0.16, see
    # test_gemma2.py). transformers applies the attention's cap in its eager attention only.
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM",
               dict(head_dim=16, sliding_window=16, query_pre_attn_scalar=4, attn_logit_softcapping=0.5,
                    final_logit_softcapping=1.0, tie_word_embeddings=True, attn_implementation="eager")),
    # Mixtures of experts: four experts, two per token. Mixtral renormalizes the pair's weights;
    # this Qwen3-MoE does not (norm_topk_prob False), and its middle layer is dense (mlp_only_layers).
    "mixtral": ("MixtralConfig", "MixtralForCausalLM",
                dict(num_local_experts=4, num_experts_per_tok=2, intermediate_size=64, tie_word_embeddings=False)),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM",
                  dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64, norm_topk_prob=False,
                       mlp_only_layers=[1], head_dim=16, tie_word_embeddings=False)),
    # Qwen2-MoE: q/k/v biases, and a shared expert every token runs beside its two, gated by a sigmoid.
    "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM",
                  dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64,
                       shared_expert_intermediate_size=96, norm_topk_prob=False, tie_word_embeddings=False)),
    # ERNIE 4.5's mixture of experts: its first layer dense, four experts two per token chosen by p plus a
    # learned bias per expert (drawn here, as the biases are: it changes choices), one ungated shared expert
    "ernie4_5_moe": ("Ernie4_5_MoeConfig", "Ernie4_5_MoeForCausalLM",
                     dict(head_dim=16, rope_theta=500000.0, tie_word_embeddings=True, use_bias=False, pad_token_id=0,
                          moe_num_experts=4, moe_k=2, moe_intermediate_size=64, moe_num_shared_experts=1,
                          moe_layer_start_index=1, moe_layer_interval=1)),
    # OLMo 2: no norm on a layer's input nor before its MLP, RMSNorm on the attention's and the MLP's
    # outputs before each joins the stream, q and k normed over each token's whole rows
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", dict(tie_word_embeddings=False, pad_token_id=0)),
    # Olmo 3: OLMo 2's layers, the first and last with a sliding window (16 tokens) beside a global one
    "olmo3": ("Olmo3Config", "Olmo3ForCausalLM",
              dict(tie_word_embeddings=False, pad_token_id=0, sliding_window=16,
                   layer_types=["sliding_attention", "full_attention", "sliding_attention"])),
    # OLMoE: RMSNorm over each token's whole q and k (not per head), eight experts, two per token.
    "olmoe": ("OlmoeConfig", "OlmoeForCausalLM",
              dict(num_experts=8, num_experts_per_tok=2, intermediate_size=64, tie_word_embeddings=False)),
    # Phi-3: q/k/v and gate/up fused in the checkpoint, LongRoPE (its short factors: the context
    # stays within the pretrained length here), rotary on 12 of each head's 16 dimensions (Phi-4-mini's 0.75).
    "phi3": ("Phi3Config", "Phi3ForCausalLM",
             dict(partial_rotary_factor=0.75, original_max_position_embeddings=512, tie_word_embeddings=False,
                  pad_token_id=0, bos_token_id=1, eos_token_id=2,
                  rope_scaling={"rope_type": "longrope", "short_factor": PHI3_SHORT_FACTORS,
                                "long_factor": PHI3_LONG_FACTORS})),
    # Granite: the embedding, each layer's attention and MLP outputs and the logits scaled, the
    # attention scale its own (values bf16 holds exactly, as Granite's releases' are)
    "granite": ("GraniteConfig", "GraniteForCausalLM",
                dict(embedding_multiplier=3.0, residual_multiplier=0.375, attention_multiplier=0.1875,
                     logits_scaling=2.5, tie_word_embeddings=True, pad_token_id=0)),
    # Granite-MoE: Granite's multipliers; four experts, two per token, stacked in 3-D tensors
    "granitemoe": ("GraniteMoeConfig", "GraniteMoeForCausalLM",
                   dict(num_local_experts=4, num_experts_per_tok=2, intermediate_size=64, embedding_multiplier=3.0,
                        residual_multiplier=0.375, attention_multiplier=0.1875, logits_scaling=2.5,
                        tie_word_embeddings=True, pad_token_id=0)),
    # gpt-oss: sliding-window (16) and global layers alternating, biases on q/k/v/o, a sink per head
    # (drawn with sd 1: large enough to move the attention), YaRN (pretrained at 128 positions, x4,
    # truncate false), four experts two per token with biases on the router and the experts, the
    # clamped SwiGLU with a limit low enough (0.25) that this random model's gates and ups reach it
    "gpt_oss": ("GptOssConfig", "GptOssForCausalLM",
                dict(num_local_experts=4, num_experts_per_tok=2, intermediate_size=64, head_dim=16, sliding_window=16,
                     layer_types=["sliding_attention", "full_attention", "sliding_attention"], swiglu_limit=0.25,
                     tie_word_embeddings=False, pad_token_id=0, attn_implementation="eager",
                     rope_parameters={"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                      "truncate": False, "original_max_position_embeddings": 128,
                                      "rope_theta": 150000.0})),
}


def make_tiny_model(arch: str, directory: Path, tokenizer_json: Path | None = None, seed: int = 0, **overrides):
    """Creates, saves (safetensors) and returns the HF model (float32, eval mode); `overrides`
    replace config fields (head_dim=72, ...)."""
    return _save_tiny(arch, directory, tokenizer_json, seed, None, overrides)


def make_tiny_classifier(arch: str, directory: Path, tokenizer_json: Path | None = None, seed: int = 0,
                         labels: tuple[str, ...] = ("negative", "neutral", "positive"), **overrides):
    """make_tiny_model's decoder as transformers' sequence classifier (Llama -> LlamaForSequenceClassification,
    Gemma 3 -> Gemma3TextForSequenceClassification), its score head over `labels`; saved and returned."""
    return _save_tiny(arch, directory, tokenizer_json, seed, labels, overrides)


def _save_tiny(arch: str, directory: Path, tokenizer_json: Path | None, seed: int, labels: tuple[str, ...] | None,
               overrides: dict):
    """The tiny model of `arch` (a classifier over `labels` unless None) with random weights: biases and
    norm weights drawn too, so that they matter in the comparison, and a classifier's score head
    wide enough (logits of a few units) that its probabilities differ."""
    import transformers

    config_cls, model_cls, extra = ARCHS[arch]
    fields = {**TINY, **extra, **overrides}
    if labels is not None:
        fields.update(num_labels=len(labels), id2label=dict(enumerate(labels)),
                      label2id={name: i for i, name in enumerate(labels)})
        model_cls = model_cls.replace("ForCausalLM", "ForSequenceClassification").replace("Gemma3For", "Gemma3TextFor")
    config = getattr(transformers, config_cls)(**fields)
    torch.manual_seed(seed)
    model = getattr(transformers, model_cls)(config).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.normal_(1.0 if "norm" in name else 0.0, 0.2)
            elif name.endswith("sinks"):
                p.normal_(0.0, 1.0)
            elif name == "score.weight":
                p.normal_(0.0, 0.5)
    model.save_pretrained(directory, safe_serialization=True)
    if tokenizer_json is not None:
        (directory / "tokenizer.json").write_bytes(tokenizer_json.read_bytes())
    return model
