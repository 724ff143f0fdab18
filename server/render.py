"""POST /v1/completions/render and POST /v1/chat/completions/render (vLLM's): a completion or chat
request made ready to run and not run — the chat template applied, the prompt tokenized, truncated and
checked against the context, the model's generation defaults and the request's sampling fields
resolved — and given back as the request POST /inference/v1/generate takes (generate_tokens.py):
{request_id, model, token_ids, sampling_params, stream, stream_options, cache_salt, priority}. A
completion renders to one such request per prompt (a list), a chat to one.

So a client that renders once and then generates from token ids (an RL trainer that keeps the ids it
trains on) gets the tokens the chat or completion route would have given. What only the routes' replies
do — echo, beam search, images' rendered features, tool-call and reasoning parsing of the output — is
not expressed by token ids and sampling parameters: those requests are 400s here."""

from __future__ import annotations

import dataclasses

from aiohttp import web

from corellm.sampling_params import SamplingParams
from corellm.server.chat import prepare_chat
from corellm.server.chat_messages import ImagePart
from corellm.server.completions import prompts_of
from corellm.server.errors import bad_request
from corellm.server.protocol import ChatCompletionRequest, CompletionRequest
from corellm.server.serving import Serving

_DEFAULTS = SamplingParams()


def sampling_params_json(params: SamplingParams) -> dict:
    """The parameters as vLLM's SamplingParams JSON: the fields that differ from the defaults (and
    max_tokens always: /inference/v1/generate reads a missing one as the rest of the context),
    nested parameters as objects without their unset fields. SamplingParams(**it) gives them back."""
    out = {}
    for f in dataclasses.fields(SamplingParams):
        value = getattr(params, f.name)
        if f.name == "output_kind" or (value == getattr(_DEFAULTS, f.name) and f.name != "max_tokens"):
            continue
        if dataclasses.is_dataclass(value):
            value = {k: v for k, v in dataclasses.asdict(value).items() if v is not None}
        out[f.name] = value
    return out


def _generate_request(request_id: str, model: str, token_ids: list[int], params: SamplingParams,
                      req: CompletionRequest | ChatCompletionRequest) -> dict:
    return {"request_id": request_id, "model": model, "token_ids": token_ids,
            "sampling_params": sampling_params_json(params), "stream": req.stream,
            "stream_options": req.stream_options.model_dump() if req.stream_options is not None else None,
            "cache_salt": req.cache_salt, "priority": req.priority}


def _refuse_what_ids_do_not_carry(req: CompletionRequest | ChatCompletionRequest) -> None:
    if req.use_beam_search:
        raise bad_request("use_beam_search is not rendered: /inference/v1/generate samples", "use_beam_search")
    if getattr(req, "echo", False):
        raise bad_request("echo is not rendered: it shapes the route's reply, not the generation", "echo")


async def render_completion(serving: Serving, request: web.Request, req: CompletionRequest) -> web.Response:
    model = serving.check_model(req.model)
    _refuse_what_ids_do_not_carry(req)
    if req.suffix:
        raise bad_request("suffix is not supported by corellm", "suffix", "unsupported_field")
    if req.max_tokens == 0:
        raise bad_request("max_tokens must be at least 1", "max_tokens")
    params = req.sampling_params(serving.defaults(), req.max_tokens, req.logprobs)
    structured_field = req.structured_output()[1]
    await serving.check_constraint(params, structured_field)
    response_id, _ = serving.new_ids("cmpl-", request, req.request_id)
    rendered = []
    for i, (ids, text) in enumerate(prompts_of(req, serving)):
        request_id = f"{response_id}-{i}"
        serving.prepare(request_id, ids, text, params, req.max_tokens, cache_salt=req.cache_salt,
                        priority=req.priority, structured_field=structured_field)  # the context's checks
        rendered.append(_generate_request(request_id, model, ids, params, req))
    return web.json_response(rendered)


async def render_chat(serving: Serving, request: web.Request, req: ChatCompletionRequest) -> web.Response:
    _refuse_what_ids_do_not_carry(req)
    if not req.include_reasoning:
        raise bad_request("include_reasoning is not rendered: it shapes the route's reply (the client reads the "
                          "reasoning apart itself)", "include_reasoning")
    if any(isinstance(m.content, list) and any(isinstance(p, ImagePart) for p in m.content) for m in req.messages):
        raise bad_request("a conversation with images is not rendered: their features (the vision tower's "
                          "input) are not made into the request", "messages")
    turn = await prepare_chat(serving, request, req)
    return web.json_response(_generate_request(turn.response_id, turn.model, turn.prompt_ids, turn.params, req))
