"""Tiny random LLaVA models (a CLIP or SigLIP tower, a projector, a Llama / Qwen2 / Mistral
decoder) saved as HF directories with a word-level tokenizer whose "<image>" is the image token,
and the image processor's config; random test images."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

VOCAB = 384
IMAGE_TOKEN = VOCAB - 1  # "<image>"
TEXT = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-5)
TOWERS = {
    # 32 x 32 images in patches of 8: 16 patches (+ CLIP's class token, dropped by "default").
    "clip": ("CLIPVisionConfig", dict(hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
                                      image_size=32, patch_size=8, projection_dim=16)),
    "siglip": ("SiglipVisionConfig", dict(hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                                          num_attention_heads=4, image_size=32, patch_size=8)),
}
DECODERS = {"llama": "LlamaConfig", "qwen2": "Qwen2Config", "mistral": "MistralConfig"}


def save_tokenizer(directory: Path) -> None:
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

    vocab = {f"w{i}": i for i in range(VOCAB - 1)} | {"<image>": IMAGE_TOKEN}
    t = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    t.pre_tokenizer = pre_tokenizers.Whitespace()
    t.add_special_tokens([AddedToken("<image>", special=True)])
    t.save(str(directory / "tokenizer.json"))


def make_tiny_llava(directory: Path, tower: str = "clip", decoder: str = "llama", seed: int = 0,
                    strategy: str | None = None, feature_layer: int | None = None):
    """Creates, saves and returns the HF LlavaForConditionalGeneration (float32, eval)."""
    import transformers

    vision_cls, vision_kw = TOWERS[tower]
    text_kw = dict(TEXT)
    if decoder == "mistral":
        text_kw["sliding_window"] = None
    config = transformers.LlavaConfig(
        vision_config=getattr(transformers, vision_cls)(**vision_kw),
        text_config=getattr(transformers, DECODERS[decoder])(**text_kw), image_token_index=IMAGE_TOKEN,
        vision_feature_select_strategy=strategy or ("default" if tower == "clip" else "full"),
        vision_feature_layer=feature_layer if feature_layer is not None else (-2 if tower == "clip" else -1),
        image_seq_length=16)
    torch.manual_seed(seed)
    model = transformers.LlavaForConditionalGeneration(config).float().eval()
    with torch.no_grad():  # random biases and norm weights, so that they matter in the comparison
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.normal_(1.0 if "norm" in name and name.endswith("weight") else 0.0, 0.2)
            elif "embedding" in name and "vision" in name:
                p.normal_(0.0, 0.5)
    model.save_pretrained(directory, safe_serialization=True)
    save_tokenizer(directory)
    processor = image_processor(tower)
    processor.save_pretrained(directory)
    return model


def image_processor(tower: str):
    """transformers' image processor of the tower's kind at the tiny image size."""
    import transformers

    if tower == "clip":
        return transformers.CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    return transformers.SiglipImageProcessor(size={"height": 32, "width": 32})


def random_image(seed: int, size: tuple[int, int] = (48, 40), mode: str = "RGB"):
    from PIL import Image

    rng = np.random.default_rng(seed)
    channels = {"RGB": 3, "RGBA": 4, "L": 1}[mode]
    pixels = rng.integers(0, 256, (size[1], size[0], channels), dtype=np.uint8)
    return Image.fromarray(pixels[:, :, 0] if channels == 1 else pixels, mode)
