"""LLaVA-style models against transformers (tiny random models built in the test, fp32): the
image features, greedy tokens with one and with two images (equal up to the first position where
the reference's top-2 margin is under 1e-3), and the engine's image path — prefix-cache keys per
image, the encoder cache, batch invariance, and the errors a user gets for bad image input."""

from __future__ import annotations

import io

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("PIL")

from corellm import LLM, SamplingParams  # noqa: E402
from corellm.model.loader import load_model  # noqa: E402
from tests.multimodal.tiny_llava import IMAGE_TOKEN, image_processor, make_tiny_llava, random_image  # noqa: E402

TOKENS_PER_IMAGE = 16


@pytest.fixture(scope="module", params=[("clip", "llama"), ("siglip", "qwen2"), ("clip", "mistral")],
                ids=["clip-llama", "siglip-qwen2", "clip-mistral"])
def tiny(request, tmp_path_factory):
    tower, decoder = request.param
    directory = tmp_path_factory.mktemp(f"llava_{tower}")
    hf = make_tiny_llava(directory, tower, decoder, seed=3)
    return directory, hf, tower


def hf_pixels(tower: str, images) -> torch.Tensor:
    return torch.from_numpy(image_processor(tower)(images=images, return_tensors="np")["pixel_values"])


def expand(ids: list[int]) -> list[int]:
    out = []
    for t in ids:
        out += [t] * TOKENS_PER_IMAGE if t == IMAGE_TOKEN else [t]
    return out


def hf_greedy(hf, ids: list[int], pixels: torch.Tensor, steps: int) -> tuple[list[int], list[float]]:
    """Greedy tokens by full recomputation, with each step's top-2 margin."""
    ids = list(ids)
    tokens, margins = [], []
    with torch.no_grad():
        for _ in range(steps):
            logits = hf(input_ids=torch.tensor([ids]), pixel_values=pixels).logits[0, -1]
            top = torch.topk(logits.log_softmax(-1), 2)
            tokens.append(int(top.indices[0]))
            margins.append(float(top.values[0] - top.values[1]))
            ids.append(tokens[-1])
    return tokens, margins


def agree_until_near_tie(got: list[int], want: list[int], margins: list[float], margin: float = 1e-3) -> None:
    n = next((i for i, m in enumerate(margins) if m < margin), len(margins))
    assert got[:n] == want[:n], f"diverged before the first near-tie at {n}: {got} vs {want}"


def engine(path, **kw) -> LLM:
    args = dict(dtype="float32", max_model_len=256, kv_cache_memory=16 * 1024**2, block_size=16)
    args.update(kw)
    return LLM(str(path), **args)


def test_image_features_equal_transformers(tiny):
    path, hf, tower = tiny
    loaded = load_model(str(path), dtype="float32", progress=False)

    images = [random_image(1, (40, 30)), random_image(2, (64, 64))]
    pixels = hf_pixels(tower, images)
    with torch.no_grad():
        want = torch.stack(list(hf.model.get_image_features(pixel_values=pixels).pooler_output))
    got = loaded.model.encode_images(pixels)
    assert got.shape == want.shape == (2, TOKENS_PER_IMAGE, 64)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("num_images", [1, 2])
def test_greedy_tokens_equal_transformers(tiny, num_images):
    path, hf, tower = tiny
    images = [random_image(10 + i, (50 + 7 * i, 41)) for i in range(num_images)]
    prompt = [5, 17, IMAGE_TOKEN, 40, 41] + ([9, IMAGE_TOKEN, 77] if num_images == 2 else []) + [3]
    want, margins = hf_greedy(hf, expand(prompt), hf_pixels(tower, images), steps=12)
    out = engine(path, limit_mm_per_prompt={"image": 2}).generate(
        {"prompt_token_ids": prompt, "multi_modal_data": {"image": images}},
                                SamplingParams(temperature=0, max_tokens=12, ignore_eos=True), use_tqdm=False)[0]
    assert len(out.prompt_token_ids) == len(prompt) + num_images * (TOKENS_PER_IMAGE - 1)
    agree_until_near_tie(list(out.outputs[0].token_ids), want, margins)


def request(prompt, image, **params):
    item = {"prompt_token_ids": prompt}
    if image is not None:
        item["multi_modal_data"] = {"image": image}
    return item, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=1, **params)


def test_two_images_give_different_outputs_and_never_share_blocks(tiny):
    path, _, _ = tiny
    llm = engine(path)
    prompt = list(range(20, 40)) + [IMAGE_TOKEN] + [4, 5, 6]  # 20 text tokens: one full block before the image
    first = llm.generate(*request(prompt, random_image(1)), use_tqdm=False)[0]
    other = llm.generate(*request(prompt, random_image(2)), use_tqdm=False)[0]
    again = llm.generate(*request(prompt, random_image(1)), use_tqdm=False)[0]
    lp = lambda o: [next(iter(p.values())).logprob for p in o.outputs[0].logprobs]  # noqa: E731
    assert lp(first) != lp(other)
    assert other.num_cached_tokens == 16  # the text block only: the image's blocks are keyed by its hash
    assert again.num_cached_tokens == 32  # the same image: its full blocks too (not the last token's)
    assert again.outputs[0].token_ids == first.outputs[0].token_ids


def test_a_batch_of_image_and_text_requests_equals_the_solo_runs(tiny):
    """bf16, corellm's batch-invariant path: tokens and logprobs bit-identical, chunked or not."""
    path, _, _ = tiny
    prompts = [request([1, 2, IMAGE_TOKEN, 3], random_image(5)), request([7, 8, 9, 10, 11], None),
               request([IMAGE_TOKEN, 6, IMAGE_TOKEN], [random_image(6), random_image(7, (30, 70))]),
               request(list(range(30, 60)) + [IMAGE_TOKEN], random_image(8))]
    common = dict(dtype="bfloat16", enable_prefix_caching=False, limit_mm_per_prompt={"image": 2})
    solo = [engine(path, **common).generate(*p, use_tqdm=False)[0] for p in prompts]
    llm = engine(path, **common, max_num_batched_tokens=24)
    batch = llm.generate([p[0] for p in prompts], [p[1] for p in prompts], use_tqdm=False)  # chunked: 24 a step
    for s, b in zip(solo, batch):
        assert s.outputs[0].token_ids == b.outputs[0].token_ids
        assert [p for p in s.outputs[0].logprobs] == [p for p in b.outputs[0].logprobs]


def test_the_encoder_cache_serves_an_image_to_every_request_that_carries_it(tiny):
    """Two requests with the same image in one step: one encoding. A later one (no prefix cache)
    finds the output still held: no encoding either. The outputs equal a fresh engine's."""
    path, _, _ = tiny
    llm = engine(path, enable_prefix_caching=False)
    image = random_image(11)
    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    prompts = [request([1, IMAGE_TOKEN, 2], image)[0], request([3, IMAGE_TOKEN, 4], image.copy())[0]]
    outs = llm.generate(prompts, params, use_tqdm=False)
    cache = llm.engine_core.model_runner.encoder_cache
    assert cache.images_encoded == 1
    later = llm.generate(request([5, IMAGE_TOKEN], image)[0], params, use_tqdm=False)[0]
    assert cache.images_encoded == 1 and len(cache) == 1
    fresh = engine(path, enable_prefix_caching=False)
    for got, prompt in zip([*outs, later], [*prompts, request([5, IMAGE_TOKEN], image)[0]]):
        assert got.outputs[0].token_ids == fresh.generate(prompt, params, use_tqdm=False)[0].outputs[0].token_ids


def png_bytes(image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def test_bad_image_input_is_refused_by_name(tiny):
    from PIL import Image

    path, _, _ = tiny
    llm = engine(path)
    params = SamplingParams(max_tokens=2)
    cases = [
        ({"prompt_token_ids": [1, IMAGE_TOKEN], "multi_modal_data": {"image": [random_image(1)] * 2}},
         "at most 1 image"),
        ({"prompt_token_ids": [1, 2], "multi_modal_data": {"image": random_image(1)}},
         "0 image placeholder tokens .* for 1 image"),
        ({"prompt_token_ids": [1, IMAGE_TOKEN]}, "1 image placeholder token .* for 0 images"),
        ({"prompt_token_ids": [1, IMAGE_TOKEN], "multi_modal_data": {"image": b"not an image"}},
         "image 0: not a decodable image"),
        ({"prompt_token_ids": [1, IMAGE_TOKEN], "multi_modal_data": {"image": png_bytes(Image.new("1", (9000, 9000)))}},
         "image 0: the image is 9000x9000 = 81000000 pixels, over the 40000000-pixel limit"),
        ({"prompt_token_ids": [1, IMAGE_TOKEN], "multi_modal_data": {"image": "https://example.com/cat.png"}},
         "remote image URLs are allowed only from the server's --allowed-media-domains"),
        ({"prompt_token_ids": [1, IMAGE_TOKEN], "multi_modal_data": {"audio": b"..."}}, "multi_modal_data takes"),
    ]
    for prompt, message in cases:
        with pytest.raises(ValueError, match=message):
            llm.generate(prompt, params, use_tqdm=False)
    assert llm.generate({"prompt_token_ids": [1, 2]}, params, use_tqdm=False)[0].outputs[0].token_ids  # still serving


def test_a_text_model_refuses_images():
    llm = LLM(max_model_len=64, kv_cache_memory=16 * 1024**2)
    with pytest.raises(ValueError, match="this model takes no images"):
        llm.generate({"prompt": "hi", "multi_modal_data": {"image": random_image(1)}}, use_tqdm=False)


def test_an_older_checkpoint_with_the_towers_position_ids_buffer_loads(tiny, tmp_path):
    """llava-hf's first checkpoints saved vision_model.embeddings.position_ids and named the tower
    vision_tower.vision_model.*: the buffer is skipped, the names are mapped."""
    import shutil

    from safetensors.torch import load_file, save_file

    path, _, _ = tiny
    for f in path.iterdir():
        shutil.copy(f, tmp_path / f.name)
    tensors = load_file(str(path / "model.safetensors"))
    old = {(f"vision_tower.vision_model.{k[len('vision_tower.'):]}" if k.startswith("vision_tower.") else k): v
           for k, v in tensors.items()}
    positions = old["vision_tower.vision_model.embeddings.position_embedding.weight"].shape[0]
    old["vision_tower.vision_model.embeddings.position_ids"] = torch.arange(positions)[None]
    save_file(old, str(tmp_path / "model.safetensors"))
    image = random_image(4)
    new_model = load_model(str(path), dtype="float32", progress=False).model
    old_model = load_model(str(tmp_path), dtype="float32", progress=False).model
    pixels = hf_pixels(tiny[2], [image])
    torch.testing.assert_close(old_model.encode_images(pixels), new_model.encode_images(pixels), rtol=0, atol=0)


def test_a_lora_adapter_of_the_language_model_equals_transformers_with_it_merged(tiny, tmp_path):
    """A PEFT adapter of the LLaVA model's language model (every projection of its decoder layers),
    named as PEFT names it on transformers v5's LlavaForConditionalGeneration or as it did before
    v5: greedy tokens with an image equal transformers' on the model with the updates merged; an
    adapter of the vision tower is refused by name."""
    import json

    from safetensors.torch import save_file

    from corellm import LoRARequest
    from corellm.lora import load_lora_adapter
    from tests.lora_adapters import ATTENTION, MLP, make_lora_adapter, merged

    path, hf, tower = tiny
    text = json.loads((path / "config.json").read_text())["text_config"]
    updates = make_lora_adapter(tmp_path / "v5", text, rank=8, std=0.2, modules=ATTENTION + MLP, seed=7,
                                decoder="base_model.model.model.language_model")
    make_lora_adapter(tmp_path / "v4", text, rank=8, std=0.2, modules=ATTENTION + MLP, seed=7,
                      decoder="base_model.model.language_model.model")
    config = load_model(str(path), dtype="float32", progress=False).config
    v5, v4 = (load_lora_adapter(n, str(tmp_path / n), config, max_lora_rank=8) for n in ("v5", "v4"))
    for a, b in zip(v5.layers, v4.layers):
        assert a.keys() == b.keys() and all(torch.equal(p.b_t, q.b_t) for k in a for p, q in zip(a[k], b[k]))
    image = random_image(21, (45, 38))
    prompt = [5, 17, IMAGE_TOKEN, 40, 41, 3]
    want, margins = hf_greedy(merged(hf, updates), expand(prompt), hf_pixels(tower, [image]), steps=12)
    base, _ = hf_greedy(hf, expand(prompt), hf_pixels(tower, [image]), steps=12)
    assert want != base  # the adapter changes what the model says
    llm = engine(path, enable_lora=True, max_lora_rank=8)
    outs = llm.generate([{"prompt_token_ids": prompt, "multi_modal_data": {"image": image}}] * 2,
                        SamplingParams(temperature=0, max_tokens=12, ignore_eos=True), use_tqdm=False,
                        lora_request=[LoRARequest("v5", 1, str(tmp_path / "v5")), None])
    agree_until_near_tie(list(outs[0].outputs[0].token_ids), want, margins)
    assert list(outs[1].outputs[0].token_ids) != list(outs[0].outputs[0].token_ids)
    llm.shutdown()
    tower_q = "base_model.model.model.vision_tower.vision_model.encoder.layers.0.self_attn.q_proj"
    (tmp_path / "tower").mkdir()
    (tmp_path / "tower" / "adapter_config.json").write_text((tmp_path / "v5" / "adapter_config.json").read_text())
    save_file({f"{tower_q}.lora_A.weight": torch.zeros(8, 32), f"{tower_q}.lora_B.weight": torch.zeros(32, 8)},
              str(tmp_path / "tower" / "adapter_model.safetensors"))
    with pytest.raises(ValueError, match="updates the image model's vision"):
        load_lora_adapter("tower", str(tmp_path / "tower"), config, max_lora_rank=8)
