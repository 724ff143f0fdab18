"""ops.lora_add (the LoRA update kernel) against a float64 reference, on every instruction-set path
this CPU runs: ranks and widths that fill whole registers and ones that leave a partial one, bf16
and fp32; each token's result bit-identical alone, in any batch and on every path; slots -1 and
adapters without the projection left alone; bad arguments refused by name."""

from __future__ import annotations

import pytest
import torch

from corellm import _core, ops
from corellm.lora.lora_adapter import LoraAdapter, LoraPart

ISAS = _core.kernels.supported_cpu_isas()


def _adapter(k: int, parts: list[tuple[int, int]], rank: int, seed: int,
             dtype: torch.dtype = torch.float32) -> LoraAdapter:
    """One layer's `qkv` update: parts (col_offset, cols), each its own A, B and scale."""
    g = torch.Generator().manual_seed(seed)
    made = [LoraPart(off, (torch.randn(k, rank, generator=g) * 0.1).to(dtype),
                     (torch.randn(rank, cols, generator=g) * 0.1).to(dtype), 0.5 + i)
            for i, (off, cols) in enumerate(parts)]
    return LoraAdapter("t", "/", rank, seed, [{"qkv": made}])


def _reference(y, x, slots, adapters):
    out = y.double().clone()
    for t, s in enumerate(slots.tolist()):
        if s < 0 or adapters[s] is None:
            continue
        for p in adapters[s].layers[0].get("qkv", []):
            u = p.scale * (x[t].double() @ p.a_t.double())
            out[t, p.col_offset:p.col_offset + p.b_t.shape[1]] += u @ p.b_t.double()
    return out


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype,weights", [(torch.bfloat16, torch.bfloat16), (torch.bfloat16, torch.float32),
                                           (torch.float32, torch.float32)])
@pytest.mark.parametrize("k,rank,parts", [(64, 16, [(0, 64), (64, 32)]), (40, 5, [(3, 21)]), (96, 40, [(0, 77), (80, 48)])])
def test_matches_float64_and_is_the_same_alone_batched_and_on_every_path(isa, dtype, weights, k, rank, parts):
    n = max(off + cols for off, cols in parts) + 3
    adapters = [_adapter(k, parts, rank, 1, weights), None, _adapter(k, parts, max(1, rank // 2), 2, weights)]
    g = torch.Generator().manual_seed(0)
    m = 11
    x = torch.randn(m, k, generator=g).to(dtype)
    y0 = torch.randn(m, n, generator=g).to(dtype)
    slots = torch.tensor([0, 2, -1, 0, 1, 2, 0, 0, 0, 2, 0], dtype=torch.int32)
    by_slot = [None if a is None else a.linear(0, "qkv") for a in adapters]
    y = ops.lora_add(y0.clone(), x, slots, by_slot, cpu_isa=isa)
    tol = dict(atol=2e-2, rtol=2e-2) if dtype == torch.bfloat16 else dict(atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(y.double(), _reference(y0, x, slots, adapters), **tol)
    assert torch.equal(y[2], y0[2]) and torch.equal(y[4], y0[4])  # no adapter; an empty slot
    for t in range(m):  # each token alone gives the same bits
        alone = ops.lora_add(y0[t:t + 1].clone(), x[t:t + 1], slots[t:t + 1].contiguous(), by_slot, cpu_isa=isa)
        assert torch.equal(alone[0], y[t]), f"token {t}"
    for other in ISAS:
        assert torch.equal(ops.lora_add(y0.clone(), x, slots, by_slot, cpu_isa=other), y), other


def test_bad_arguments_are_refused_by_name():
    a = _adapter(8, [(0, 8)], 2, 1)
    lin = a.linear(0, "qkv")
    y, x = torch.zeros(2, 8), torch.zeros(2, 8)
    with pytest.raises(ValueError, match="a token names slot 1 of 1"):
        ops.lora_add(y, x, torch.tensor([0, 1], dtype=torch.int32), [lin])
    with pytest.raises(ValueError, match="takes rows of 8, x's are 6"):
        ops.lora_add(y, torch.zeros(2, 6), torch.tensor([0, 0], dtype=torch.int32), [lin])
    with pytest.raises(ValueError, match="columns inside"):
        ops.lora_add(torch.zeros(2, 4), x, torch.tensor([0, 0], dtype=torch.int32), [lin])
    with pytest.raises(ValueError, match="slots must be"):
        ops.lora_add(y, x, torch.tensor([0, 0]), [lin])
