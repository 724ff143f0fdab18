"""SamplingState: each running request's sampling parameters, kept in arrays indexed by its
batch row, so that a step's SamplingMetadata is a few array gathers, not a loop over requests."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from corellm.engine_core_request import EngineCoreRequest
from corellm.ops import SamplingMetadata, TokenLists
from corellm.worker.token_bitmasks import TokenBitmask, bitmask_row


@dataclass
class RowRequest:
    request: EngineCoreRequest
    row: int
    output_token_ids: list[int] = field(default_factory=list)  # kept only where penalties or bad_words need them
    allowed_bitmask: np.ndarray | None = None  # its allowed_token_ids as a bitmask row, made at first use


def banned_by_bad_words(sequences: list[list[int]], output: list[int]) -> list[int]:
    """The tokens bad words ban as the next one after `output` (vLLM's rule): a sequence's last
    token, where the output ends with all its tokens before that one (always, for one token)."""
    banned = []
    for words in sequences:
        before = len(words) - 1
        if before == 0 or (len(output) >= before and output[len(output) - before:] == words[:-1]):
            banned.append(words[-1])
    return banned


class SamplingState:
    def __init__(self, max_rows: int):
        self.temperature = np.zeros(max_rows, np.float32)
        self.top_k = np.zeros(max_rows, np.int32)
        self.top_p = np.ones(max_rows, np.float32)
        self.min_p = np.zeros(max_rows, np.float32)
        self.presence = np.zeros(max_rows, np.float32)
        self.frequency = np.zeros(max_rows, np.float32)
        self.repetition = np.ones(max_rows, np.float32)
        self.seeds = np.zeros(max_rows, np.int64)
        self.steps = np.zeros(max_rows, np.int64)  # outputs generated so far = counter of the stream
        self.min_tokens = np.zeros(max_rows, np.int64)
        self.num_logprobs = np.full(max_rows, -1, np.int64)
        self.requests: dict[str, RowRequest] = {}
        self.with_allowed_token_ids: set[str] = set()  # so that steps without any pay nothing
        self.with_bad_words: set[str] = set()  # the same
        # Requests that ask for more than a temperature (and seed): top-k/p, min-p, a penalty,
        # logit_bias, min_tokens, bad words or logprobs. While none runs, metadata() and record()
        # take their short ways: after a decode step's forward has streamed the weights through
        # the caches, each numpy call of the full ways costs several microseconds, and on one
        # request decoding they were ~1.5 % of the step (AMD EPYC Zen 4, SmolLM2-135M BF16).
        self.with_extras: set[str] = set()
        self.with_prompt_logprobs: set[str] = set()  # the runner scores prompts only while one runs
        self.with_logprob_token_ids: set[str] = set()  # the runner scores given tokens only while one runs

    def add(self, request: EngineCoreRequest, row: int, output_token_ids: list[int]) -> None:
        p = request.sampling_params
        self.temperature[row] = 0.0 if p.greedy else p.temperature
        self.top_k[row] = p.top_k
        self.top_p[row] = p.top_p
        self.min_p[row] = p.min_p
        self.presence[row] = p.presence_penalty
        self.frequency[row] = p.frequency_penalty
        self.repetition[row] = p.repetition_penalty
        self.seeds[row] = np.int64(np.uint64(request.seed).view(np.int64))
        self.steps[row] = len(output_token_ids)
        self.min_tokens[row] = p.min_tokens
        # The sampler scores the chosen token (and the top n); logprob_token_ids' tokens are the runner's.
        self.num_logprobs[row] = p.logprobs if p.logprobs is not None else 0 if p.logprob_token_ids else -1
        self.requests[request.request_id] = RowRequest(request, row, list(output_token_ids))
        if p.allowed_token_ids is not None:
            self.with_allowed_token_ids.add(request.request_id)
        if request.bad_words_token_ids:
            self.with_bad_words.add(request.request_id)
        if (p.top_k > 0 or p.top_p < 1 or p.min_p > 0 or p.presence_penalty or p.frequency_penalty
                or p.repetition_penalty != 1 or p.logit_bias or p.min_tokens > 0 or request.bad_words_token_ids
                or p.wants_logprobs):
            self.with_extras.add(request.request_id)
        if p.logprob_token_ids:
            self.with_logprob_token_ids.add(request.request_id)
        if p.prompt_logprobs is not None:
            self.with_prompt_logprobs.add(request.request_id)

    def remove(self, req_id: str) -> None:
        self.requests.pop(req_id, None)
        self.with_allowed_token_ids.discard(req_id)
        self.with_bad_words.discard(req_id)
        self.with_extras.discard(req_id)
        self.with_prompt_logprobs.discard(req_id)
        self.with_logprob_token_ids.discard(req_id)

    def allowed_token_bitmask(self, req_ids: list[str], vocab_size: int) -> TokenBitmask | None:
        """The step's requests' allowed_token_ids as bitmask rows (token_bitmasks.py); None when no
        request of the step has them. Each request's row is made once."""
        if not self.with_allowed_token_ids:
            return None
        asked = [i for i, r in enumerate(req_ids) if r in self.with_allowed_token_ids]
        if not asked:
            return None
        words = (vocab_size + 31) // 32
        rows = np.full(len(req_ids), -1, dtype=np.int32)
        bitmasks = []
        for k, i in enumerate(asked):
            r = self.requests[req_ids[i]]
            if r.allowed_bitmask is None or len(r.allowed_bitmask) != words:
                r.allowed_bitmask = bitmask_row(r.request.sampling_params.allowed_token_ids, words)
            bitmasks.append(r.allowed_bitmask)
            rows[i] = k
        return np.stack(bitmasks), rows

    def metadata(self, req_ids: list[str], rows: np.ndarray, num_draft_tokens: np.ndarray | None = None,
                 draft_token_ids: np.ndarray | None = None) -> SamplingMetadata:
        """Parameters of this step's logits rows, in the given (scheduler) order: one row per
        request, or, for a request verifying d draft tokens (speculative decoding), d + 1 rows, row
        j sampled as the request's output position steps + j with the drafts before it counted
        as outputs (penalties, min_tokens, bad_words): exactly what decoding them one by one would use."""
        if not self.with_extras and (num_draft_tokens is None or not num_draft_tokens.any()):
            # One row per request, each sampled from its temperature alone: what the full way below
            # gives then (no top-k/p, min-p, penalties, bias, bans; num_logprobs -1).
            return SamplingMetadata(temperature=torch.from_numpy(self.temperature[rows]),
                                    seeds=torch.from_numpy(self.seeds[rows]), steps=torch.from_numpy(self.steps[rows]))
        rows = rows.astype(np.int64)
        row_reqs = None  # per logits row, its request's index in req_ids (None: one row each)
        if num_draft_tokens is not None and num_draft_tokens.any():
            per_req = num_draft_tokens.astype(np.int64) + 1
            starts = np.cumsum(per_req) - per_req
            offsets = np.arange(int(per_req.sum())) - np.repeat(starts, per_req)
            row_reqs = np.repeat(np.arange(len(per_req)), per_req)
            rows = rows[row_reqs]
        else:
            offsets = np.zeros(len(rows), np.int64)

        def drafts_before() -> list[list[int]]:  # per logits row: the drafts it follows
            flat = draft_token_ids.tolist()
            draft_starts = (starts - np.arange(len(per_req))).tolist()  # drafts of the requests before
            return [flat[ds:ds + j] for ds, k in zip(draft_starts, per_req.tolist()) for j in range(k)]

        t = lambda a: torch.from_numpy(np.ascontiguousarray(a[rows]))  # noqa: E731
        temperature = self.temperature[rows]
        steps = self.steps[rows] + offsets
        md = SamplingMetadata(temperature=torch.from_numpy(temperature), seeds=t(self.seeds),
                              steps=torch.from_numpy(steps))
        if (temperature > 0).any():
            if (self.top_k[rows] > 0).any():
                md.top_k = t(self.top_k)
            if (self.top_p[rows] < 1).any():
                md.top_p = t(self.top_p)
            if (self.min_p[rows] > 0).any():
                md.min_p = t(self.min_p)
        reqs = [self.requests[r] for r in req_ids]
        if row_reqs is not None:
            reqs = [reqs[i] for i in row_reqs.tolist()]
        pres, freq, rep = self.presence[rows], self.frequency[rows], self.repetition[rows]
        if (pres != 0).any() or (freq != 0).any() or (rep != 1).any():
            md.presence_penalty, md.frequency_penalty = torch.from_numpy(pres), torch.from_numpy(freq)
            md.repetition_penalty = torch.from_numpy(rep)
            outputs = [r.output_token_ids for r in reqs]
            if row_reqs is not None:
                outputs = [o + d for o, d in zip(outputs, drafts_before())]
            md.output_token_ids = TokenLists.from_lists(outputs)
            md.prompt_token_ids = TokenLists.from_lists(
                [r.request.prompt_token_ids if r.request.sampling_params.repetition_penalty != 1 else [] for r in reqs])
        if any(r.request.sampling_params.logit_bias for r in reqs):
            biases = [r.request.sampling_params.logit_bias or {} for r in reqs]
            md.logit_bias = TokenLists.from_lists([list(b) for b in biases], [list(b.values()) for b in biases])
        # Banned tokens, per logits row: a request's EOS and stop tokens before its min_tokens, and
        # the tokens its bad words ban after its output so far (with the drafts before the row).
        under_min = steps < self.min_tokens[rows]
        bad_words = bool(self.with_bad_words) and any(r.request.bad_words_token_ids for r in reqs)
        if under_min.any() or bad_words:
            drafts = drafts_before() if bad_words and row_reqs is not None else None
            banned = []
            for k, r in enumerate(reqs):
                ids = []
                if under_min[k]:
                    ids = list(r.request.stop_token_ids)
                    if r.request.eos_token_id is not None:
                        ids.append(r.request.eos_token_id)
                if r.request.bad_words_token_ids:
                    output = r.output_token_ids if drafts is None else r.output_token_ids + drafts[k]
                    ids += banned_by_bad_words(r.request.bad_words_token_ids, output)
                banned.append(ids)
            md.banned_token_ids = TokenLists.from_lists(banned)
        md.num_logprobs = int(self.num_logprobs[rows].max()) if len(rows) else -1
        return md

    def record(self, req_ids: list[str], rows: np.ndarray, new_tokens: np.ndarray) -> None:
        """Counts the tokens each request got this step (and keeps them where penalties need
        them). new_tokens: int32 [num_reqs, width], -1 after a row's last token."""
        if not self.with_extras and new_tokens.shape[1] == 1:  # no drafts, no tokens to keep
            self.steps[rows] += new_tokens[:, 0] >= 0  # a request's one row: rows are distinct
            return
        counts = (np.cumprod(new_tokens >= 0, axis=1)).sum(axis=1)
        np.add.at(self.steps, rows.astype(np.int64), counts)
        for req_id, row_tokens, n in zip(req_ids, new_tokens.tolist(), counts.tolist()):
            if n:
                r = self.requests[req_id]
                p = r.request.sampling_params
                if (p.presence_penalty or p.frequency_penalty or p.repetition_penalty != 1
                        or any(len(words) > 1 for words in r.request.bad_words_token_ids)):
                    r.output_token_ids.extend(row_tokens[:n])
