"""IncrementalDetokenizer: generated token ids -> text, a few tokens at a time, never emitting a
broken UTF-8 character (tokenizers' DecodeStream holds bytes back until they decode), with stop
strings matched across token boundaries (once min_tokens tokens exist, as vLLM) and held back
until they can no longer match. A request the engine ends on a stop token or EOS leaves that
token's text out unless include_stop_str_in_output (vLLM's `stop_terminated`)."""

from __future__ import annotations

from tokenizers.decoders import DecodeStream

from corellm.sampling_params import SamplingParams
from corellm.tokenizer import Tokenizer

_PROMPT_CONTEXT_TOKENS = 6  # prompt tail the stream starts from (keeps a first token's leading space)


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Tokenizer, params: SamplingParams, prompt_token_ids: list[int]):
        self.tokenizer = tokenizer
        self.stream = DecodeStream(ids=list(prompt_token_ids[-_PROMPT_CONTEXT_TOKENS:]),
                                   skip_special_tokens=params.skip_special_tokens)
        self.stop = list(params.stop or [])
        self.include_stop = params.include_stop_str_in_output
        self.min_tokens = params.min_tokens
        self.num_tokens = 0  # output tokens seen (those left out of the text too)
        # Characters that must wait: the longest stop string minus one could still be completing.
        self.hold_back = max((len(s) for s in self.stop), default=1) - 1 if not self.include_stop else 0
        self.output_text = ""
        self.stop_reason: str | None = None

    def update(self, new_token_ids: list[int], stop_terminated: bool = False) -> str | None:
        """Appends the tokens' text; returns the stop string when one now appears in the output
        (the text is then cut at it, or just after it with include_stop_str_in_output). The tokens
        after the one that completed it (several arrive at once with speculative decoding) are
        not taken: num_tokens counts the output's tokens up to that one.
        stop_terminated: the engine ended the request on the last of these tokens (a stop token
        or EOS), whose text is then left out unless include_stop_str_in_output."""
        seen = self.num_tokens
        self.num_tokens += len(new_token_ids)
        if stop_terminated and not self.include_stop:
            new_token_ids = new_token_ids[:-1]
        for i, token_id in enumerate(new_token_ids):
            piece = self.stream.step(self.tokenizer.backend, token_id)
            if not piece:
                continue
            start = max(0, len(self.output_text) - max((len(s) for s in self.stop), default=0) + 1)
            self.output_text += piece
            # Stop strings count from the output's (min_tokens + 1)-th token on (vLLM's rule).
            if self.stop and seen + i + 1 > self.min_tokens:
                self._check_stop(start)
                if self.stop_reason is not None:
                    self.num_tokens = seen + i + 1
                    break
        return self.stop_reason

    def _check_stop(self, search_from: int) -> None:
        best = None
        for s in self.stop:
            i = self.output_text.find(s, search_from)
            if i >= 0 and (best is None or i < best[0]):
                best = (i, s)
        if best is not None:
            i, s = best
            self.output_text = self.output_text[: i + len(s)] if self.include_stop else self.output_text[:i]
            self.stop_reason = s

    def text(self, finished: bool) -> str:
        """The text that may be shown now: everything once finished, else all but the held-back tail."""
        if finished or self.stop_reason is not None or not self.hold_back:
            return self.output_text
        return self.output_text[: max(0, len(self.output_text) - self.hold_back)]
