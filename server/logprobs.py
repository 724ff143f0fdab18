"""Logprobs in the two OpenAI formats: completions (tokens / token_logprobs / top_logprobs /
text_offset) and chat (content: [{token, logprob, bytes, top_logprobs}])."""

from __future__ import annotations

from corellm.outputs import CompletionOutput, PositionLogprobs


def _token_text(tokenizer, token_id: int, cached: str | None) -> str:
    return cached if cached is not None else tokenizer.decode([token_id], skip_special_tokens=False)


def completion_logprobs(c: CompletionOutput, tokenizer, echoed: dict | None = None) -> dict | None:
    """The completion's tokens; after `echoed` (echo_logprobs: the prompt's), offsets continuing."""
    if c.logprobs is None:
        return None
    tokens, token_logprobs, top, offsets = [], [], [], []
    if echoed is not None:
        tokens, token_logprobs, top, offsets = (list(echoed[k]) for k in LEGACY_KEYS)
    offset = offsets[-1] + len(tokens[-1]) if tokens else 0
    for tid, pos in zip(c.token_ids, c.logprobs):
        chosen = pos[tid]
        text = _token_text(tokenizer, tid, chosen.decoded_token)
        tokens.append(text)
        token_logprobs.append(chosen.logprob)
        top.append({_token_text(tokenizer, t, lp.decoded_token): lp.logprob
                    for t, lp in sorted(pos.items(), key=lambda kv: -kv[1].logprob) if lp.rank is not None})
        offsets.append(offset)
        offset += len(text)
    return dict(zip(LEGACY_KEYS, (tokens, token_logprobs, top, offsets)))


LEGACY_KEYS = ("tokens", "token_logprobs", "top_logprobs", "text_offset")


def echo_logprobs(prompt_ids: list[int], positions: list[PositionLogprobs | None], top_n: int, tokenizer) -> dict:
    """The prompt's tokens in the completions format, as /v1/completions with echo gives them (vLLM,
    OpenAI's older models): the first token has no logprob (None, and None for its top), each other
    its logprob given the tokens before it and the top_n most likely there, with it."""
    tokens, token_logprobs, top, offsets = [], [], [], []
    offset = 0
    for tid, pos in zip(prompt_ids, positions):
        chosen = pos[tid] if pos is not None else None
        text = _token_text(tokenizer, tid, chosen.decoded_token if chosen is not None else None)
        tokens.append(text)
        token_logprobs.append(chosen.logprob if chosen is not None else None)
        top.append(None if pos is None else {
            _token_text(tokenizer, t, lp.decoded_token): lp.logprob
            for t, lp in sorted(pos.items(), key=lambda kv: -kv[1].logprob)
            if t == tid or (lp.rank is not None and lp.rank <= top_n)})
        offsets.append(offset)
        offset += len(text)
    return dict(zip(LEGACY_KEYS, (tokens, token_logprobs, top, offsets)))


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
