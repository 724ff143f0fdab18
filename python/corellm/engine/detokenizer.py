"""IncrementalDetokenizer: generated token ids -> text, a few tokens at a time, never emitting a
broken UTF-8 character (tokenizers' DecodeStream holds bytes back until they decode), with stop
strings matched across token boundaries and held back until they can no longer match."""

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
        # Characters that must wait: the longest stop string minus one could still be completing.
        self.hold_back = max((len(s) for s in self.stop), default=1) - 1 if not self.include_stop else 0
        self.output_text = ""
        self.stop_reason: str | None = None

    def update(self, new_token_ids: list[int]) -> str | None:
        """Appends the tokens' text; returns the stop string when one now appears in the output
        (the text is then cut at it, or just after it with include_stop_str_in_output)."""
        for token_id in new_token_ids:
            if self.stop_reason is not None:
                break
            piece = self.stream.step(self.tokenizer.backend, token_id)
            if not piece:
                continue
            start = max(0, len(self.output_text) - max((len(s) for s in self.stop), default=0) + 1)
            self.output_text += piece
            if self.stop:
                self._check_stop(start)
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
