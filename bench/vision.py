"""Image inputs: the vision encoder's images/s and the time to first token of a request with one
image, at 336 x 336 and 448 x 448, for corellm and for HF transformers on the same random weights
in the same run (bf16). The tower and projector have LLaVA-1.5-7B's shapes (CLIP ViT-L/14:
24 layers of 1024, 577 or 1025 positions; a projector into 4096); the decoder has Llama-2-7B's
width but only --decoder-layers layers (the full 7B does not fit this benchmark's budget), so
TTFT here is the encoder plus a short decoder's prefill.

    .venv/bin/python bench/vision.py [--sizes 336 448] [--decoder-layers 2] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

TOWER = dict(hidden_size=1024, intermediate_size=4096, num_hidden_layers=24, num_attention_heads=16, patch_size=14)
DECODER = dict(vocab_size=32064, hidden_size=4096, intermediate_size=11008, num_attention_heads=32,
               num_key_value_heads=32, max_position_embeddings=4096, rms_norm_eps=1e-5)
IMAGE_TOKEN = 32000


def make_random_llava(directory: Path, image_size: int, decoder_layers: int, seed: int = 0) -> Path:
    """A LLaVA-1.5-shaped HF directory with random bf16 weights (llava-hf's tensor names)."""
    from safetensors.torch import save_file
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

    g = torch.Generator().manual_seed(seed)
    rand = lambda *shape: (torch.randn(*shape, generator=g) * 0.02).bfloat16()  # noqa: E731
    ones = lambda n: torch.ones(n, dtype=torch.bfloat16)  # noqa: E731
    zeros = lambda n: torch.zeros(n, dtype=torch.bfloat16)  # noqa: E731
    v, t = TOWER["hidden_size"], DECODER["hidden_size"]
    positions = (image_size // TOWER["patch_size"]) ** 2 + 1
    w = {"vision_tower.vision_model.embeddings.class_embedding": rand(v),
         "vision_tower.vision_model.embeddings.patch_embedding.weight": rand(v, 3, 14, 14),
         "vision_tower.vision_model.embeddings.position_embedding.weight": rand(positions, v),
         "vision_tower.vision_model.pre_layrnorm.weight": ones(v), "vision_tower.vision_model.pre_layrnorm.bias": zeros(v),
         "vision_tower.vision_model.post_layernorm.weight": ones(v),
         "vision_tower.vision_model.post_layernorm.bias": zeros(v),
         "multi_modal_projector.linear_1.weight": rand(t, v), "multi_modal_projector.linear_1.bias": zeros(t),
         "multi_modal_projector.linear_2.weight": rand(t, t), "multi_modal_projector.linear_2.bias": zeros(t),
         "language_model.model.embed_tokens.weight": rand(DECODER["vocab_size"], t),
         "language_model.model.norm.weight": ones(t), "language_model.lm_head.weight": rand(DECODER["vocab_size"], t)}
    for i in range(TOWER["num_hidden_layers"]):
        p = f"vision_tower.vision_model.encoder.layers.{i}."
        for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
            w[p + f"self_attn.{proj}.weight"], w[p + f"self_attn.{proj}.bias"] = rand(v, v), zeros(v)
        for norm in ("layer_norm1", "layer_norm2"):
            w[p + norm + ".weight"], w[p + norm + ".bias"] = ones(v), zeros(v)
        w[p + "mlp.fc1.weight"], w[p + "mlp.fc1.bias"] = rand(4 * v, v), zeros(4 * v)
        w[p + "mlp.fc2.weight"], w[p + "mlp.fc2.bias"] = rand(v, 4 * v), zeros(v)
    inter = DECODER["intermediate_size"]
    for i in range(decoder_layers):
        p = f"language_model.model.layers.{i}."
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            w[p + f"self_attn.{proj}.weight"] = rand(t, t)
        w[p + "mlp.gate_proj.weight"], w[p + "mlp.up_proj.weight"] = rand(inter, t), rand(inter, t)
        w[p + "mlp.down_proj.weight"] = rand(t, inter)
        w[p + "input_layernorm.weight"], w[p + "post_attention_layernorm.weight"] = ones(t), ones(t)
    directory.mkdir(parents=True, exist_ok=True)
    save_file(w, str(directory / "model.safetensors"))
    config = {"architectures": ["LlavaForConditionalGeneration"], "model_type": "llava", "image_token_index": IMAGE_TOKEN,
              "vision_feature_layer": -2, "vision_feature_select_strategy": "default", "projector_hidden_act": "gelu",
              "torch_dtype": "bfloat16", "image_seq_length": positions - 1,
              "vision_config": {"model_type": "clip_vision_model", "image_size": image_size, "hidden_act": "quick_gelu",
                                "projection_dim": 768, **TOWER},
              "text_config": {"model_type": "llama", "num_hidden_layers": decoder_layers, **DECODER}}
    (directory / "config.json").write_text(json.dumps(config, indent=1))
    (directory / "preprocessor_config.json").write_text(json.dumps(
        {"size": {"shortest_edge": image_size}, "crop_size": {"height": image_size, "width": image_size},
         "do_center_crop": True, "resample": 3, "image_processor_type": "CLIPImageProcessor"}))
    vocab = {f"t{i}": i for i in range(IMAGE_TOKEN)} | {"<image>": IMAGE_TOKEN}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens([AddedToken("<image>", special=True)])
    tok.save(str(directory / "tokenizer.json"))
    return directory


def timed(fn, repeats: int) -> float:
    """The median of `repeats` timings, after one warm-up call."""
    fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def run_size(image_size: int, decoder_layers: int, repeats: int, workdir: Path) -> dict:
    from PIL import Image

    from corellm import LLM, SamplingParams

    directory = make_random_llava(workdir / f"llava-{image_size}", image_size, decoder_layers)
    image = Image.fromarray(torch.randint(0, 256, (image_size + 64, image_size + 32, 3), dtype=torch.uint8).numpy())
    llm = LLM(str(directory), dtype="bfloat16", max_model_len=2048, kv_cache_memory=256 * 1024**2,
              enable_prefix_caching=False)
    model = llm.loaded.model
    pixels = torch.from_numpy(llm.loaded.image_processor(image))[None]
    prompt = {"prompt_token_ids": list(range(100, 130)) + [IMAGE_TOKEN] + list(range(200, 220)),
              "multi_modal_data": {"image": image}}
    one = SamplingParams(temperature=0, max_tokens=1)
    with torch.inference_mode():
        ours_encoder = timed(lambda: model.encode_images(pixels), repeats)
    ours_ttft = timed(lambda: llm.generate(prompt, one, use_tqdm=False), repeats)
    llm.shutdown()
    del llm, model
    row = {"image_size": image_size, "positions": (image_size // 14) ** 2 + 1, "corellm_encoder_s": ours_encoder,
           "corellm_ttft_s": ours_ttft}
    from hf_transformers import import_transformers

    try:
        transformers = import_transformers()
    except ImportError:
        return row
    hf = transformers.LlavaForConditionalGeneration.from_pretrained(str(directory), dtype=torch.bfloat16).eval()
    ids = torch.tensor([list(range(100, 130)) + [IMAGE_TOKEN] * (row["positions"] - 1) + list(range(200, 220))])
    with torch.inference_mode():
        row["hf_encoder_s"] = timed(lambda: hf.model.get_image_features(pixel_values=pixels.bfloat16()), repeats)
        row["hf_ttft_s"] = timed(lambda: hf(input_ids=ids, pixel_values=pixels.bfloat16()).logits[0, -1].argmax(),
                                 repeats)
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", type=int, nargs="+", default=[336, 448])
    p.add_argument("--decoder-layers", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--json", help="write the rows here")
    args = p.parse_args()
    from corellm.native import cpu_kernel_path

    print(f"CPU kernels: {cpu_kernel_path()}, {torch.get_num_threads()} threads; bf16; decoder: Llama-2-7B width, "
          f"{args.decoder_layers} layers")
    with tempfile.TemporaryDirectory() as tmp:
        rows = [run_size(size, args.decoder_layers, args.repeats, Path(tmp)) for size in args.sizes]
    print(f"\n{'image':>9} {'positions':>9} {'encoder img/s corellm':>22} {'HF':>7} {'ratio':>6} "
          f"{'TTFT ms corellm':>16} {'HF':>7} {'ratio':>6}")
    for r in rows:
        ours_enc, ours_ttft = r["corellm_encoder_s"], r["corellm_ttft_s"]
        hf_enc, hf_ttft = r.get("hf_encoder_s"), r.get("hf_ttft_s")
        hf_rate = "-" if hf_enc is None else f"{1 / hf_enc:.2f}"
        enc_ratio = "-" if hf_enc is None else f"{hf_enc / ours_enc:.2f}x"
        hf_ms = "-" if hf_ttft is None else f"{1000 * hf_ttft:.0f}"
        ttft_ratio = "-" if hf_ttft is None else f"{hf_ttft / ours_ttft:.2f}x"
        size = f"{r['image_size']}x{r['image_size']}"
        print(f"{size:>9} {r['positions']:>9} {1 / ours_enc:>22.2f} {hf_rate:>7} {enc_ratio:>6} "
              f"{1000 * ours_ttft:>16.0f} {hf_ms:>7} {ttft_ratio:>6}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
