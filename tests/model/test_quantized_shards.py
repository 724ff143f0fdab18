"""A quantized tensor's shards for tensor parallelism (QuantizedTensor.rows / columns / padded, cut
in the packed layout): each dequantizes to the same slice of the whole tensor, bit for bit, and
computes the same products (bit for bit); cuts off the panels (16 rows) or blocks (32 / 256 columns) are None,
so that the caller dequantizes instead."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from corellm.model.quantized_tensor import QuantizedTensor
from corellm.native import _core
from tests import quant_blocks


def make(type_name: str, n: int, k: int) -> QuantizedTensor:
    rng = np.random.default_rng(len(type_name) + n)
    rows = quant_blocks.quantize(rng.standard_normal((n, k)).astype(np.float32) * 0.1, type_name)
    return QuantizedTensor.pack(int(getattr(gguf.GGMLQuantizationType, type_name)), rows, (n, k))


@pytest.mark.parametrize("type_name", quant_blocks.ALL_TYPES)
def test_shards_hold_the_same_values(type_name):
    k = 768  # three K-type super-blocks, 24 legacy blocks
    whole = make(type_name, 88, k)
    full = whole.dequantize(torch.float32)
    block = _core.kernels.quant_block_elements(whole.ggml_type)
    rows = whole.rows(32, 80)  # panels 2..4, the last one holding rows past the cut
    assert rows.shape == (48, k) and torch.equal(rows.dequantize(torch.float32), full[32:80])
    tail = whole.rows(80, 88)  # the last, partial panel
    assert torch.equal(tail.dequantize(torch.float32), full[80:88])
    cols = whole.columns(block, 3 * block)
    assert cols.shape == (88, 2 * block) and torch.equal(cols.dequantize(torch.float32), full[:, block : 3 * block])
    padded = tail.padded(40)
    assert padded.shape == (40, k)
    assert torch.equal(padded.dequantize(torch.float32)[:8], full[80:88])
    assert not padded.dequantize(torch.float32)[16:].any()  # appended panels: zero blocks
    # The column shard's product is the whole tensor's on x with zeros outside the shard's
    # columns (zero activation blocks add exact zeros, the others come in the same order).
    x = torch.randn(5, 2 * block)
    x_whole = torch.zeros(5, k)
    x_whole[:, block : 3 * block] = x
    y_shard, y_whole = torch.empty(5, 88), torch.empty(5, 88)
    cols.matmul_into(x, y_shard)
    whole.matmul_into(x_whole, y_whole)
    assert torch.equal(y_shard, y_whole)


@pytest.mark.parametrize("type_name", ["Q8_0", "Q4_K"])
def test_cuts_off_the_panels_or_blocks_are_refused(type_name):
    whole = make(type_name, 48, 512)
    assert whole.rows(8, 40) is None  # not at a panel boundary
    assert whole.rows(0, 49) is None
    assert whole.columns(0, 16) is None  # part of a block
    if type_name in quant_blocks.K_TYPES:
        assert whole.columns(0, 128) is None  # a K type's block is 256 wide
    with pytest.raises(ValueError, match="cannot pad"):
        whole.padded(32)
