"""The sampler op: logits processing and sampling of one token per request, plus logprobs.

Per request, in order: tokens its grammar's bitmask does not allow (structured output) and
banned tokens (e.g. EOS before min_tokens) -> -inf; logit_bias added;
repetition, frequency and presence penalties; temperature 0 -> argmax; otherwise logits / T,
kept set = min_p and top_k filters, then top_p over the kept mass, and one draw from the
request's Philox stream (seed, step) — so a seeded request samples the same tokens whatever
batch it is in. Logprobs (when asked) describe the raw logits, before any processing, as vLLM's
default does.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from corellm.native import _core
from corellm.ops._backend import backend
from corellm.ops._checks import check, check_shape


@dataclass
class TokenLists:
    """Variable-length per-request token lists in CSR form (values optional: logit_bias)."""

    offsets: torch.Tensor  # int32 [num_reqs + 1]
    ids: torch.Tensor  # int32 [total]
    values: torch.Tensor | None = None  # float32 [total]

    @classmethod
    def from_lists(cls, lists: list[list[int]], values: list[list[float]] | None = None) -> "TokenLists":
        offsets = [0]
        for lst in lists:
            offsets.append(offsets[-1] + len(lst))
        flat = [t for lst in lists for t in lst]
        vals = None
        if values is not None:
            vals = torch.tensor([v for lst in values for v in lst], dtype=torch.float32)
        return cls(torch.tensor(offsets, dtype=torch.int32), torch.tensor(flat, dtype=torch.int32), vals)

    def to(self, device: torch.device) -> "TokenLists":
        return TokenLists(*(None if t is None else t.to(device, non_blocking=True)
                            for t in (self.offsets, self.ids, self.values)))


@dataclass
class SamplingMetadata:
    """One step's sampling parameters, one entry per request (row of the logits)."""

    temperature: torch.Tensor  # float32 [n]; 0 = greedy
    seeds: torch.Tensor  # int64 [n] (the stream key, read as uint64)
    steps: torch.Tensor  # int64 [n] (the counter: the request's output position)
    top_k: torch.Tensor | None = None  # int32 [n]; <= 0 = off
    top_p: torch.Tensor | None = None  # float32 [n]; 1 = off
    min_p: torch.Tensor | None = None  # float32 [n]; 0 = off
    presence_penalty: torch.Tensor | None = None  # float32 [n]
    frequency_penalty: torch.Tensor | None = None  # float32 [n]
    repetition_penalty: torch.Tensor | None = None  # float32 [n]
    output_token_ids: TokenLists | None = None  # needed by any penalty
    prompt_token_ids: TokenLists | None = None  # needed by repetition_penalty
    logit_bias: TokenLists | None = None  # with values
    banned_token_ids: TokenLists | None = None
    # Structured output: int32 [num_constrained, ceil(vocab / 32)] packed bitmasks of the allowed
    # tokens (bit t % 32 of word t / 32), and per request its row there or -1 (int32 [n]).
    allowed_token_bitmask: torch.Tensor | None = None
    bitmask_rows: torch.Tensor | None = None
    num_logprobs: int = -1  # -1: no logprobs; 0: the sampled token's only; k: also the top k

    def to(self, device: torch.device) -> "SamplingMetadata":
        """A copy with every tensor on `device` (the logits' device: the sampler runs there)."""
        moved = {}
        for f in fields(self):
            v = getattr(self, f.name)
            moved[f.name] = v.to(device, non_blocking=True) if isinstance(v, (torch.Tensor, TokenLists)) else v
        return SamplingMetadata(**moved)


@dataclass
class SamplerOutput:
    sampled_token_ids: torch.Tensor  # int32 [n]; -1 where the row's logits held a NaN
    logprobs: torch.Tensor | None = None  # float32 [n]: the sampled token's raw logprob
    ranks: torch.Tensor | None = None  # int32 [n]: its rank in the raw distribution (1 = top)
    top_token_ids: torch.Tensor | None = None  # int32 [n, num_logprobs]
    top_logprobs: torch.Tensor | None = None  # float32 [n, num_logprobs]


def sample(logits: torch.Tensor, md: SamplingMetadata) -> SamplerOutput:
    """logits: float32 [num_reqs, vocab_size], contiguous; overwritten with processed values. On
    CUDA every metadata tensor is on the logits' device too, and so are the outputs."""
    op = "sample"
    check(op, "logits", logits, ndim=2, dtype=torch.float32, contiguous=True)
    be = backend(op, logits)
    n, vocab = logits.shape
    dev = logits.device

    def vec(name: str, t: torch.Tensor | None, dtype: torch.dtype, required: bool = False) -> None:
        if t is None:
            if required:
                raise ValueError(f"{op}: {name} is required")
            return
        # Fast path first (this runs every step); the full checks explain a mismatch.
        if not (isinstance(t, torch.Tensor) and t.dtype == dtype and t.dim() == 1 and t.shape[0] == n
                and t.device == dev and t.is_contiguous()):
            check(op, name, t, ndim=1, dtype=dtype, device=dev, contiguous=True)
            check_shape(op, name, t, (n,))

    vec("temperature", md.temperature, torch.float32, required=True)
    vec("seeds", md.seeds, torch.int64, required=True)
    vec("steps", md.steps, torch.int64, required=True)
    vec("top_k", md.top_k, torch.int32)
    vec("top_p", md.top_p, torch.float32)
    vec("min_p", md.min_p, torch.float32)
    for name in ("presence_penalty", "frequency_penalty", "repetition_penalty"):
        vec(name, getattr(md, name), torch.float32)

    def lists(name: str, tl: TokenLists | None, needed: bool) -> TokenLists | None:
        if tl is None:
            if needed:
                raise ValueError(f"{op}: {name} is required by the penalties in this batch")
            return None
        check(op, f"{name}.offsets", tl.offsets, ndim=1, dtype=torch.int32, device=dev, contiguous=True)
        check_shape(op, f"{name}.offsets", tl.offsets, (n + 1,))
        check(op, f"{name}.ids", tl.ids, ndim=1, dtype=torch.int32, device=dev, contiguous=True)
        if n and (int(tl.offsets[0]) != 0 or int(tl.offsets[-1]) != tl.ids.shape[0]):
            raise ValueError(f"{op}: {name}.offsets must start at 0 and end at len(ids) = {tl.ids.shape[0]}")
        if tl.values is not None:
            check(op, f"{name}.values", tl.values, ndim=1, dtype=torch.float32, device=dev, contiguous=True)
            check_shape(op, f"{name}.values", tl.values, (tl.ids.shape[0],))
        return tl

    any_penalty = any(getattr(md, p) is not None for p in ("presence_penalty", "frequency_penalty",
                                                            "repetition_penalty"))
    outputs = lists("output_token_ids", md.output_token_ids, any_penalty)
    prompts = lists("prompt_token_ids", md.prompt_token_ids, md.repetition_penalty is not None)
    bias = lists("logit_bias", md.logit_bias, False)
    if bias is not None and bias.values is None:
        raise ValueError(f"{op}: logit_bias needs values")
    banned = lists("banned_token_ids", md.banned_token_ids, False)
    if (md.allowed_token_bitmask is None) != (md.bitmask_rows is None):
        raise ValueError(f"{op}: allowed_token_bitmask and bitmask_rows go together")
    if md.allowed_token_bitmask is not None:
        vec("bitmask_rows", md.bitmask_rows, torch.int32)
        check(op, "allowed_token_bitmask", md.allowed_token_bitmask, ndim=2, dtype=torch.int32, device=dev,
              contiguous=True)
        if n and dev.type == "cpu" and int(md.bitmask_rows.max()) >= md.allowed_token_bitmask.shape[0]:
            raise ValueError(f"{op}: bitmask_rows points past the {md.allowed_token_bitmask.shape[0]} bitmask rows")

    sampled = torch.empty(n, dtype=torch.int32, device=dev)
    out = SamplerOutput(sampled)
    k = md.num_logprobs
    if k >= 0:
        if k > vocab:
            raise ValueError(f"{op}: num_logprobs {k} exceeds the vocabulary size {vocab}")
        out.logprobs = torch.empty(n, dtype=torch.float32, device=dev)
        out.ranks = torch.empty(n, dtype=torch.int32, device=dev)
        out.top_token_ids = torch.empty((n, k), dtype=torch.int32, device=dev)
        out.top_logprobs = torch.empty((n, k), dtype=torch.float32, device=dev)
    batch = _core.kernels.SamplingBatch()  # the kernel's struct, its arrays set by name (0: absent)
    batch.num_reqs, batch.vocab_size, batch.num_logprobs = n, vocab, k
    batch.logits, batch.sampled = logits.data_ptr(), sampled.data_ptr()
    for name in ("temperature", "top_k", "top_p", "min_p", "seeds", "steps", "presence_penalty",
                 "frequency_penalty", "repetition_penalty"):
        t = getattr(md, name)
        if t is not None:  # an absent array stays 0 (null), as the struct starts
            setattr(batch, name, t.data_ptr())
    for prefix, tl in (("output", outputs), ("prompt", prompts), ("bias", bias), ("banned", banned)):
        if tl is not None:
            setattr(batch, f"{prefix}_offsets", tl.offsets.data_ptr())
            setattr(batch, f"{prefix}_ids", tl.ids.data_ptr())
    if bias is not None:
        batch.bias_values = bias.values.data_ptr()
    if md.allowed_token_bitmask is not None:
        batch.bitmask, batch.bitmask_rows = md.allowed_token_bitmask.data_ptr(), md.bitmask_rows.data_ptr()
        batch.bitmask_words = md.allowed_token_bitmask.shape[1]
    if out.logprobs is not None:
        batch.sampled_logprob, batch.sampled_rank = out.logprobs.data_ptr(), out.ranks.data_ptr()
        batch.top_ids, batch.top_logprobs = out.top_token_ids.data_ptr(), out.top_logprobs.data_ptr()
    be.kernels.sample(batch, *be.extra)
    return out
