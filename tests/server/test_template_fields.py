"""Chat request fields that are chat template variables — vLLM's `documents`, OpenAI's
`reasoning_effort`: they reach a template that reads them (a RAG template shows each document;
gpt-oss's states the effort), and for one that does not (SmolLM2's) they are a 400 naming the
field — never dropped while the reply pretends to have used them."""

from __future__ import annotations

import asyncio
import inspect
from types import SimpleNamespace

import openai
import pytest

from corellm.chat_template import render_chat_template
from corellm.model.gguf_file import GGUFModelFile
from corellm.model.loader import default_model_path
from corellm.server.chat import render_prompt
from corellm.server.errors import APIError
from corellm.server.protocol import ChatCompletionRequest
from corellm.tokenizer import CHAT_TEMPLATE_PARAMETERS, Tokenizer

# A RAG template in the style of Granite's: the documents in a system turn before the messages.
RAG_TEMPLATE = ("{% if reasoning_effort %}Effort: {{ reasoning_effort }}\n{% endif %}"
                "{% if documents %}<|im_start|>system\nDocuments:\n{% for d in documents %}[{{ d.title }}] {{ d.text }}\n"
                "{% endfor %}<|im_end|>\n{% endif %}{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
                "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
DOCUMENTS = [{"title": "Bridge", "text": "The bridge opened in 1932."}, {"title": "Tunnel", "text": "Opened in 1965."}]
ASK = [{"role": "user", "content": "When did the bridge open?"}]


@pytest.fixture(scope="module")
def serving():
    tokenizer = GGUFModelFile(default_model_path()).tokenizer()
    config = SimpleNamespace(allow_request_chat_template=False, chat_template=RAG_TEMPLATE, chat_template_timeout_s=2.0)
    return SimpleNamespace(config=config, tokenizer=tokenizer, takes_images=False)


def render(serving, **body) -> str:
    return asyncio.run(render_prompt(serving, ChatCompletionRequest.model_validate(
        {"model": "m", "messages": ASK, **body})))


def test_documents_reach_a_template_that_reads_them(serving):
    text = render(serving, documents=DOCUMENTS)
    assert text.startswith("<|im_start|>system\nDocuments:\n[Bridge] The bridge opened in 1932.\n[Tunnel] Opened in 1965.")
    assert render(serving, chat_template_kwargs={"documents": DOCUMENTS}) == text  # the other way of passing them
    assert render(serving).startswith("<|im_start|>user\n")


def test_reasoning_effort_reaches_a_template_that_reads_it(serving):
    assert render(serving, reasoning_effort="low").startswith("Effort: low\n<|im_start|>user\n")


@pytest.mark.parametrize("field, value", [("documents", DOCUMENTS), ("reasoning_effort", "high")])
def test_a_field_given_twice_is_refused(serving, field, value):
    with pytest.raises(APIError) as err:
        render(serving, **{field: value}, chat_template_kwargs={field: value})
    assert err.value.param == field


@pytest.mark.parametrize("name", sorted(CHAT_TEMPLATE_PARAMETERS | {"tools"}))
def test_chat_template_kwargs_naming_a_parameter_of_the_renderer_is_refused(serving, name):
    """A variable named as one of the renderer's own parameters ("self" came from a fuzzer: a 500)
    is a 400 naming it."""
    with pytest.raises(APIError) as err:
        render(serving, chat_template_kwargs={name: [0.5], "greeting": "hi"})
    assert err.value.param == "chat_template_kwargs" and repr(name) in str(err.value)


def test_the_renderers_parameters_are_all_reserved():
    own = set()
    for function in (Tokenizer.apply_chat_template, render_chat_template):
        own |= {p.name for p in inspect.signature(function).parameters.values() if p.kind != p.VAR_KEYWORD}
    assert own == CHAT_TEMPLATE_PARAMETERS


@pytest.mark.parametrize("field, value", [("documents", DOCUMENTS), ("reasoning_effort", "high")])
def test_a_field_for_a_template_that_does_not_read_it_is_a_400(client, model_name, field, value):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=model_name, messages=ASK, max_tokens=4, extra_body={field: value})
    assert err.value.body["param"] == field and "does not read it" in err.value.body["message"], err.value.body
