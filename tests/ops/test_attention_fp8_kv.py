"""8-bit KV caches (float8_e4m3fn, float8_e5m2: vLLM's kv_cache_dtype fp8 / fp8_e5m2) on the CPU:
reshape_and_cache writes exactly the bytes torch's conversion gives for the bf16 keys and values
saturated at the format's largest finite value (subnormals, rounding ties and overflow included;
a prefill's consecutive slots and a decode's lone ones); paged_attention over such a cache is
bit-identical, on every instruction-set path, to the same kernel over the cache widened to bf16 by
torch (each fp8 value is a bf16 one), and so within bf16's tolerance of the float64 reference; wrong
dtypes are refused by name."""

from __future__ import annotations

import pytest
import torch

from corellm import ops
from corellm.native import _core
from tests.ops import reference as ref
from tests.ops.test_attention import CASES, make_batch

ISAS = _core.kernels.supported_cpu_isas()
FP8 = [torch.float8_e4m3fn, torch.float8_e5m2]


def widened(cache: torch.Tensor) -> torch.Tensor:
    return cache.to(torch.bfloat16)


def spread_values(n: int, seed: int) -> torch.Tensor:
    """bf16 values from far below the formats' subnormals to far above their largest finite ones,
    both signs, with zeros and infinities."""
    g = torch.Generator().manual_seed(seed)
    magnitude = torch.exp2(torch.empty(n).uniform_(-24, 20, generator=g))
    sign = torch.where(torch.rand(n, generator=g) < 0.5, -1.0, 1.0)
    x = (sign * magnitude).to(torch.bfloat16)
    x[:4] = torch.tensor([0.0, -0.0, float("inf"), float("-inf")])
    return x


@pytest.mark.parametrize("fp8", FP8)
@pytest.mark.parametrize("slots_kind", ["consecutive", "scattered"])
def test_written_bytes_are_torchs_saturated_conversion(fp8, slots_kind):
    num_blocks, kv_heads, head_size, block_size = 12, 3, 64, 16
    n = 90
    x = spread_values(2 * n * kv_heads * head_size, seed=1 + FP8.index(fp8))
    key, value = x.view(2, n, kv_heads * head_size).unbind(0)
    slots = torch.arange(5, 5 + n) if slots_kind == "consecutive" else torch.randperm(num_blocks * block_size)[:n]
    k_shape, v_shape = ops.kv_cache_shapes(num_blocks, kv_heads, head_size, block_size, fp8)
    key_cache, value_cache = torch.zeros(k_shape, dtype=fp8), torch.zeros(v_shape, dtype=fp8)
    ops.reshape_and_cache(key, value, key_cache, value_cache, slots.to(torch.int32))
    k, v = ops.unpack_kv_cache(key_cache, value_cache)
    largest = torch.finfo(fp8).max
    for name, got, given in (("key", k, key), ("value", v, value)):
        got = got.reshape(num_blocks * block_size, -1)[slots]
        want = given.float().clamp(-largest, largest).to(fp8)
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8)), f"{name}s differ from torch's conversion"


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("fp8", FP8)
@pytest.mark.parametrize("case", range(len(CASES)))
def test_attention_is_the_bf16_kernels_on_the_widened_cache(case, fp8, isa):
    seqs, heads, kv_heads, head_size, block_size = CASES[case]
    kc, vc, table, seq_lens, qsl = make_batch(seqs, kv_heads, head_size, block_size, fp8, seed=case)
    q = torch.randn(int(qsl[-1]), heads * head_size).to(torch.bfloat16)
    scale = head_size**-0.5
    got = ops.paged_attention(q, kc, vc, table, seq_lens, qsl, scale, cpu_isa=isa)
    same_in_bf16 = ops.paged_attention(q, widened(kc), widened(vc), table, seq_lens, qsl, scale, cpu_isa=isa)
    assert torch.equal(got, same_in_bf16)
    want = ref.paged_attention(q, kc, vc, table, seq_lens, qsl, scale)
    torch.testing.assert_close(got.double(), want, atol=1.5e-2, rtol=2e-2)


@pytest.mark.parametrize("isa", ISAS)
def test_windows_soft_caps_and_sinks_on_an_fp8_cache(isa):
    seqs = [(80, 80), (200, 1), (120, 30), (300, 300)]
    kc, vc, table, seq_lens, qsl = make_batch(seqs, 2, 64, 16, torch.float8_e4m3fn, seed=7)
    q = torch.randn(int(qsl[-1]), 4 * 64).to(torch.bfloat16)
    sinks = torch.linspace(-3.0, 4.0, 4)
    for kw in (dict(sliding_window=50), dict(softcap=5.0), dict(sinks=sinks)):
        got = ops.paged_attention(q, kc, vc, table, seq_lens, qsl, 0.5, cpu_isa=isa, **kw)
        same_in_bf16 = ops.paged_attention(q, widened(kc), widened(vc), table, seq_lens, qsl, 0.5, cpu_isa=isa, **kw)
        assert torch.equal(got, same_in_bf16), kw
        torch.testing.assert_close(got.double(), ref.paged_attention(q, kc, vc, table, seq_lens, qsl, 0.5, **kw),
                                   atol=1.5e-2, rtol=2e-2)


def test_an_fp8_cache_takes_bf16_only():
    kc, vc, table, seq_lens, qsl = make_batch([(10, 10)], 1, 64, 16, torch.float8_e4m3fn, seed=0)
    with pytest.raises(ValueError, match="paged_attention: q must be torch.bfloat16, got torch.float32"):
        ops.paged_attention(torch.randn(10, 128), kc, vc, table, seq_lens, qsl, 0.125)
    key = torch.randn(2, 64)
    with pytest.raises(ValueError, match="reshape_and_cache: key must be torch.bfloat16, got torch.float32"):
        ops.reshape_and_cache(key, key, kc, vc, torch.tensor([0, 1], dtype=torch.int32))
    with pytest.raises(ValueError, match="value_cache must be torch.float8_e4m3fn"):
        ops.reshape_and_cache(key.bfloat16(), key.bfloat16(), kc, vc.view(torch.float8_e5m2),
                              torch.tensor([0, 1], dtype=torch.int32))
