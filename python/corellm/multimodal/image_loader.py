"""Decodes a user's image — a PIL image, a uint8 pixel array, encoded bytes, a base64 data URL, or (where the server
allows its domain) an http(s) URL — within limits on size and pixels, with a ValueError naming the
part for anything that is not a decodable image of acceptable size (the server's 400)."""

from __future__ import annotations

import base64
import binascii
import io
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field


@dataclass(frozen=True)
class ImageLimits:
    max_bytes: int = 20 * 1024 * 1024  # encoded size of one image
    max_pixels: int = 40_000_000  # width x height: past this a file is a decompression bomb
    allowed_media_domains: tuple[str, ...] = field(default_factory=tuple)  # hosts remote URLs may name
    fetch_timeout: float = 10.0  # seconds for one remote image, the whole transfer


def load_image(item: object, what: str, limits: ImageLimits):
    """`item` -> an RGB-ready PIL image (loaded, its size checked). `what` names the part in errors
    ("image 2", "messages[0].content[1]")."""
    from PIL import Image

    if isinstance(item, Image.Image):
        _check_pixels(item.width, item.height, what, limits)
        return item
    if type(item).__module__ == "numpy" and hasattr(item, "ndim"):  # an array of pixels, H x W (x C), uint8
        if item.ndim not in (2, 3) or str(item.dtype) != "uint8":
            raise ValueError(f"{what}: an image array must be uint8 of shape (H, W) or (H, W, C), got "
                             f"{item.dtype} {tuple(item.shape)}")
        _check_pixels(item.shape[1], item.shape[0], what, limits)
        try:
            return Image.fromarray(item)
        except (TypeError, ValueError) as e:
            raise ValueError(f"{what}: not an image array ({e})") from None
    if isinstance(item, (bytes, bytearray, memoryview)):
        return decode_image(bytes(item), what, limits)
    if isinstance(item, str):
        if item.startswith("data:"):
            return decode_image(_data_url_bytes(item, what, limits), what, limits)
        if item.startswith(("http://", "https://")):
            return decode_image(_fetch(item, what, limits), what, limits)
        raise ValueError(f"{what}: an image must be a data URL (data:image/...;base64,...) or an http(s) URL, "
                         f"got {item[:40]!r}")
    raise ValueError(f"{what}: an image must be a PIL image, a uint8 array, bytes or a URL, got {type(item).__name__}")


def decode_image(data: bytes, what: str, limits: ImageLimits):
    from PIL import Image

    if len(data) > limits.max_bytes:
        raise ValueError(f"{what}: the image is {len(data)} bytes, over the {limits.max_bytes}-byte limit")
    try:
        image = Image.open(io.BytesIO(data))  # reads the header only
        _check_pixels(image.width, image.height, what, limits)
        image.load()
    except ValueError:
        raise
    except Exception as e:  # noqa: BLE001 - Pillow raises many types (OSError, SyntaxError, DecompressionBombError)
        raise ValueError(f"{what}: not a decodable image ({type(e).__name__}: {e})") from None
    return image


def _check_pixels(width: int, height: int, what: str, limits: ImageLimits) -> None:
    if width <= 0 or height <= 0:
        raise ValueError(f"{what}: the image has no pixels ({width}x{height})")
    if width * height > limits.max_pixels:
        raise ValueError(f"{what}: the image is {width}x{height} = {width * height} pixels, over the "
                         f"{limits.max_pixels}-pixel limit")


def _data_url_bytes(url: str, what: str, limits: ImageLimits) -> bytes:
    header, sep, payload = url.partition(",")
    if not sep or not header.startswith("data:image/") or not header.endswith(";base64"):
        raise ValueError(f"{what}: a data URL must read data:image/<type>;base64,<data>")
    if len(payload) > limits.max_bytes * 4 // 3 + 4:
        raise ValueError(f"{what}: the image is over the {limits.max_bytes}-byte limit")
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"{what}: the data URL's payload is not valid base64") from None


def _fetch(url: str, what: str, limits: ImageLimits) -> bytes:
    host = urllib.parse.urlparse(url).hostname or ""
    if host not in limits.allowed_media_domains:
        allowed = ", ".join(limits.allowed_media_domains) or "none"
        raise ValueError(f"{what}: remote image URLs are allowed only from the server's --allowed-media-domains "
                         f"({allowed}); {host!r} is not one (send the image as a data URL)")
    opener = urllib.request.build_opener(_RefuseRedirects)  # a redirect could lead off the allowed hosts
    deadline = time.monotonic() + limits.fetch_timeout  # for the whole fetch, not each read
    chunks, size = [], 0
    try:
        with opener.open(url, timeout=limits.fetch_timeout) as response:
            while size <= limits.max_bytes:
                if time.monotonic() > deadline:
                    raise ValueError(f"{what}: fetching {url} took more than {limits.fetch_timeout:g} s")
                chunk = response.read(min(65536, limits.max_bytes + 1 - size))
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
    except OSError as e:
        raise ValueError(f"{what}: could not fetch {url} ({e})") from None
    data = b"".join(chunks)
    if len(data) > limits.max_bytes:
        raise ValueError(f"{what}: the image at {url} is over the {limits.max_bytes}-byte limit")
    return data


class _RefuseRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):  # noqa: ANN002, ANN003 - urllib's signature
        return None  # urllib then raises the 3xx as an HTTPError
