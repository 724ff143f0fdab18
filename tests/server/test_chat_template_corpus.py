"""corellm's chat-template renderer (the jinja2 sandbox) against transformers' apply_chat_template,
on real models' templates: Llama 3.1 / 3.2 / 3.3, Qwen 2.5 / 3, Mistral Nemo, Hermes 2 Pro / 3
(tool use), DeepSeek R1, Phi-3.5, SmolLM 3, and Granite 3.3 and Command R7B (RAG: documents). The
templates are read, at test time, from the llama-cpp-python sdist on PyPI (its vendor/llama.cpp/models/templates; the same sdist
bench/compare_llamacpp.py builds from, cached under build/llamacpp/), never copied here. Each
conversation — plain, with a system turn, with tools and the assistant's calls and their results,
with documents, continued — renders to the same text, or fails in both."""

from __future__ import annotations

import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from corellm.chat_template import render_chat_template, template_variables
from corellm.tokenizer import ChatTemplateError

SDIST = "llama-cpp-python==0.3.36"
CACHE = Path(__file__).resolve().parents[2] / "build" / "llamacpp"
TEMPLATES = ["meta-llama-Llama-3.1-8B-Instruct", "meta-llama-Llama-3.2-3B-Instruct",
             "meta-llama-Llama-3.3-70B-Instruct", "Qwen-Qwen2.5-7B-Instruct", "Qwen-Qwen3-0.6B",
             "mistralai-Mistral-Nemo-Instruct-2407", "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use",
             "NousResearch-Hermes-3-Llama-3.1-8B-tool_use", "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B",
             "microsoft-Phi-3.5-mini-instruct", "HuggingFaceTB-SmolLM3-3B",
             # RAG templates: they show the request's documents to the model
             "ibm-granite-granite-3.3-2B-Instruct", "CohereForAI-c4ai-command-r7b-12-2024-tool_use",
             "openai-gpt-oss-120b"]  # reads reasoning_effort
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                           "parameters": {"type": "object", "properties": {
                                               "city": {"type": "string", "description": "The city"}},
                                               "required": ["city"]}}}]
CONVERSATIONS = {
    "plain": dict(messages=[{"role": "user", "content": "Hello!"}]),
    "system and turns": dict(messages=[
        {"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "What is 2+2?"}]),
    "tools, a call and its result": dict(tools=TOOLS, messages=[
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_abc123xyz", "type": "function", "function": {"name": "get_weather",
                                                                     "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "tool_call_id": "call_abc123xyz", "content": "21 C, sunny"}]),
    "thinking off": dict(messages=[{"role": "user", "content": "Hi"}], enable_thinking=False),
    "reasoning effort": dict(messages=[{"role": "user", "content": "Hi"}], reasoning_effort="high"),
    "documents": dict(messages=[{"role": "user", "content": "When was the bridge opened?"}], documents=[
        {"title": "Bridge", "text": "The bridge opened in 1932."},
        {"title": "Tunnel", "text": "The tunnel opened in 1965."}]),
}
BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"


@pytest.fixture(scope="module")
def templates() -> dict[str, str]:
    sdist = next(CACHE.glob("llama_cpp_python-*.tar.gz"), None)
    if sdist is None:
        CACHE.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "-q",
                        "-d", str(CACHE), SDIST], check=True, timeout=600)
        sdist = next(CACHE.glob("llama_cpp_python-*.tar.gz"))
    found = {}
    with tarfile.open(sdist) as tar:
        for member in tar.getmembers():
            name = Path(member.name).stem
            if "/models/templates/" in member.name and name in TEMPLATES:
                found[name] = tar.extractfile(member).read().decode()
    assert sorted(found) == sorted(TEMPLATES)
    return found


@pytest.fixture(scope="module")
def hf_tokenizer():
    transformers = pytest.importorskip("transformers")
    from corellm.model.gguf_file import GGUFModelFile
    from corellm.model.loader import default_model_path

    backend = GGUFModelFile(default_model_path()).tokenizer().backend
    return transformers.PreTrainedTokenizerFast(tokenizer_object=backend, bos_token=BOS, eos_token=EOS)


def render_hf(tok, template: str, conv: dict, add_generation_prompt: bool, continue_final: bool) -> str:
    kwargs = {k: v for k, v in conv.items() if k not in ("messages", "tools")}
    return tok.apply_chat_template(conv["messages"], tools=conv.get("tools"), chat_template=template, tokenize=False,
                                   add_generation_prompt=add_generation_prompt,
                                   continue_final_message=continue_final, **kwargs)


def render_ours(template: str, conv: dict, add_generation_prompt: bool) -> str:
    variables = {k: v for k, v in conv.items() if k not in ("messages", "tools")}
    # tools=None when there are none, as transformers passes it (some templates then fail in both)
    return render_chat_template(template, conv["messages"], add_generation_prompt=add_generation_prompt,
                                bos_token=BOS, eos_token=EOS, tools=conv.get("tools"), **variables)


@pytest.mark.parametrize("conversation", list(CONVERSATIONS))
@pytest.mark.parametrize("name", TEMPLATES)
def test_renders_as_transformers(templates, hf_tokenizer, name, conversation):
    template, conv = templates[name], CONVERSATIONS[conversation]
    for add_generation_prompt in (True, False):
        try:
            want = render_hf(hf_tokenizer, template, conv, add_generation_prompt, False)
        except Exception as e:  # noqa: BLE001 - the template refuses the conversation: ours must too
            with pytest.raises(ChatTemplateError):
                render_ours(template, conv, add_generation_prompt)
            return
        assert render_ours(template, conv, add_generation_prompt) == want, (name, conversation)


@pytest.mark.parametrize("name", TEMPLATES)
def test_continue_final_message_as_transformers(templates, hf_tokenizer, name):
    from corellm.tokenizer import Tokenizer

    conv = {"messages": [{"role": "user", "content": "Name a fruit."},
                         {"role": "assistant", "content": "The fruit is"}]}
    tok = Tokenizer(hf_tokenizer.backend_tokenizer)
    ours = lambda: tok.apply_chat_template(conv["messages"], add_generation_prompt=False,  # noqa: E731
                                           chat_template=templates[name], continue_final_message=True,
                                           bos_token=BOS, eos_token=EOS, tools=None)
    try:
        want = render_hf(hf_tokenizer, templates[name], conv, False, True)
    except Exception:  # noqa: BLE001 - the template refuses the conversation: ours must too
        with pytest.raises(ChatTemplateError):
            ours()
        return
    assert ours() == want


# The request fields that are template variables (server/chat.py's TEMPLATE_FIELDS): the
# corpus' templates that read each, and what its conversation puts in the text.
READ_BY = {"documents": (["ibm-granite-granite-3.3-2B-Instruct", "CohereForAI-c4ai-command-r7b-12-2024-tool_use"],
                         ["The bridge opened in 1932.", "The tunnel opened in 1965."]),
           "reasoning_effort": (["openai-gpt-oss-120b"], ["Reasoning: high"])}


@pytest.mark.parametrize("field", list(READ_BY))
@pytest.mark.parametrize("name", TEMPLATES)
def test_the_templates_that_read_a_field_are_known_and_show_it(templates, name, field):
    """The server refuses documents or reasoning_effort for a template that does not read them:
    the templates that do are found to, the others not, and the value reaches the text."""
    readers, shown = READ_BY[field]
    reads = field in template_variables(templates[name])
    assert reads == (name in readers)
    if reads:
        conv = next(c for c in CONVERSATIONS.values() if field in c)
        # tools left undefined, as the server renders a request without them
        text = render_chat_template(templates[name], conv["messages"], add_generation_prompt=True, bos_token=BOS,
                                    eos_token=EOS, **{field: conv[field]})
        assert all(s in text for s in shown), text


def test_a_reasoning_sent_back_reaches_gpt_oss_template_as_its_analysis(templates, hf_tokenizer):
    """A client's earlier assistant turn with its reasoning (reasoning_content, or vLLM's reasoning)
    and a tool call: the server's template message carries it as `thinking` too, gpt-oss's name, and
    its template renders it as that turn's analysis message, as transformers does with the same
    message."""
    from corellm.server.chat_messages import ChatMessage

    history = [{"role": "user", "content": "Weather in Paris?"},
               {"role": "assistant", "reasoning": "I should call get_weather.", "tool_calls": [
                   {"id": "call_1", "type": "function", "function": {"name": "get_weather",
                                                                      "arguments": '{"city": "Paris"}'}}]},
               {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 21 C."}]
    conv = {"tools": TOOLS, "messages": [ChatMessage.model_validate(m).as_template_message() for m in history]}
    text = render_ours(templates["openai-gpt-oss-120b"], conv, add_generation_prompt=True)
    assert "<|channel|>analysis<|message|>I should call get_weather.<|end|>" in text
    assert text == render_hf(hf_tokenizer, templates["openai-gpt-oss-120b"], conv, True, False)
