"""A reasoning model's reply through the server (SmolLM2 standing in, --reasoning-parser
deepseek_r1: the prompt opens the <think> block, so until the model writes </think> everything is
reasoning): reasoning_content (and vLLM's name for it, reasoning) apart from content, whole and
streamed, and either name accepted on the replies a client sends back; chat_template_kwargs may
not replace the server's own template variables; thinking_token_budget cuts the reasoning;
include_reasoning false leaves it out. The parser checks (ReasoningParser) and the grammar's wait
for the end of the reasoning (StructuredOutputManager, ReasoningWait) have their own unit tests."""

from __future__ import annotations

import openai
import pytest

ASK = [{"role": "user", "content": "Is 7 prime?"}]


def test_reasoning_content_apart_whole_and_streamed(reasoning_client):
    args = dict(model="SmolLM2-135M-Instruct", messages=ASK, max_tokens=24, temperature=0)
    whole = reasoning_client.chat.completions.create(**args).choices[0].message
    reasoning = whole.model_extra["reasoning_content"]
    assert reasoning and not whole.content  # no </think> came: all of it was reasoning
    assert whole.model_extra["reasoning"] == reasoning  # vLLM's name for it too
    chunks = list(reasoning_client.chat.completions.create(stream=True, **args))
    for name in ("reasoning_content", "reasoning"):
        assert "".join(c.choices[0].delta.model_extra.get(name) or "" for c in chunks if c.choices) == reasoning
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == ""


def test_chat_template_kwargs_may_not_replace_the_servers_variables(reasoning_client):
    """(That they reach the template: tests/engine/test_llm_api.py, through the same renderer.)"""
    with pytest.raises(openai.BadRequestError) as err:
        reasoning_client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=ASK, max_tokens=1,
                                                 extra_body={"chat_template_kwargs": {"tools": []}})
    assert err.value.body["param"] == "chat_template_kwargs"


def test_thinking_token_budget_cuts_the_reasoning_and_the_answer_follows(reasoning_client):
    args = dict(model="SmolLM2-135M-Instruct", messages=ASK, max_tokens=24, temperature=0)
    free = reasoning_client.chat.completions.create(**args).choices[0].message
    cut = reasoning_client.chat.completions.create(**args, extra_body={"thinking_token_budget": 4}).choices[0].message
    reasoning = cut.model_extra["reasoning_content"]
    assert free.model_extra["reasoning_content"].startswith(reasoning) and len(reasoning) < 40, reasoning
    assert cut.content, cut  # the end was forced after 4 tokens: the rest is the answer
    chunks = list(reasoning_client.chat.completions.create(stream=True, **args,
                                                           extra_body={"thinking_token_budget": 4}))
    assert "".join(c.choices[0].delta.model_extra.get("reasoning_content") or "" for c in chunks if c.choices) == reasoning
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == cut.content


def test_include_reasoning_false_leaves_the_reasoning_out(reasoning_client):
    """(vLLM's include_reasoning) The reasoning is still parsed apart, so the content is the same."""
    args = dict(model="SmolLM2-135M-Instruct", messages=ASK, max_tokens=24, temperature=0)
    budget = {"thinking_token_budget": 4}
    shown = reasoning_client.chat.completions.create(**args, extra_body=budget).choices[0].message
    hidden = reasoning_client.chat.completions.create(**args, extra_body=budget | {"include_reasoning": False})
    message = hidden.choices[0].message
    assert shown.model_extra["reasoning_content"] and shown.content
    assert message.model_extra["reasoning_content"] is None and message.model_extra["reasoning"] is None
    assert message.content == shown.content
    chunks = [c for c in reasoning_client.chat.completions.create(
        stream=True, **args, extra_body=budget | {"include_reasoning": False}) if c.choices]
    names = ("reasoning_content", "reasoning")
    assert not any(c.choices[0].delta.model_extra.get(name) for c in chunks for name in names)
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == shown.content


def test_a_replys_reasoning_sent_back_under_either_name_reaches_the_template(reasoning_client):
    from corellm.server.chat_messages import ChatMessage

    for name in ("reasoning", "reasoning_content"):
        message = ChatMessage.model_validate({"role": "assistant", "content": "Yes.", name: "7 has no divisors."})
        rendered = message.as_template_message()
        assert rendered["reasoning_content"] == rendered["thinking"] == "7 has no divisors."  # (thinking: gpt-oss's)
    history = ASK + [{"role": "assistant", "content": "Yes.", "reasoning": "7 has no divisors.",
                      "reasoning_content": "7 has no divisors."}, {"role": "user", "content": "And 9?"}]
    reasoning_client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=history, max_tokens=2)
    with pytest.raises(openai.BadRequestError) as err:
        history[1]["reasoning"] = "something else"
        reasoning_client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=history, max_tokens=2)
    assert err.value.body["param"].startswith("messages.1"), err.value.body


def test_thinking_token_budget_needs_a_reasoning_parser(client, model_name):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=model_name, messages=ASK, max_tokens=4,
                                       extra_body={"thinking_token_budget": 4})
    assert err.value.body["param"] == "thinking_token_budget" and "--reasoning-parser" in err.value.body["message"]
