"""POST /v1/completions: text completion, streamed (SSE) or whole. With echo (as vLLM and OpenAI's
older models), each choice's text starts with its prompt's, and with logprobs its logprobs start
with the prompt's tokens (the first without a logprob), scored with the same number of top tokens:
what lm-evaluation-harness's loglikelihood asks of a completions server (echo, logprobs 1,
max_tokens 1). max_tokens 0 is allowed with echo alone, as OpenAI's older models: the prompt scored,
nothing generated (the engine samples its one token; the response leaves it out)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses

from aiohttp import web

from corellm.outputs import RequestOutput
from corellm.server.errors import bad_request
from corellm.server.logprobs import TokenLabels, completion_logprobs, echo_logprobs, prompt_logprobs
from corellm.server.protocol import CompletionRequest
from corellm.server.serving import Serving, now, send_event, usage


def prompts_of(req: CompletionRequest, serving: Serving) -> list[tuple[list[int], str | None]]:
    """Each prompt's token ids and its text (None when given as ids, or cut by truncate_prompt_tokens)."""
    p = req.prompt
    encode = lambda text: serving.tokenizer.encode(text, add_special_tokens=req.add_special_tokens)  # noqa: E731
    if isinstance(p, str):
        prompts = [(encode(p), p)]
    elif not p:
        raise bad_request("prompt must not be empty", "prompt")
    elif isinstance(p[0], str):
        prompts = [(encode(s), s) for s in p]
    elif isinstance(p[0], int):
        prompts = [(list(p), None)]
    else:
        prompts = [(list(ids), None) for ids in p]
    result = []
    for ids, text in prompts:
        kept = serving.truncate_prompt(ids, req.truncate_prompt_tokens, req.truncation_side)
        result.append((kept, text if len(kept) == len(ids) else None))  # a cut prompt's text is not the client's
    return result


async def create_completion(serving: Serving, request: web.Request, req: CompletionRequest) -> web.StreamResponse:
    model, lora = serving.resolve_model(req.model)
    if req.suffix:
        raise bad_request("suffix is not supported by corellm", "suffix", "unsupported_field")
    scoring_only = req.max_tokens == 0
    if scoring_only and not req.echo:
        raise bad_request("max_tokens must be at least 1 (0 only with echo: the prompt scored alone)", "max_tokens")
    max_tokens = 1 if scoring_only else req.max_tokens
    beam = req.beam_search_params(max_tokens)
    response_id, request_id = serving.new_ids("cmpl-", request, req.request_id)
    if beam is not None:
        searches = [asyncio.ensure_future(serving.beam_search(
            f"{request_id}-{i}", ids, text, beam, max_tokens, cache_salt=req.cache_salt, priority=req.priority,
            skip_special_tokens=req.skip_special_tokens, lora_request=lora)) for i, (ids, text) in enumerate(prompts_of(req, serving))]
        try:
            outputs = list(await asyncio.gather(*searches))
        finally:
            for search in searches:  # one failed: the others stop too
                search.cancel()
        return web.json_response(_response(response_id, model, outputs, beam.beam_width, serving, req, False))
    params = req.sampling_params(serving.defaults(), max_tokens, req.logprobs)
    if req.echo and req.logprob_token_ids is not None:
        raise bad_request("logprob_token_ids scores the generated tokens: with echo the prompt's are scored by the "
                          "top logprobs; leave one of the two out", "logprob_token_ids")
    if req.echo and req.logprobs is not None:
        if req.stream:
            raise bad_request("echo with logprobs is not available when stream is true (the prompt's logprobs "
                              "come with the whole response)", "echo")
        if req.prompt_logprobs is not None and req.prompt_logprobs != req.logprobs:
            raise bad_request(f"with echo, the prompt is scored with logprobs={req.logprobs} top tokens; "
                              f"prompt_logprobs={req.prompt_logprobs} differs", "prompt_logprobs")
        params = dataclasses.replace(params, prompt_logprobs=req.logprobs)
    structured_field = req.structured_output()[1]
    await serving.check_constraint(params, structured_field)
    processed = [serving.prepare(f"{request_id}-{i}", ids, text, params, max_tokens,
                                 cache_salt=req.cache_salt, priority=req.priority, structured_field=structured_field,
                                 lora_request=lora)
                 for i, (ids, text) in enumerate(prompts_of(req, serving))]
    n = params.n
    if not req.stream:
        outputs = await serving.run_all(processed, structured_field)
        return web.json_response(_response(response_id, model, outputs, n, serving, req, scoring_only))

    resp, outputs = await serving.start_stream(request, processed, structured_field)
    created = now()
    labels = TokenLabels(serving.tokenizer, req.return_tokens_as_token_ids)
    completion_tokens = [0] * (len(processed) * n)
    prompt_texts = [_prompt_text(p.prompt_token_ids, p.prompt, serving) if req.echo else "" for p in processed]
    echo_pending = [text for text in prompt_texts for _ in range(n)]  # each choice's, until its first chunk carries it
    cached_tokens = [0] * len(processed)
    started: set[int] = set()  # the choices that have sent a chunk
    prompt_tokens = sum(len(p.prompt_token_ids) for p in processed)
    continuous_usage = (req.stream_options is not None and req.stream_options.include_usage
                        and req.stream_options.continuous_usage_stats)
    async with serving.sse_body(resp, processed):
        async with contextlib.aclosing(outputs):  # closed at once on a disconnect
            async for i, out in outputs:
                cached_tokens[i] = out.num_cached_tokens
                for c in out.outputs:
                    index = i * n + c.index
                    if scoring_only:  # the sampled token is not part of the answer
                        c = dataclasses.replace(c, text="", token_ids=[], logprobs=[] if c.logprobs is not None else None)
                    completion_tokens[index] += len(c.token_ids)
                    if not c.text and not c.token_ids and c.finish_reason is None and not echo_pending[index]:
                        continue
                    first = index not in started
                    started.add(index)
                    text, echo_pending[index] = echo_pending[index] + c.text, ""
                    choice = {"index": index, "text": text, "finish_reason": c.finish_reason,
                              "logprobs": completion_logprobs(c, labels) if req.logprobs is not None else None}
                    if req.return_token_ids:  # the prompt's with each choice's first chunk, then the deltas'
                        choice |= {"prompt_token_ids": processed[i].prompt_token_ids if first else None,
                                   "token_ids": list(c.token_ids)}
                    if c.finish_reason is not None:
                        choice["stop_reason"] = c.stop_reason
                    event = {"id": response_id, "object": "text_completion", "created": created, "model": model,
                             "choices": [choice]}
                    if continuous_usage:
                        event["usage"] = usage(prompt_tokens, sum(completion_tokens), sum(cached_tokens))
                    await send_event(resp, event)
        if req.stream_options and req.stream_options.include_usage:
            await send_event(resp, {"id": response_id, "object": "text_completion", "created": created, "model": model,
                                    "choices": [], "usage": usage(prompt_tokens, sum(completion_tokens),
                                                                  sum(cached_tokens))})
    return resp


def _response(request_id: str, model: str, outputs: list[RequestOutput], n: int, serving: Serving,
              req: CompletionRequest, scoring_only: bool) -> dict:
    choices, prompt_tokens, completion_tokens, cached_tokens = [], 0, 0, 0
    labels = TokenLabels(serving.tokenizer, req.return_tokens_as_token_ids)
    for i, out in enumerate(outputs):
        prompt_tokens += len(out.prompt_token_ids)
        cached_tokens += out.num_cached_tokens
        echoed_text, echoed_logprobs = "", None
        if req.echo:
            echoed_text = _prompt_text(out.prompt_token_ids, out.prompt, serving)
            if req.logprobs is not None:
                echoed_logprobs = echo_logprobs(out.prompt_token_ids, out.prompt_logprobs, req.logprobs, labels)
        for c in out.outputs:
            if scoring_only:  # the sampled token is not part of the answer
                c = dataclasses.replace(c, text="", token_ids=[], logprobs=[] if c.logprobs is not None else None)
            completion_tokens += len(c.token_ids)
            choice = {"index": i * n + c.index, "text": echoed_text + c.text, "finish_reason": c.finish_reason,
                      "stop_reason": c.stop_reason,
                      "logprobs": completion_logprobs(c, labels, echoed_logprobs)}
            if req.return_token_ids:
                choice |= {"prompt_token_ids": out.prompt_token_ids, "token_ids": list(c.token_ids)}
            if out.prompt_logprobs is not None and req.prompt_logprobs is not None:
                choice["prompt_logprobs"] = prompt_logprobs(out.prompt_logprobs)
            choices.append(choice)
    return {"id": request_id, "object": "text_completion", "created": now(), "model": model, "choices": choices,
            "usage": usage(prompt_tokens, completion_tokens, cached_tokens)}


def _prompt_text(prompt_ids: list[int], prompt: str | None, serving: Serving) -> str:
    """The prompt as the client gave it, or its tokens decoded (special tokens kept: what the model read)."""
    return prompt if prompt is not None else serving.tokenizer.decode(prompt_ids, skip_special_tokens=False)
