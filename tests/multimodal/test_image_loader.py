"""Decoding a user's image within limits: data URLs, bytes, PIL images, remote URLs from allowed
hosts only (fetched from a loopback server here; redirects refused), and the errors that name
the part."""

from __future__ import annotations

import base64
import http.server
import io
import threading
import time

import pytest

pytest.importorskip("PIL")

from corellm.multimodal.image_loader import ImageLimits, load_image  # noqa: E402
from tests.multimodal.tiny_llava import random_image  # noqa: E402


def png(image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.fixture(scope="module")
def image_server():
    """Serves /cat.png (a PNG), /moved (a redirect to it) and /slow (the PNG a byte at a time) on
    127.0.0.1."""
    body = png(random_image(3, (20, 10)))

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            if self.path == "/slow":  # a byte every 0.2 s: each read is quick, the whole is not
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                for byte in body[:20]:
                    self.wfile.write(bytes([byte]))
                    self.wfile.flush()
                    time.sleep(0.2)
            elif self.path == "/cat.png":
                self.send_response(200)
                self.send_header("Content-Type", "image/png")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            else:
                self.send_response(302)
                self.send_header("Location", "/cat.png")
                self.end_headers()

        def log_message(self, *args):  # quiet
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_the_forms_an_image_may_take():
    image = random_image(1, (30, 20))
    limits = ImageLimits()
    assert load_image(image, "x", limits) is image
    assert load_image(png(image), "x", limits).size == (30, 20)
    url = "data:image/png;base64," + base64.b64encode(png(image)).decode()
    assert load_image(url, "x", limits).tobytes() == image.tobytes()
    import numpy as np

    assert load_image(np.asarray(image), "x", limits).tobytes() == image.tobytes()
    with pytest.raises(ValueError, match="x: an image array must be uint8"):
        load_image(np.zeros((4, 4), dtype=np.float32), "x", limits)


def test_limits_and_bad_data_name_the_part():
    image = random_image(1, (30, 20))
    with pytest.raises(ValueError, match=r"part 3: the image is \d+ bytes, over the 100-byte limit"):
        load_image(png(image), "part 3", ImageLimits(max_bytes=100))
    with pytest.raises(ValueError, match="part 3: the image is 30x20 = 600 pixels, over the 500-pixel limit"):
        load_image(png(image), "part 3", ImageLimits(max_pixels=500))
    with pytest.raises(ValueError, match="part 3: a data URL must read data:image/<type>;base64,<data>"):
        load_image("data:text/plain;base64,aGk=", "part 3", ImageLimits())
    with pytest.raises(ValueError, match="part 3: not a decodable image"):
        load_image(png(image)[:40], "part 3", ImageLimits())
    with pytest.raises(ValueError, match="part 3: an image must be a PIL image, a uint8 array, bytes or a URL, got int"):
        load_image(7, "part 3", ImageLimits())


def test_remote_images_only_from_allowed_hosts_and_without_redirects(image_server):
    allowed = ImageLimits(allowed_media_domains=("127.0.0.1",))
    assert load_image(image_server + "/cat.png", "x", allowed).size == (20, 10)
    with pytest.raises(ValueError, match="'127.0.0.1' is not one"):
        load_image(image_server + "/cat.png", "x", ImageLimits(allowed_media_domains=("example.com",)))
    with pytest.raises(ValueError, match="could not fetch"):
        load_image(image_server + "/moved", "x", allowed)
    hurried = ImageLimits(allowed_media_domains=("127.0.0.1",), fetch_timeout=1.0)
    with pytest.raises(ValueError, match=r"took more than 1 s"):
        load_image(image_server + "/slow", "x", hurried)
