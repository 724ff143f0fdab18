"""The rejection sampler op of speculative decoding: from the token the sampler drew on each
logits row of the step, which drafts each request accepts and its new tokens (the rule, and why
it is exact: cpp/include/corellm/kernels/rejection_sampler.h)."""

from __future__ import annotations

import torch

from corellm.native import _core
from corellm.ops._backend import backend
from corellm.ops._checks import check, check_shape


def rejection_sample(target_token_ids: torch.Tensor, num_draft_tokens: torch.Tensor,
                     draft_token_ids: torch.Tensor) -> torch.Tensor:
    """target_token_ids: int32 [sum(d_i + 1)], the sampled token of each logits row (request i's
    d_i + 1 rows after those of the requests before it); num_draft_tokens: int32 [num_reqs];
    draft_token_ids: int32 [sum(d_i)]. Returns int32 [num_reqs, 1 + max d_i]: each request's new
    tokens (its accepted drafts, then the token drawn after them), -1 after the last. Runs on the
    tensors' device."""
    op = "rejection_sample"
    for name, t in (("target_token_ids", target_token_ids), ("num_draft_tokens", num_draft_tokens),
                    ("draft_token_ids", draft_token_ids)):
        check(op, name, t, ndim=1, dtype=torch.int32, device=target_token_ids.device, contiguous=True)
    num_reqs = num_draft_tokens.shape[0]
    if target_token_ids.device.type == "cpu":  # on CUDA the runner's own arrays, not read back to check
        total = int(num_draft_tokens.sum()) if num_reqs else 0
        if num_reqs and int(num_draft_tokens.min()) < 0:
            raise ValueError(f"{op}: num_draft_tokens must be >= 0")
        check_shape(op, "draft_token_ids", draft_token_ids, (total,))
        check_shape(op, "target_token_ids", target_token_ids, (total + num_reqs,))
    width = 1 + (int(num_draft_tokens.max()) if num_reqs else 0)
    out = torch.empty((num_reqs, width), dtype=torch.int32, device=target_token_ids.device)
    batch = _core.kernels.RejectionBatch()  # the kernel's struct, its arrays by name
    batch.num_reqs, batch.width = num_reqs, width
    batch.num_draft_tokens, batch.draft_token_ids = num_draft_tokens.data_ptr(), draft_token_ids.data_ptr()
    batch.target_token_ids, batch.output_token_ids = target_token_ids.data_ptr(), out.data_ptr()
    be = backend(op, torch.empty(0, dtype=torch.float32, device=target_token_ids.device))
    be.kernels.rejection_sample(batch, *be.extra)
    return out
