"""Beam search, as vLLM runs it: on top of the engine, one token of every beam per round.

The algorithm, for one prompt and a beam width w:

  beams = [the prompt]; completed = []
  for each of max_tokens rounds (while beams are left):
      each beam is extended by one token: a request of its tokens, max_tokens 1, with the top 2w
        logprobs of the next position (the prefix cache keeps the cost at about one decode step);
      every (beam, token) among those top 2w: a candidate, its cumulative logprob the beam's plus
        the token's; one ending in EOS goes to completed (unless ignore_eos), the others compete;
      beams = the w best candidates by score.
  the answer: the w best of completed + beams by score, where score = cumulative logprob /
  (length ** length_penalty), the length counting the prompt and not a final EOS.

The w best candidates over all beams are among each beam's top w tokens, so 2w per beam is more
than enough (half of them may be EOS). The logprobs are the model's raw distribution; a
temperature only changes the token each step request samples besides its top 2w (it is one more
candidate). LLM.beam_search and the server's use_beam_search drive a BeamSearch each: prompts()
gives a round's requests, advance() takes their outputs."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from corellm.outputs import Logprob, RequestOutput
from corellm.sampling_params import SamplingParams


@dataclass
class BeamSearchParams:
    beam_width: int
    max_tokens: int
    ignore_eos: bool = False
    temperature: float = 0.0
    length_penalty: float = 1.0
    include_stop_str_in_output: bool = False  # the server's texts keep a final EOS token's text

    def __post_init__(self) -> None:
        for name in ("beam_width", "max_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}.")
        if not isinstance(self.temperature, (int, float)) or not 0 <= self.temperature < math.inf:
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature!r}.")
        if not isinstance(self.length_penalty, (int, float)) or not math.isfinite(self.length_penalty):
            raise ValueError(f"length_penalty must be a finite number, got {self.length_penalty!r}.")

    def step_params(self) -> SamplingParams:
        """What each round's one-token request asks of the engine."""
        return SamplingParams(max_tokens=1, temperature=self.temperature, logprobs=2 * self.beam_width,
                              ignore_eos=True, skip_special_tokens=False)


@dataclass
class BeamSearchSequence:
    tokens: list[int]  # the prompt's, then the generated ones
    logprobs: list[dict[int, Logprob]] = field(default_factory=list)  # per generated token: its position's top 2w
    cum_logprob: float = 0.0
    text: str | None = None  # filled when the search ends
    finish_reason: str | None = None  # "stop" (EOS) or "length"
    stop_reason: int | None = None  # the EOS token that ended it


@dataclass
class BeamSearchOutput:
    sequences: list[BeamSearchSequence]  # best first


def beam_score(beam: BeamSearchSequence, eos_token_id: int | None, length_penalty: float) -> float:
    length = len(beam.tokens) - (1 if beam.tokens and beam.tokens[-1] == eos_token_id else 0)
    return beam.cum_logprob / (length ** length_penalty)


class BeamSearch:
    """One prompt's search: a beam gets max_tokens tokens, or fewer where the context
    (max_model_len) ends first."""

    def __init__(self, prompt_token_ids: list[int], params: BeamSearchParams, eos_token_id: int | None,
                 max_model_len: int):
        self.params, self.eos_token_id = params, eos_token_id
        self.prompt_len = len(prompt_token_ids)
        self.beams = [BeamSearchSequence(list(prompt_token_ids))]
        self.completed: list[BeamSearchSequence] = []
        self.rounds_left = min(params.max_tokens, max_model_len - self.prompt_len)

    def prompts(self) -> list[list[int]]:
        """This round's requests: each beam's tokens (none once the search is over)."""
        return [b.tokens for b in self.beams] if self.rounds_left > 0 else []

    def advance(self, outputs: list[RequestOutput]) -> None:
        """The round's outputs, one per beam of prompts(), in order."""
        if len(outputs) != len(self.beams):
            raise ValueError(f"beam search: {len(outputs)} outputs for {len(self.beams)} beams")
        candidates = []
        for beam, out in zip(self.beams, outputs):
            position = out.outputs[0].logprobs[0]
            for token, lp in position.items():
                grown = BeamSearchSequence(beam.tokens + [token], beam.logprobs + [position],
                                           beam.cum_logprob + lp.logprob)
                if token == self.eos_token_id and not self.params.ignore_eos:
                    grown.finish_reason, grown.stop_reason = "stop", token
                    self.completed.append(grown)
                else:
                    candidates.append(grown)
        self.beams = sorted(candidates, key=self._score, reverse=True)[:self.params.beam_width]
        self.rounds_left = self.rounds_left - 1 if self.beams else 0

    def best(self) -> list[BeamSearchSequence]:
        """The answer once prompts() is empty: the beam_width best sequences, best first."""
        for beam in self.beams:
            beam.finish_reason = "length"
        return sorted(self.completed + self.beams, key=self._score, reverse=True)[:self.params.beam_width]

    def generated_text_tokens(self, beam: BeamSearchSequence) -> list[int]:
        """A sequence's generated tokens as its text shows them: a final EOS left out unless
        include_stop_str_in_output."""
        tokens = beam.tokens[self.prompt_len:]
        if beam.finish_reason == "stop" and not self.params.include_stop_str_in_output:
            tokens = tokens[:-1]
        return tokens

    def _score(self, beam: BeamSearchSequence) -> float:
        return beam_score(beam, self.eos_token_id, self.params.length_penalty)
