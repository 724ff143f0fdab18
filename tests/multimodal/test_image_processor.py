"""corellm's image preprocessing (Pillow + NumPy) against transformers' image processors (their
PIL backend) on images of several sizes and modes: equal to float32 rounding."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("transformers")
pytest.importorskip("PIL")

from corellm.multimodal.image_processor import ImageProcessor  # noqa: E402
from tests.multimodal.tiny_llava import random_image  # noqa: E402


def hf_processor(kind: str):
    import transformers

    if kind == "clip336":  # LLaVA-1.5's: shortest edge 336, bicubic, center crop
        return transformers.CLIPImageProcessor(size={"shortest_edge": 336}, crop_size={"height": 336, "width": 336})
    if kind == "clip_small":
        return transformers.CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    return transformers.SiglipImageProcessor(size={"height": 384, "width": 384})  # bilinear, no crop, mean 0.5


@pytest.mark.parametrize("kind", ["clip336", "clip_small", "siglip"])
@pytest.mark.parametrize("size, mode", [((640, 480), "RGB"), ((300, 500), "RGBA"), ((336, 336), "RGB"),
                                        ((33, 97), "L"), ((20, 12), "RGB")])
def test_equals_transformers(kind, size, mode, tmp_path):
    hf = hf_processor(kind)
    hf.save_pretrained(tmp_path)
    ours = ImageProcessor.from_dir(tmp_path, image_size=336)
    image = random_image(sum(size), size, mode)
    want = hf(images=image, return_tensors="np")["pixel_values"][0]
    got = ours(image)
    assert got.shape == want.shape and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)


def test_defaults_without_a_config(tmp_path):
    p = ImageProcessor.from_dir(tmp_path, image_size=224)
    assert p.shortest_edge == 224 and p.crop == (224, 224)
    assert p(random_image(1, (300, 200))).shape == (3, 224, 224)
