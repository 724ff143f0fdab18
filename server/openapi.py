"""The OpenAPI description of the server, generated from the pydantic request models."""

from __future__ import annotations

import corellm
from corellm.server.protocol import ChatCompletionRequest, CompletionRequest, DetokenizeRequest, TokenizeRequest
from corellm.server.anthropic_protocol import CountTokensRequest, MessagesRequest
from corellm.server.embeddings import EmbeddingRequest
from corellm.server.generate_tokens import GenerateRequest
from corellm.server.responses_protocol import ResponsesRequest
from corellm.server.classify import ClassificationRequest
from corellm.server.scores import RerankRequest, ScoreRequest

_ERROR = {"type": "object", "properties": {"error": {"type": "object", "properties": {
    "message": {"type": "string"}, "type": {"type": "string"},
    "param": {"type": ["string", "null"]}, "code": {"type": ["string", "null"]}}}}}

# A streamed response: server-sent events whose data is a JSON chunk (or an error), then [DONE].
_SSE_EVENT = {"type": "object", "required": ["data"], "properties": {"data": {"type": "string"}}}


def _post(model, summary: str, reply: dict | None = None) -> dict:
    """A POST route whose body is a `model` (or one of several, a list of models); its 200's JSON
    is an object unless `reply` gives its schema."""
    refs = [{"$ref": f"#/components/schemas/{m.__name__}"} for m in (model if isinstance(model, list) else [model])]
    schema = refs[0] if len(refs) == 1 else {"oneOf": refs}
    return {"post": {
        "summary": summary,
        "requestBody": {"required": True, "content": {"application/json": {"schema": schema}}},
        "responses": {
            "200": {"description": "OK", "content": {"application/json": {"schema": reply or {"type": "object"}},
                                                      "text/event-stream": {"schema": _SSE_EVENT}}},
            "400": {"description": "Bad request", "content": {"application/json": {"schema": _ERROR}}},
            "401": {"description": "Unauthorized", "content": {"application/json": {"schema": _ERROR}}},
            "404": {"description": "Unknown model", "content": {"application/json": {"schema": _ERROR}}},
            "413": {"description": "Body too large", "content": {"application/json": {"schema": _ERROR}}},
            "415": {"description": "Not JSON", "content": {"application/json": {"schema": _ERROR}}},
            "429": {"description": "Overloaded: retry after the Retry-After header's seconds",
                    "content": {"application/json": {"schema": _ERROR}}},
            "503": {"description": "Shutting down, or the engine stopped",
                    "content": {"application/json": {"schema": _ERROR}}},
        }}}


def _get(summary: str, content_type: str = "application/json") -> dict:
    schema = {"type": "object"} if content_type == "application/json" else {"type": "string"}
    return {"get": {"summary": summary, "responses": {"200": {"description": "OK", "content": {content_type: {"schema": schema}}},
                                                      "503": {"description": "Engine not serving"}}}}


def _stored_response(method: str, summary: str, query: dict[str, dict] | None = None) -> dict:
    """A route about one stored response (/v1/responses/{response_id}...)."""
    error = {"content": {"application/json": {"schema": _ERROR}}}
    parameters = [{"name": "response_id", "in": "path", "required": True, "schema": {"type": "string"}}]
    parameters += [{"name": name, "in": "query", "required": False, "schema": schema}
                   for name, schema in (query or {}).items()]
    return {method: {"summary": summary, "parameters": parameters, "responses": {
        "200": {"description": "OK", "content": {"application/json": {"schema": {"type": "object"}}}},
        "400": {"description": "Bad request", **error}, "401": {"description": "Unauthorized", **error},
        "404": {"description": "No such stored response", **error},
        "503": {"description": "Shutting down", **error}}}}


def openapi_spec(allow_unknown_fields: bool = False) -> dict:
    """The description; a request body's properties are all it takes (additionalProperties false)
    unless the server runs with --allow-unknown-fields, while its parts (messages, tools) take
    others (request_fields.py)."""
    models = [CompletionRequest, ChatCompletionRequest, ResponsesRequest, EmbeddingRequest, ScoreRequest,
              RerankRequest, ClassificationRequest, TokenizeRequest, DetokenizeRequest, GenerateRequest,
              MessagesRequest, CountTokensRequest]
    schemas: dict = {}
    for m in models:
        schema = m.model_json_schema(ref_template="#/components/schemas/{model}")
        schemas.update(schema.pop("$defs", {}))
        schemas[m.__name__] = schema
    for m in models:
        schemas[m.__name__]["additionalProperties"] = allow_unknown_fields
    return {
        "openapi": "3.1.0",
        "info": {"title": "corellm", "version": corellm.__version__},
        "paths": {
            "/v1/completions": _post(CompletionRequest, "Text completion"),
            "/v1/chat/completions": _post(ChatCompletionRequest, "Chat completion"),
            "/v1/responses": _post(ResponsesRequest, "A response (OpenAI's Responses API)"),
            "/v1/embeddings": _post(EmbeddingRequest, "Embeddings of the inputs (the prompt's hidden states pooled)"),
            **{f"{prefix}/score": _post(ScoreRequest, "How well texts match, per pair: the cosine similarity of "
                                        "their embeddings, or a cross-encoder's score of the pair")
               for prefix in ("", "/v1")},
            **{f"{prefix}/rerank": _post(RerankRequest, "Documents ranked by their match with a query (embeddings' "
                                         "similarity, or a cross-encoder's score)")
               for prefix in ("", "/v1", "/v2")},
            **{f"{prefix}/classify": _post(ClassificationRequest, "Each input's label probabilities (a sequence "
                                           "classifier)")
               for prefix in ("", "/v1")},
            "/invocations": _post([ChatCompletionRequest, CompletionRequest, EmbeddingRequest, ClassificationRequest,
                                   RerankRequest, ScoreRequest], "SageMaker's inference route: a chat completion (the "
                                  "body has `messages`), a completion (`prompt`), embeddings (`input`; with a "
                                  "sequence classifier served, a classification), a rerank (`query`) or a score "
                                  "(`queries` or `text_1`)"),
            "/v1/messages": _post(MessagesRequest, "A message (Anthropic's Messages API over the chat path; its "
                                  "errors in that API's shape)"),
            "/v1/messages/count_tokens": _post(CountTokensRequest, "The input tokens of a message"),
            "/inference/v1/generate": _post(GenerateRequest, "Tokens in, tokens out (vLLM's): the prompt as token "
                                            "ids and vLLM's sampling_params; the choices' token ids back"),
            "/v1/completions/render": _post(CompletionRequest, "A completion made ready and not run: per prompt the "
                                            "request /inference/v1/generate takes",
                                            {"type": "array", "items": {"type": "object"}}),
            "/v1/chat/completions/render": _post(ChatCompletionRequest, "A chat made ready and not run: the request "
                                                 "/inference/v1/generate takes"),
            "/v1/responses/{response_id}": {
                **_stored_response("get", "A stored response", {"stream": {"type": "string", "enum": ["false"]}}),
                **_stored_response("delete", "Forget a stored response")},
            "/v1/responses/{response_id}/cancel": _stored_response("post", "Cancel a background response"),
            "/v1/responses/{response_id}/input_items": _stored_response(
                "get", "The conversation that led to a stored response",
                {"limit": {"type": "integer", "minimum": 1, "maximum": 100},
                 "order": {"type": "string", "enum": ["asc", "desc"]},
                 "after": {"type": "string"}, "before": {"type": "string"}}),
            "/tokenize": _post(TokenizeRequest, "Tokenize a prompt or messages"),
            "/detokenize": _post(DetokenizeRequest, "Token ids to text"),
            "/tokenizer_info": _get("The tokenizer's special tokens and chat template"),
            "/v1/models": _get("Served models"),
            "/v1/models/{model}": {"get": {
                "summary": "The served model's card, or a LoRA adapter's (any other name: 404)",
                "parameters": [{"name": "model", "in": "path", "required": True, "schema": {"type": "string"}}],
                "responses": {"200": {"description": "OK",
                                      "content": {"application/json": {"schema": {"type": "object"}}}},
                              "404": {"description": "Unknown model",
                                      "content": {"application/json": {"schema": _ERROR}}}}}},
            "/health": _get("Engine health"),
            "/ping": {**_get("Engine health (SageMaker's probe; /health's answer)"),
                      "post": _get("Engine health (SageMaker's probe; /health's answer)")["get"]},
            "/load": _get("The model requests being handled now: {\"server_load\": n}"),
            "/version": _get("Server version"),
            "/metrics": _get("Prometheus metrics", "text/plain"),
        },
        "components": {"schemas": schemas},
    }
