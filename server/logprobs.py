"""Logprobs in the two OpenAI formats: completions (tokens / token_logprobs / top_logprobs /
text_offset) and chat (content: [{token, logprob, bytes, top_logprobs}])."""

from __future__ import annotations

from corellm.outputs import CompletionOutput, PositionLogprobs


class TokenLabels:
    """How a token is named in logprobs: its text, or with as_ids (vLLM's return_tokens_as_token_ids)
    "token_id:N", which stays exact where a token is only part of a character's UTF-8 bytes."""

    def __init__(self, tokenizer, as_ids: bool = False):
        self.tokenizer, self.as_ids = tokenizer, as_ids

    def text(self, token_id: int, cached: str | None) -> str:
        if self.as_ids:
            return f"token_id:{token_id}"
        return cached if cached is not None else self.tokenizer.decode([token_id], skip_special_tokens=False)


def completion_logprobs(c: CompletionOutput, labels: TokenLabels, echoed: dict | None = None) -> dict | None:
    """The completion's tokens; after `echoed` (echo_logprobs: the prompt's), offsets continuing."""
    if c.logprobs is None:
        return None
    tokens, token_logprobs, top, offsets = [], [], [], []
    if echoed is not None:
        tokens, token_logprobs, top, offsets = (list(echoed[k]) for k in LEGACY_KEYS)
    offset = offsets[-1] + len(tokens[-1]) if tokens else 0
    for tid, pos in zip(c.token_ids, c.logprobs):
        chosen = pos[tid]
        text = labels.text(tid, chosen.decoded_token)
        tokens.append(text)
        token_logprobs.append(chosen.logprob)
        top.append({labels.text(t, lp.decoded_token): lp.logprob
                    for t, lp in sorted(pos.items(), key=lambda kv: -kv[1].logprob) if lp.rank is not None})
        offsets.append(offset)
        offset += len(text)
    return dict(zip(LEGACY_KEYS, (tokens, token_logprobs, top, offsets)))


LEGACY_KEYS = ("tokens", "token_logprobs", "top_logprobs", "text_offset")


def echo_logprobs(prompt_ids: list[int], positions: list[PositionLogprobs | None], top_n: int,
                  labels: TokenLabels) -> dict:
    """The prompt's tokens in the completions format, as /v1/completions with echo gives them (vLLM,
    OpenAI's older models): the first token has no logprob (None, and None for its top), each other
    its logprob given the tokens before it and the top_n most likely there, with it."""
    tokens, token_logprobs, top, offsets = [], [], [], []
    offset = 0
    for tid, pos in zip(prompt_ids, positions):
        chosen = pos[tid] if pos is not None else None
        text = labels.text(tid, chosen.decoded_token if chosen is not None else None)
        tokens.append(text)
        token_logprobs.append(chosen.logprob if chosen is not None else None)
        top.append(None if pos is None else {
            labels.text(t, lp.decoded_token): lp.logprob
            for t, lp in sorted(pos.items(), key=lambda kv: -kv[1].logprob)
            if t == tid or (lp.rank is not None and lp.rank <= top_n)})
        offsets.append(offset)
        offset += len(text)
    return dict(zip(LEGACY_KEYS, (tokens, token_logprobs, top, offsets)))


def chat_logprobs(c: CompletionOutput, labels: TokenLabels, top_n: int,
                  scored_ids: list[int] | None = None) -> dict | None:
    if c.logprobs is None:
        return None
    return {"content": [token_logprob(tid, pos, labels, top_n, scored_ids)
                        for tid, pos in zip(c.token_ids, c.logprobs)]}


def token_logprob(token_id: int, pos: PositionLogprobs, labels: TokenLabels, top_n: int,
                  scored_ids: list[int] | None = None) -> dict:
    """One sampled token in the chat format (the Responses API's too): {token, logprob, bytes,
    top_logprobs: the top_n most likely there, or the tokens of logprob_token_ids (`scored_ids`),
    most likely first}."""
    text = labels.text(token_id, pos[token_id].decoded_token)
    ranked = sorted(pos.items(), key=lambda kv: -kv[1].logprob)
    ranked = ranked[:top_n] if scored_ids is None else [kv for kv in ranked if kv[0] in scored_ids]
    return {"token": text, "logprob": pos[token_id].logprob, "bytes": list(text.encode("utf-8")),
            "top_logprobs": [{"token": (t := labels.text(tid, lp.decoded_token)), "logprob": lp.logprob,
                              "bytes": list(t.encode("utf-8"))} for tid, lp in ranked]}


def prompt_logprobs(positions: list[PositionLogprobs | None] | None) -> list | None:
    """vLLM's shape: per prompt position None (the first) or {token id: {logprob, rank, decoded_token}}."""
    if positions is None:
        return None
    return [None if pos is None else {str(tid): {"logprob": lp.logprob, "rank": lp.rank,
                                                 "decoded_token": lp.decoded_token} for tid, lp in pos.items()}
            for pos in positions]
