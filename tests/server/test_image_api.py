"""Image inputs through the server: chat content parts {"type": "image_url"} with a data URL, sent
by the openai client to a tiny random LLaVA, answer as the offline engine does with the same
image; bad image parts are 400s naming the part; a text model refuses images."""

from __future__ import annotations

import base64
import io
import json

import pytest

pytest.importorskip("transformers")
pytest.importorskip("PIL")

from tests.multimodal.tiny_llava import make_tiny_llava, random_image  # noqa: E402
from tests.server.conftest import Server  # noqa: E402

# LLaVA-1.5's template: images first, then the text, each turn "ROLE: ...".
TEMPLATE = ("{% for message in messages %}{{ message['role'].upper() + ': ' }}"
            "{% for part in message['content'] | selectattr('type', 'equalto', 'image') %}{{ '<image> ' }}{% endfor %}"
            "{% for part in message['content'] | selectattr('type', 'equalto', 'text') %}{{ part['text'] + ' ' }}"
            "{% endfor %}{% endfor %}{% if add_generation_prompt %}{{ 'ASSISTANT:' }}{% endif %}")


def data_url(image) -> str:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


@pytest.fixture(scope="module")
def llava_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("llava_server")
    make_tiny_llava(directory, "clip", "llama", seed=4)
    (directory / "chat_template.json").write_text(json.dumps({"chat_template": TEMPLATE}))
    return directory


@pytest.fixture(scope="module")
def llava_client(llava_dir):
    openai = pytest.importorskip("openai")
    server = Server(str(llava_dir), "--dtype", "float32", "--limit-mm-per-prompt", '{"image": 2}')
    yield openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    server.stop()


def image_message(*parts) -> list[dict]:
    return [{"role": "user", "content": list(parts)}]


def test_chat_with_a_data_url_image_equals_the_offline_engine(llava_client, llava_dir):
    from corellm import LLM, SamplingParams

    image = random_image(21, (60, 45))
    model = llava_client.models.list().data[0].id
    reply = llava_client.chat.completions.create(
        model=model, max_tokens=8, temperature=0,
        messages=image_message({"type": "text", "text": "w5 w6"},
                               {"type": "image_url", "image_url": {"url": data_url(image)}}))
    assert reply.usage.prompt_tokens >= 16  # the image's 16 placeholders count
    llm = LLM(str(llava_dir), dtype="float32", max_model_len=512, kv_cache_memory=16 * 1024**2)
    offline = llm.generate({"prompt": "USER: <image> w5 w6 ASSISTANT:", "multi_modal_data": {"image": image}},
                           SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)[0]
    assert reply.choices[0].message.content == offline.outputs[0].text
    assert reply.usage.prompt_tokens == len(offline.prompt_token_ids)


def test_bad_image_parts_are_400s_naming_the_part(llava_client):
    import openai

    model = llava_client.models.list().data[0].id
    cases = [
        ({"url": "data:image/png;base64,aGVsbG8="}, "messages[0].content[1]: not a decodable image"),
        ({"url": "data:image/png;base64,@@@"}, "messages[0].content[1]: the data URL's payload is not valid base64"),
        ({"url": "https://example.com/cat.png"}, "remote image URLs are allowed only from"),
        ({"url": data_url(random_image(1)), "detail": "high"}, "detail"),
    ]
    for image_url, message in cases:
        with pytest.raises(openai.BadRequestError) as e:
            llava_client.chat.completions.create(
                model=model, max_tokens=2,
                messages=image_message({"type": "text", "text": "w1"}, {"type": "image_url", "image_url": image_url}))
        assert message in str(e.value), str(e.value)
    three = [{"type": "image_url", "image_url": {"url": data_url(random_image(i))}} for i in range(3)]
    with pytest.raises(openai.BadRequestError, match="at most 2 images"):
        llava_client.chat.completions.create(model=model, max_tokens=2, messages=image_message(*three))


def test_a_text_model_refuses_image_parts(client, model_name):
    import openai

    with pytest.raises(openai.BadRequestError, match="this model takes no images"):
        client.chat.completions.create(
            model=model_name, max_tokens=2,
            messages=image_message({"type": "text", "text": "hi"},
                                   {"type": "image_url", "image_url": {"url": data_url(random_image(1))}}))


def test_an_anthropic_image_block_is_the_chats_image_part(llava_client):
    """/v1/messages' image blocks (base64 source) reach the model as chat's image_url parts do."""
    anthropic = pytest.importorskip("anthropic")
    image = random_image(23, (50, 40))
    model = llava_client.models.list().data[0].id
    root = str(llava_client.base_url).rstrip("/").removesuffix("/v1")
    client = anthropic.Anthropic(base_url=root, api_key="unused", max_retries=0, timeout=120)
    encoded = data_url(image).split(",", 1)[1]
    out = client.messages.create(model=model, max_tokens=8, extra_body={"temperature": 0}, messages=[
        {"role": "user", "content": [{"type": "text", "text": "w5 w6"},
                                     {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                                  "data": encoded}}]}])
    want = llava_client.chat.completions.create(model=model, max_tokens=8, temperature=0, messages=image_message(
        {"type": "text", "text": "w5 w6"}, {"type": "image_url", "image_url": {"url": data_url(image)}}))
    assert "".join(b.text for b in out.content if b.type == "text") == want.choices[0].message.content
    assert out.usage.output_tokens == want.usage.completion_tokens
