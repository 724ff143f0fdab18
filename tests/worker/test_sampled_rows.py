"""sampled_rows: the hidden rows at the builder's logits_indices, the rows as they are when those
are every row in order (a batch of one-token decodes)."""

import numpy as np
import pytest
import torch

from corellm.worker.sampled_rows import sampled_rows


@pytest.mark.parametrize("indices", [
    [0, 1, 2, 3, 4],         # five one-token decodes: every row
    [4],                      # one prefill of five tokens: its last
    [1, 4],                   # two prefills: each one's last
    [0, 1, 2, 4],             # a decode verifying drafts beside a prefill
    [0, 2, 3, 4],             # the last index n - 1 but fewer than n rows
    [],                       # nothing sampled (every request mid-prefill)
])
@pytest.mark.parametrize("as_numpy", [True, False])
def test_matches_a_gather(indices, as_numpy):
    hidden = torch.randn(5, 8)
    idx = np.array(indices, dtype=np.int32)
    got = sampled_rows(hidden, idx if as_numpy else torch.from_numpy(idx))
    assert torch.equal(got, hidden[torch.from_numpy(idx).long()])


def test_every_row_in_order_is_not_copied():
    hidden = torch.randn(3, 8)
    assert sampled_rows(hidden, np.arange(3, dtype=np.int32)) is hidden
    assert sampled_rows(hidden, np.array([2], dtype=np.int32)).data_ptr() != hidden.data_ptr()
