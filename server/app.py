"""The aiohttp application: routes, the JSON / auth / error middleware, and the engine's
lifecycle (started with the app, drained on shutdown)."""

from __future__ import annotations

import json
import logging

from aiohttp import web
from pydantic import BaseModel, ValidationError

import corellm
from corellm.engine.async_llm import AsyncLLM, EngineDeadError
from corellm.engine.input_processor import ENCODER_REFUSAL, generation_refusal
from corellm.server import anthropic_messages
from corellm.server.anthropic_protocol import CountTokensRequest, MessagesRequest
from corellm.server.chat import create_chat_completion, render_prompt
from corellm.server.classify import ClassificationRequest, create_classification
from corellm.server.completions import create_completion
from corellm.server.embeddings import EmbeddingRequest, create_embedding
from corellm.server.generate_tokens import GenerateRequest, create_generate
from corellm.server.lora_adapters import (LoadLoRAAdapterRequest, UnloadLoRAAdapterRequest, load_adapter,
                                          lora_model_cards, runtime_updating_allowed, unload_adapter)
from corellm.server.render import render_chat, render_completion
from corellm.server.scores import RerankRequest, ScoreRequest, create_rerank, create_score
from corellm.server.errors import PROBE_PATHS, APIError, api_key_refusal, bad_request, validation_error
from corellm.server.metrics import ServerMetrics
from corellm.server.openapi import openapi_spec
from corellm.server.protocol import ChatCompletionRequest, CompletionRequest, DetokenizeRequest, TokenizeRequest
from corellm.server.request_fields import check_request_fields
from corellm.server.responses import (cancel_response, create_response, delete_response, get_response,
                                      list_input_items)
from corellm.server.responses_protocol import ResponsesRequest
from corellm.server.serving import REQUEST_ID, ServerConfig, Serving, now

logger = logging.getLogger("corellm.server")

SERVING = web.AppKey("serving", Serving)
METRICS = web.AppKey("metrics", ServerMetrics)
ANTHROPIC_PATHS = ("/v1/messages",)  # Anthropic's Messages API (its errors have that API's shape)


async def parse(request: web.Request, model: type[BaseModel]) -> BaseModel:
    return validate_body(request, await read_body(request), model)


async def read_body(request: web.Request) -> dict:
    """The request's JSON object (415, 413 or 400 when it is not one)."""
    if request.content_type != "application/json":
        raise APIError(415, f"Content-Type must be application/json, got {request.content_type or 'none'!r}",
                       "invalid_request_error")
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        limit = request.app[SERVING].config.max_body_bytes
        raise APIError(413, f"request body too large (limit {limit} bytes)", "invalid_request_error") from None
    if not raw:
        raise bad_request("the request body is empty")
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise bad_request(f"invalid JSON: {e}") from None
    if not isinstance(body, dict):
        raise bad_request(f"the request body must be a JSON object, got {type(body).__name__}")
    return body


def validate_body(request: web.Request, body: dict, model: type[BaseModel]) -> BaseModel:
    """The body as a `model` (a 400 naming the field that is not as the model says)."""
    try:
        parsed = model.model_validate(body, context={"max_logprobs": request.app[SERVING].config.max_logprobs})
    except ValidationError as e:
        raise validation_error(e) from None
    check_request_fields(parsed, allow_unknown=request.app[SERVING].config.allow_unknown_fields)
    return parsed


def error_reply(request: web.Request, error: APIError) -> web.Response:
    """The error in the shape of the API the route belongs to: Anthropic's for its Messages API's
    routes, OpenAI's for the others."""
    if request.path.startswith(ANTHROPIC_PATHS):
        return anthropic_messages.error_response(error)
    return error.response()


@web.middleware
async def errors_and_auth(request: web.Request, handler):
    serving: Serving = request.app[SERVING]
    refused = api_key_refusal(request, serving.config.api_key)
    if refused is not None:
        return error_reply(request, refused)
    if serving.draining and request.path not in PROBE_PATHS:
        return error_reply(request, APIError(503, "the server is shutting down", "service_unavailable"))
    serving.active += 1
    try:
        return await handler(request)
    except APIError as e:
        return error_reply(request, e)
    except web.HTTPException as e:
        if e.status == 413:
            return error_reply(request, APIError(413, "request body too large", "invalid_request_error"))
        return error_reply(request, APIError(e.status, e.reason or "HTTP error", "invalid_request_error"))
    except EngineDeadError as e:
        return error_reply(request, APIError(503, str(e), "service_unavailable"))
    except ValueError as e:
        return error_reply(request, bad_request(str(e)))
    except Exception as e:  # noqa: BLE001 - one request's failure must not take the server down
        logger.exception("request failed")
        return error_reply(request, APIError(500, f"internal error: {type(e).__name__}: {e}", "internal_error"))
    finally:
        serving.active -= 1


async def reply_request_id(request: web.Request, response: web.StreamResponse) -> None:
    """Every reply to a request that named itself (an X-Request-Id header) names it back, and a
    completion's or a chat's reply names the id its body's id ends with (Serving.new_ids)."""
    named = request.get(REQUEST_ID) or request.headers.get("X-Request-Id")
    if named:
        response.headers["X-Request-Id"] = named


async def answer(request: web.Request, create, model: type[BaseModel], body: dict | None = None) -> web.StreamResponse:
    """create(serving, request, the body as a `model`), the body read from the request unless given.
    Such a request counts in the server's load (GET /load) from its arrival to its reply's end."""
    serving = request.app[SERVING]
    serving.model_requests += 1
    try:
        classifier_labels = serving.classifier_labels
        if classifier_labels and create in GENERATING:
            raise bad_request(generation_refusal(classifier_labels), "model", "model_not_supported")
        if serving.engine.loaded.config.encoder_only and create in GENERATING:
            raise bad_request(ENCODER_REFUSAL, "model", "model_not_supported")
        body = await read_body(request) if body is None else body
        return await create(serving, request, validate_body(request, body, model))
    finally:
        serving.model_requests -= 1


def body_route(create, model: type[BaseModel]):
    """A route whose request body is a `model`: create(serving, request, the parsed body)."""
    async def route(request: web.Request) -> web.StreamResponse:
        return await answer(request, create, model)
    return route


# The routes whose requests generate: a sequence classifier answers them with a 400 (it has no LM head).
GENERATING = frozenset({create_completion, create_chat_completion, create_response, anthropic_messages.create_message,
                        create_generate, render_completion, render_chat})


# POST /invocations (SageMaker's one inference route, as vLLM serves it): what the body asks for,
# told by the first of these fields it has — each is one kind of request's own.
INVOCATIONS = [("messages", create_chat_completion, ChatCompletionRequest),
               ("prompt", create_completion, CompletionRequest),
               ("input", create_embedding, EmbeddingRequest),
               ("query", create_rerank, RerankRequest),
               ("queries", create_score, ScoreRequest),
               ("text_1", create_score, ScoreRequest)]


async def invocations(request: web.Request) -> web.StreamResponse:
    """The body answered as the request its fields make it (INVOCATIONS): a chat completion, a
    completion, embeddings (with a sequence classifier served: a classification), a rerank or a
    score; it is then checked as that request, so an error names the field that is wrong in it. A
    body with none of the fields is a 400 naming them."""
    body = await read_body(request)
    for field, create, model in INVOCATIONS:
        if field in body:
            if create is create_embedding and request.app[SERVING].classifier_labels:
                create, model = create_classification, ClassificationRequest
            return await answer(request, create, model, body)
    raise bad_request("an /invocations body is a chat completion (`messages`), a completion (`prompt`), "
                      "embeddings or a classification (`input`), a rerank (`query` and `documents`) or a score "
                      "(`queries` and `documents`, or `text_1` and `text_2`); this one has none of those fields")


def stored_response_route(handle):
    """A route about a stored response (responses.py): handle(serving, request)."""
    async def route(request: web.Request) -> web.Response:
        return await handle(request.app[SERVING], request)
    return route


def model_card(serving: Serving) -> dict:
    return {"id": serving.config.served_model_name, "object": "model", "created": now(), "owned_by": "corellm",
            "max_model_len": serving.engine.max_model_len}


async def models(request: web.Request) -> web.Response:
    """The served model, then its LoRA adapters (lora_adapters.py)."""
    serving = request.app[SERVING]
    return web.json_response({"object": "list", "data": [model_card(serving)] + lora_model_cards(serving)})


async def retrieve_model(request: web.Request) -> web.Response:
    """GET /v1/models/{model}: the served model's card or a LoRA adapter's (OpenAI's
    models.retrieve); any other name is a 404. A name with a slash (an HF id such as org/name)
    comes URL-encoded or as it is."""
    serving = request.app[SERVING]
    name = serving.check_model(request.match_info["model"])
    card = next((c for c in lora_model_cards(serving) if c["id"] == name), None)
    return web.json_response(card or model_card(serving))


def parsed_route(handle, model: type[BaseModel]):
    """A route whose body is a `model`, answered by handle(serving, the parsed body); not a
    request to the model (GET /load does not count it)."""
    async def route(request: web.Request) -> web.StreamResponse:
        return await handle(request.app[SERVING], await parse(request, model))
    return route


async def load(request: web.Request) -> web.Response:
    """GET /load (vLLM's): {"server_load": the requests to the model's routes (those whose body
    is a request: completions, chat, responses, messages, embeddings, score, rerank, tokens in,
    render) the server is handling now, streams and background responses included}; a load
    balancer's measure of how busy this server is."""
    return web.json_response({"server_load": request.app[SERVING].model_requests})


async def health(request: web.Request) -> web.Response:
    serving = request.app[SERVING]
    engine = serving.engine
    if engine.dead_error is not None:
        return web.json_response({"status": "dead", "error": str(engine.dead_error)}, status=503)
    broken = engine.engine_core.health_error()
    if broken is not None:
        return web.json_response({"status": "dead", "error": broken}, status=503)
    if serving.draining:
        return web.json_response({"status": "draining"}, status=503)
    return web.json_response({"status": "ok"})


async def metrics(request: web.Request) -> web.Response:
    serving, m = request.app[SERVING], request.app[METRICS]
    engine = serving.engine
    m.observe_server(engine.num_queued_requests, engine.num_queued_tokens, serving.admission.num_rejected,
                     engine.open_request_states())
    return web.Response(body=m.render(), content_type="text/plain", charset="utf-8")


async def version(request: web.Request) -> web.Response:
    return web.json_response({"version": corellm.__version__})


async def tokenize(request: web.Request) -> web.Response:
    serving = request.app[SERVING]
    req: TokenizeRequest = await parse(request, TokenizeRequest)
    serving.check_model(req.model)
    if (req.prompt is None) == (req.messages is None):
        raise bad_request("give exactly one of prompt or messages", "prompt")
    if req.messages is not None:
        text = await render_prompt(serving, ChatCompletionRequest(messages=req.messages,
                                                                  add_generation_prompt=req.add_generation_prompt))
        tokens = serving.tokenizer.encode(text, add_special_tokens=False)
    else:
        tokens = serving.tokenizer.encode(req.prompt, add_special_tokens=req.add_special_tokens)
    return web.json_response({"tokens": tokens, "count": len(tokens), "max_model_len": serving.engine.max_model_len})


async def detokenize(request: web.Request) -> web.Response:
    serving = request.app[SERVING]
    req: DetokenizeRequest = await parse(request, DetokenizeRequest)
    serving.check_model(req.model)
    vocab = serving.engine.loaded.config.vocab_size
    bad = [t for t in req.tokens if not 0 <= t < vocab]
    if bad:
        raise bad_request(f"token id {bad[0]} is outside the vocabulary [0, {vocab})", "tokens")
    return web.json_response({"prompt": serving.tokenizer.decode(req.tokens, skip_special_tokens=False)})


async def tokenizer_info(request: web.Request) -> web.Response:
    """The tokenizer's special tokens and chat template, as vLLM's GET /tokenizer_info: what a client
    that tokenizes through the server needs (lm-evaluation-harness's remote tokenizer reads it, then
    /tokenize and /detokenize), so that it needs no copy of the model's tokenizer."""
    serving = request.app[SERVING]
    tok = serving.tokenizer

    def text(token_id: int | None) -> str | None:
        return None if token_id is None else tok.decode([token_id], skip_special_tokens=False)

    return web.json_response({"tokenizer_class": type(tok.backend).__name__, "eos_token": text(tok.eos_token_id),
                              "bos_token": text(tok.bos_token_id), "pad_token": text(tok.pad_token_id),
                              "chat_template": tok.chat_template, "model_max_length": serving.engine.max_model_len,
                              "vocab_size": tok.vocab_size})


async def openapi(request: web.Request) -> web.Response:
    return web.json_response(openapi_spec(request.app[SERVING].config.allow_unknown_fields))


def create_app(engine: AsyncLLM, config: ServerConfig) -> web.Application:
    app = web.Application(middlewares=[errors_and_auth], client_max_size=config.max_body_bytes)
    app.on_response_prepare.append(reply_request_id)
    app[SERVING] = Serving(engine, config)
    app[METRICS] = ServerMetrics(config.served_model_name, engine.max_model_len)
    engine.listeners.append(app[METRICS].on_step)
    engine.done_listeners.append(app[METRICS].on_request_done)
    app.router.add_post("/v1/completions", body_route(create_completion, CompletionRequest))
    app.router.add_post("/v1/chat/completions", body_route(create_chat_completion, ChatCompletionRequest))
    app.router.add_post("/v1/responses", body_route(create_response, ResponsesRequest))
    app.router.add_post("/v1/embeddings", body_route(create_embedding, EmbeddingRequest))
    for prefix in ("", "/v1"):
        app.router.add_post(f"{prefix}/score", body_route(create_score, ScoreRequest))
        app.router.add_post(f"{prefix}/classify", body_route(create_classification, ClassificationRequest))
    for prefix in ("", "/v1", "/v2"):
        app.router.add_post(f"{prefix}/rerank", body_route(create_rerank, RerankRequest))
    app.router.add_post("/invocations", invocations)
    app.router.add_post("/inference/v1/generate", body_route(create_generate, GenerateRequest))
    app.router.add_post("/v1/messages", body_route(anthropic_messages.create_message, MessagesRequest))
    app.router.add_post("/v1/messages/count_tokens", body_route(anthropic_messages.count_tokens, CountTokensRequest))
    app.router.add_post("/v1/completions/render", body_route(render_completion, CompletionRequest))
    app.router.add_post("/v1/chat/completions/render", body_route(render_chat, ChatCompletionRequest))
    app.router.add_get("/v1/responses/{response_id}", stored_response_route(get_response))
    app.router.add_delete("/v1/responses/{response_id}", stored_response_route(delete_response))
    app.router.add_post("/v1/responses/{response_id}/cancel", stored_response_route(cancel_response))
    app.router.add_get("/v1/responses/{response_id}/input_items", stored_response_route(list_input_items))
    app.router.add_get("/v1/models", models)
    app.router.add_get("/v1/models/{model:.+}", retrieve_model)
    app.router.add_get("/health", health)
    for add in (app.router.add_get, app.router.add_post):
        add("/ping", health)  # SageMaker's health check, GET or POST: /health's answer
    app.router.add_get("/load", load)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/version", version)
    app.router.add_post("/tokenize", tokenize)
    app.router.add_post("/detokenize", detokenize)
    app.router.add_get("/tokenizer_info", tokenizer_info)
    app.router.add_get("/openapi.json", openapi)
    if runtime_updating_allowed():
        app.router.add_post("/v1/load_lora_adapter", parsed_route(load_adapter, LoadLoRAAdapterRequest))
        app.router.add_post("/v1/unload_lora_adapter", parsed_route(unload_adapter, UnloadLoRAAdapterRequest))

    async def start_engine(app: web.Application) -> None:
        engine.start()

    async def stop_engine(app: web.Application) -> None:
        await engine.shutdown()

    app.on_startup.append(start_engine)
    app.on_cleanup.append(stop_engine)
    return app
