"""SamplingState: each running request's sampling parameters, kept in arrays indexed by its
batch row, so that a step's SamplingMetadata is a few array gathers, not a loop over requests."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from corellm.engine_core_request import EngineCoreRequest
from corellm.ops import SamplingMetadata, TokenLists


@dataclass
class RowRequest:
    request: EngineCoreRequest
    row: int
    output_token_ids: list[int] = field(default_factory=list)  # kept only where penalties need them


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
        self.num_logprobs[row] = -1 if p.logprobs is None else p.logprobs
        self.requests[request.request_id] = RowRequest(request, row, list(output_token_ids))

    def remove(self, req_id: str) -> None:
        self.requests.pop(req_id, None)

    def metadata(self, req_ids: list[str], rows: np.ndarray) -> SamplingMetadata:
        """Parameters of this step's requests, in the given (scheduler) order."""
        rows = rows.astype(np.int64)
        t = lambda a: torch.from_numpy(np.ascontiguousarray(a[rows]))  # noqa: E731
        temperature = self.temperature[rows]
        md = SamplingMetadata(temperature=torch.from_numpy(temperature), seeds=t(self.seeds), steps=t(self.steps))
        if (temperature > 0).any():
            if (self.top_k[rows] > 0).any():
                md.top_k = t(self.top_k)
            if (self.top_p[rows] < 1).any():
                md.top_p = t(self.top_p)
            if (self.min_p[rows] > 0).any():
                md.min_p = t(self.min_p)
        reqs = [self.requests[r] for r in req_ids]
        pres, freq, rep = self.presence[rows], self.frequency[rows], self.repetition[rows]
        if (pres != 0).any() or (freq != 0).any() or (rep != 1).any():
            md.presence_penalty, md.frequency_penalty = torch.from_numpy(pres), torch.from_numpy(freq)
            md.repetition_penalty = torch.from_numpy(rep)
            md.output_token_ids = TokenLists.from_lists([r.output_token_ids for r in reqs])
            md.prompt_token_ids = TokenLists.from_lists(
                [r.request.prompt_token_ids if r.request.sampling_params.repetition_penalty != 1 else [] for r in reqs])
        if any(r.request.sampling_params.logit_bias for r in reqs):
            biases = [r.request.sampling_params.logit_bias or {} for r in reqs]
            md.logit_bias = TokenLists.from_lists([list(b) for b in biases], [list(b.values()) for b in biases])
        steps, min_tokens = self.steps[rows], self.min_tokens[rows]
        if (steps < min_tokens).any():
            banned = []
            for r, s, m in zip(reqs, steps, min_tokens):
                ids = []
                if s < m:
                    ids = list(r.request.stop_token_ids)
                    if r.request.eos_token_id is not None:
                        ids.append(r.request.eos_token_id)
                banned.append(ids)
            md.banned_token_ids = TokenLists.from_lists(banned)
        md.num_logprobs = int(self.num_logprobs[rows].max()) if len(rows) else -1
        return md

    def record(self, req_ids: list[str], rows: np.ndarray, sampled: np.ndarray, samples: np.ndarray) -> None:
        """Counts the tokens sampled this step (and keeps them where penalties need them)."""
        kept = rows[samples].astype(np.int64)
        self.steps[kept] += 1
        for req_id, token, keep in zip(req_ids, sampled.tolist(), samples.tolist()):
            if keep and token >= 0:
                r = self.requests[req_id]
                p = r.request.sampling_params
                if p.presence_penalty or p.frequency_penalty or p.repetition_penalty != 1:
                    r.output_token_ids.append(token)
