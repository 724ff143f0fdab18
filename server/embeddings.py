"""POST /v1/embeddings (OpenAI's Embeddings API, as vLLM serves it): each input — a string, or token
ids — becomes an embedding request (PoolingParams): the engine computes the prompt and pools its
final hidden states by its pooling type (--pooling-type; worker/pooler.py), L2-normalized unless
vLLM's `normalize` is false; `dimensions` keeps a Matryoshka model's first values (before the
normalization; a model whose config declares none refuses it). The vectors come back as floats, or
as base64 of their little-endian float32 bytes (`encoding_format`). A model answers embedding and generation requests alike: one
trained for embeddings (Qwen3-Embedding, e5-mistral) gives vectors worth comparing."""

from __future__ import annotations

import base64
from typing import Annotated, Literal

import numpy as np
from aiohttp import web
from pydantic import Field

from corellm.inputs import TokensPrompt
from corellm.lora.lora_request import LoRARequest
from corellm.model.matryoshka import check_dimensions
from corellm.pooling_params import PoolingParams
from corellm.server.errors import APIError, bad_request
from corellm.server.protocol import MAX_REQUEST_ID_CHARS, TokenId
from corellm.server.request_part import RequestPart
from corellm.server.serving import Serving, now

MAX_INPUTS = 2048  # OpenAI's limit on inputs per request

Text = Annotated[str, Field(min_length=1)]
Tokens = Annotated[list[TokenId], Field(min_length=1)]


class PooledInputsRequest(RequestPart):
    """What a request whose inputs are each pooled into one row has (/v1/embeddings, /classify):
    `input` a string, strings, token ids or lists of them; vLLM's extras."""
    model: str | None = None
    input: Text | Annotated[list[Text], Field(min_length=1, max_length=MAX_INPUTS)] | Tokens \
        | Annotated[list[Tokens], Field(min_length=1, max_length=MAX_INPUTS)]
    user: str | None = None
    add_special_tokens: bool = True
    truncate_prompt_tokens: int | None = Field(None, ge=-1)
    truncation_side: Literal["left", "right"] | None = None  # with truncate_prompt_tokens: "right" keeps the first k
    priority: int = Field(0, ge=-2**31, lt=2**31)
    request_id: str | None = Field(None, min_length=1, max_length=MAX_REQUEST_ID_CHARS, pattern=r"^[\x21-\x7e]+$")

    def prompts(self) -> list[str | list[int]]:
        if isinstance(self.input, str) or (self.input and isinstance(self.input[0], int)):
            return [self.input]
        return list(self.input)


class EmbeddingRequest(PooledInputsRequest):
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, ge=1)  # a Matryoshka model's first values (model/matryoshka.py)
    normalize: bool | None = None  # vLLM's; default true


async def create_embedding(serving: Serving, request: web.Request, req: EmbeddingRequest) -> web.Response:
    model, lora = serving.resolve_model(req.model)
    if req.dimensions is not None:
        processor = serving.engine.parts.input_processor
        try:
            check_dimensions(req.dimensions, processor.embedding_size, processor.matryoshka_dimensions, repr(model))
        except ValueError as e:
            raise bad_request(str(e), "dimensions", "unsupported_field" if processor.matryoshka_dimensions is None
                              else None) from None
    response_id, engine_id = serving.new_ids("embd-", request, req.request_id)
    params = PoolingParams(normalize=req.normalize is not False, dimensions=req.dimensions)
    vectors, tokens = await embed(serving, engine_id, req.prompts(), params,
                                  add_special_tokens=req.add_special_tokens,
                                  truncate_prompt_tokens=req.truncate_prompt_tokens,
                                  truncation_side=req.truncation_side, priority=req.priority, lora_request=lora)
    data = [{"object": "embedding", "index": i, "embedding": vector if req.encoding_format == "float" else
             base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode()} for i, vector in enumerate(vectors)]
    return web.json_response({"id": response_id, "object": "list", "created": now(), "model": model, "data": data,
                              "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})


async def embed(serving: Serving, engine_id: str, prompts: list[str | list[int] | TokensPrompt], params: PoolingParams,
                add_special_tokens: bool = True, truncate_prompt_tokens: int | None = None,
                truncation_side: str | None = None, priority: int = 0,
                field: str = "input", lora_request: LoRARequest | None = None) -> tuple[list[list[float]], int]:
    """The prompts' vectors, in order, and their tokens in all (a 400 naming `field` for a prompt
    the context cannot hold). A prompt is a text, token ids, or a TokensPrompt with its token types
    (a cross-encoder's pair: scoring.cross_encoder_inputs), whose types are cut as its ids are."""
    processed = []
    for i, prompt in enumerate(prompts):
        text = prompt if isinstance(prompt, str) else None
        types = prompt.get("token_type_ids") if isinstance(prompt, dict) else None
        if text is not None:
            ids = serving.tokenizer.encode(prompt, add_special_tokens=add_special_tokens)
        else:
            ids = prompt["prompt_token_ids"] if isinstance(prompt, dict) else prompt
        ids = serving.truncate_prompt(ids, truncate_prompt_tokens, truncation_side)
        if types is not None:
            types = serving.truncate_prompt(types, truncate_prompt_tokens, truncation_side)
        processed.append(serving.prepare(f"{engine_id}-{i}", ids, text, params, None, kind=field, priority=priority,
                                         lora_request=lora_request, token_type_ids=types))
    outputs = await serving.run_all(processed)
    for i, out in enumerate(outputs):
        if out.embedding is None:
            raise APIError(500, f"{field} {i} gave no vector: {out.metrics.get('error', 'unknown')}", "internal_error")
    return [out.embedding for out in outputs], sum(len(out.prompt_token_ids) for out in outputs)
