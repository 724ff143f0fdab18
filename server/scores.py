"""POST /score and POST /rerank (vLLM's, also under /v1/ and /v2/rerank): how well texts match, as
vLLM scores them — with an embedding model (a bi-encoder), the cosine similarity of the two texts'
vectors (embeddings.py: pooled and L2-normalized, so a dot product); with a one-label sequence
classifier (a cross-encoder, such as a reranker), the classifier's sigmoid on the two texts encoded
together as one input (corellm/scoring.py, which LLM.score shares).

    /score    `queries` and `documents` (vLLM's older names: `text_1`, `text_2`): one and one, one
              against each of many, or many pairwise (lists of one length); a score per pair.
    /rerank   a `query` and `documents`: each document's score against the query, best first,
              the `top_n` best (all when 0 or left out), as Jina's and Cohere's rerank APIs."""

from __future__ import annotations

import asyncio
from typing import Annotated, Literal

from aiohttp import web
from pydantic import Field

from corellm.lora.lora_request import LoRARequest
from corellm.pooling_params import PoolingParams
from corellm.scoring import cosine_scores, cross_encoder_inputs, pair_up
from corellm.server.embeddings import MAX_INPUTS, Text, embed
from corellm.server.errors import bad_request
from corellm.server.protocol import MAX_REQUEST_ID_CHARS
from corellm.server.request_part import RequestPart
from corellm.server.serving import Serving, now

Texts = Text | Annotated[list[Text], Field(min_length=1, max_length=MAX_INPUTS)]


class ScoreRequest(RequestPart):
    model: str | None = None
    queries: Texts | None = None
    documents: Texts | None = None
    text_1: Texts | None = None  # vLLM's older names
    text_2: Texts | None = None
    truncate_prompt_tokens: int | None = Field(None, ge=-1)
    truncation_side: Literal["left", "right"] | None = None  # with truncate_prompt_tokens: "right" keeps the first k
    priority: int = Field(0, ge=-2**31, lt=2**31)
    request_id: str | None = Field(None, min_length=1, max_length=MAX_REQUEST_ID_CHARS, pattern=r"^[\x21-\x7e]+$")

    def pairs(self) -> tuple[list[str], list[str]]:
        """(queries, documents) of one length: a single query scored against each document."""
        for new, old in (("queries", "text_1"), ("documents", "text_2")):
            if (getattr(self, new) is None) == (getattr(self, old) is None):
                raise bad_request(f"give {new} (or vLLM's older {old}), one of the two", new)
        queries, documents = self.queries or self.text_1, self.documents or self.text_2
        queries = [queries] if isinstance(queries, str) else queries
        documents = [documents] if isinstance(documents, str) else documents
        try:
            return pair_up(queries, documents, "queries", "documents")
        except ValueError as e:
            raise bad_request(str(e), "queries") from None


class RerankRequest(RequestPart):
    model: str | None = None
    query: Text
    documents: Annotated[list[Text], Field(min_length=1, max_length=MAX_INPUTS)]
    top_n: int = Field(0, ge=0)  # 0: every document
    return_documents: bool = True
    truncate_prompt_tokens: int | None = Field(None, ge=-1)
    truncation_side: Literal["left", "right"] | None = None  # with truncate_prompt_tokens: "right" keeps the first k
    priority: int = Field(0, ge=-2**31, lt=2**31)
    request_id: str | None = Field(None, min_length=1, max_length=MAX_REQUEST_ID_CHARS, pattern=r"^[\x21-\x7e]+$")


async def _similarities(serving: Serving, engine_id: str, queries: list[str], documents: list[str], *,
                        req: ScoreRequest | RerankRequest, query_field: str,
                        lora_request: LoRARequest | None = None) -> tuple[list[float], int]:
    """The cosine similarity of each (query, document) pair; each distinct text embedded once, cut
    as the request's truncate_prompt_tokens and truncation_side say (a text too long is a 400
    naming its field). With a cross-encoder, the classifier's score of each pair encoded together
    (each pair's input cut so)."""
    labels = serving.classifier_labels
    if labels:
        try:
            pairs = cross_encoder_inputs(serving.tokenizer, labels, queries, documents,
                                         token_types=serving.engine.loaded.config.type_vocab_size > 1)
        except ValueError as e:
            raise bad_request(str(e), "model") from None
        rows, tokens = await embed(serving, f"{engine_id}-pair", pairs, PoolingParams(task="classify"),
                                   truncate_prompt_tokens=req.truncate_prompt_tokens,
                                   truncation_side=req.truncation_side, priority=req.priority, field=query_field,
                                   lora_request=lora_request)
        return [row[0] for row in rows], tokens
    params = PoolingParams(normalize=True)
    distinct = {query_field: list(dict.fromkeys(queries)), "documents": list(dict.fromkeys(documents))}
    done = await asyncio.gather(*(embed(serving, f"{engine_id}-{field}", texts, params,
                                        truncate_prompt_tokens=req.truncate_prompt_tokens,
                                        truncation_side=req.truncation_side, priority=req.priority, field=field,
                                        lora_request=lora_request)
                                  for field, texts in distinct.items()))
    at = {(field, text): v
          for (field, texts), (vectors, _) in zip(distinct.items(), done) for text, v in zip(texts, vectors)}
    scores = cosine_scores([at[query_field, q] for q in queries], [at["documents", d] for d in documents])
    return scores, sum(n for _, n in done)


async def create_score(serving: Serving, request: web.Request, req: ScoreRequest) -> web.Response:
    model, lora = serving.resolve_model(req.model)
    queries, documents = req.pairs()
    response_id, engine_id = serving.new_ids("score-", request, req.request_id)
    scores, tokens = await _similarities(serving, engine_id, queries, documents, req=req, query_field="queries",
                                         lora_request=lora)
    return web.json_response({"id": response_id, "object": "list", "created": now(), "model": model,
                              "data": [{"index": i, "object": "score", "score": s} for i, s in enumerate(scores)],
                              "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})


async def create_rerank(serving: Serving, request: web.Request, req: RerankRequest) -> web.Response:
    model, lora = serving.resolve_model(req.model)
    response_id, engine_id = serving.new_ids("rerank-", request, req.request_id)
    scores, tokens = await _similarities(serving, engine_id, [req.query] * len(req.documents), req.documents,
                                         req=req, query_field="query", lora_request=lora)
    order = sorted(range(len(scores)), key=lambda i: -scores[i])[:req.top_n or None]
    results = [{"index": i, "relevance_score": scores[i], **({"document": {"text": req.documents[i]}}
                                                             if req.return_documents else {})} for i in order]
    return web.json_response({"id": response_id, "model": model, "results": results,
                              "usage": {"total_tokens": tokens}})
