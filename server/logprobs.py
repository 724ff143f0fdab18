"""Logprobs in the two OpenAI formats: completions (tokens / token_logprobs / top_logprobs /
text_offset) and chat (content: [{token, logprob, bytes, top_logprobs}])."""

from __future__ import annotations

from corellm.outputs import CompletionOutput, PositionLogprobs


def _token_text(tokenizer, token_id: int, cached: str | None) -> str:
    return cached if cached is not None else tokenizer.decode([token_id], skip_special_tokens=False)


def completion_logprobs(c: CompletionOutput, tokenizer) -> dict | None:
    if c.logprobs is None:
        return None
    tokens, token_logprobs, top, offsets = [], [], [], []
    offset = 0
    for tid, pos in zip(c.token_ids, c.logprobs):
        chosen = pos[tid]
        text = _token_text(tokenizer, tid, chosen.decoded_token)
        tokens.append(text)
        token_logprobs.append(chosen.logprob)
        top.append({_token_text(tokenizer, t, lp.decoded_token): lp.logprob
                    for t, lp in sorted(pos.items(), key=lambda kv: -kv[1].logprob) if lp.rank is not None})
        offsets.append(offset)
        offset += len(text)
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top, "text_offset": offsets}


def chat_logprobs(c: CompletionOutput, tokenizer, top_n: int) -> dict | None:
    if c.logprobs is None:
        return None
    content = []
    for tid, pos in zip(c.token_ids, c.logprobs):
        chosen = pos[tid]
        text = _token_text(tokenizer, tid, chosen.decoded_token)
        ranked = sorted(pos.items(), key=lambda kv: -kv[1].logprob)[:top_n]
        content.append({
            "token": text, "logprob": chosen.logprob, "bytes": list(text.encode("utf-8")),
            "top_logprobs": [{"token": (t := _token_text(tokenizer, tid2, lp.decoded_token)), "logprob": lp.logprob,
                              "bytes": list(t.encode("utf-8"))} for tid2, lp in ranked],
        })
    return {"content": content}


def prompt_logprobs(positions: list[PositionLogprobs | None] | None) -> list | None:
    """vLLM's shape: per prompt position None (the first) or {token id: {logprob, rank, decoded_token}}."""
    if positions is None:
        return None
    return [None if pos is None else {str(tid): {"logprob": lp.logprob, "rank": lp.rank,
                                                 "decoded_token": lp.decoded_token} for tid, lp in pos.items()}
            for pos in positions]
