"""The logprobs of given tokens under raw logits: prompt logprobs (each prompt position scores the
next prompt token) and echo with logprobs.

    out = token_logprobs(logits, token_ids, num_top)  # logits float32 [n, vocab], token_ids [n]
    out.logprobs[i]      log_softmax(logits[i])[token_ids[i]]
    out.ranks[i]         1 + the tokens whose logit is larger (1 = the most likely)
    out.top_token_ids    [n, num_top]: the most likely tokens, descending, ties to the lower id
    out.top_logprobs     [n, num_top]: their logprobs

On the CPU one kernel (token_logprobs.h) runs each row in three passes over it — the
sampler's own arithmetic, so a prompt token's logprob and rank are the ones the sampler gives the
same token when it samples it — with no [n, vocab] temporaries: over 2048 rows of a 49,152-token
vocabulary 44 ms, where torch's log_softmax, comparison and top-k took ~480 ms (Intel Xeon VM, 2
threads). On other devices: torch's ops, as before."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from corellm.native import _core
from corellm.ops._checks import check, check_shape


@dataclass
class TokenLogprobs:
    logprobs: torch.Tensor  # float32 [n]
    ranks: torch.Tensor  # int32 [n]
    top_token_ids: torch.Tensor  # int32 [n, num_top]
    top_logprobs: torch.Tensor  # float32 [n, num_top]


def token_logprobs(logits: torch.Tensor, token_ids: torch.Tensor, num_top: int) -> TokenLogprobs:
    """logits float32 [n, vocab] (contiguous; not changed), token_ids int32 or int64 [n] on the same
    device, num_top >= 0. Raises ValueError naming what is wrong (a token id outside the
    vocabulary, num_top past it)."""
    op = "token_logprobs"
    check(op, "logits", logits, ndim=2, dtype=torch.float32, contiguous=True)
    n, vocab = logits.shape
    check(op, "token_ids", token_ids, ndim=1, dtype=(torch.int32, torch.int64), device=logits.device)
    check_shape(op, "token_ids", token_ids, (n,))
    if not 0 <= num_top <= vocab:
        raise ValueError(f"{op}: num_top must be in [0, {vocab}], got {num_top}")
    if logits.device.type != "cpu":
        return _with_torch(logits, token_ids.long(), num_top)
    ids = token_ids.to(torch.int32).contiguous()
    out = TokenLogprobs(torch.empty(n, dtype=torch.float32), torch.empty(n, dtype=torch.int32),
                        torch.empty((n, num_top), dtype=torch.int32), torch.empty((n, num_top), dtype=torch.float32))
    _core.kernels.token_logprobs(logits=logits.data_ptr(), num_rows=n, vocab_size=vocab, token_ids=ids.data_ptr(),
                                 num_top=num_top, logprobs=out.logprobs.data_ptr(), ranks=out.ranks.data_ptr(),
                                 top_ids=out.top_token_ids.data_ptr(), top_logprobs=out.top_logprobs.data_ptr())
    return out


def _with_torch(logits: torch.Tensor, token_ids: torch.Tensor, num_top: int) -> TokenLogprobs:
    vocab = logits.shape[1]
    if token_ids.numel() and (int(token_ids.min()) < 0 or int(token_ids.max()) >= vocab):
        raise ValueError(f"token_logprobs: a token id is outside the vocabulary [0, {vocab})")
    lp = torch.log_softmax(logits, dim=-1)
    chosen = lp.gather(1, token_ids[:, None])[:, 0]
    ranks = ((lp > chosen[:, None]).sum(-1) + 1).to(torch.int32)
    top = torch.topk(lp, num_top, dim=-1)
    return TokenLogprobs(chosen, ranks, top.indices.to(torch.int32), top.values)
