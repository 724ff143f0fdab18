"""bf16_gemm_gated, a gated MLP's gate_up projection and its activation in one pass (amx, avx512bf16,
avx512): bit for bit bf16_gemm then silu_and_mul / gelu_tanh_and_mul on the same path — every tile
and row-block remainder, more than one row chunk, x read in place or copied (amx), a bias, strided x
and out, the rows split between the threads (x_rows="by_thread") or the panels — and the paths or
shapes without the fused pass refused, naming them."""

from __future__ import annotations

import pytest
import torch

from corellm import _core, ops

k = _core.kernels
needs_amx = pytest.mark.skipif("amx" not in k.supported_cpu_isas(), reason="the amx path's row split")
FUSED_ISAS = [isa for isa in ("amx", "avx512bf16", "avx512") if isa in k.supported_cpu_isas()]
fused_isas = pytest.mark.parametrize("isa", [
    pytest.param(isa, marks=pytest.mark.skipif(isa not in FUSED_ISAS, reason=f"this CPU has no {isa}"))
    for isa in ("amx", "avx512bf16", "avx512")])
ACTIVATIONS = {"silu": ops.silu_and_mul, "gelu_tanh": ops.gelu_tanh_and_mul}


def pack(w: torch.Tensor) -> torch.Tensor:
    n, kk = w.shape
    packed = torch.full((k.bf16_gemm_packed_size(n, kk),), float("nan"), dtype=torch.bfloat16)
    k.bf16_gemm_pack(w.data_ptr(), packed.data_ptr(), n, kk)
    return packed


def gated(x: torch.Tensor, packed: torch.Tensor, n: int, bias: torch.Tensor | None, activation: str,
          out: torch.Tensor | None = None, isa: str = "amx") -> torch.Tensor:
    m, kk = x.shape
    if out is None:
        out = torch.empty(m, n // 2, dtype=torch.bfloat16)
    k.bf16_gemm_gated(x.data_ptr(), x.stride(0), packed.data_ptr(), 0 if bias is None else bias.data_ptr(),
                      out.data_ptr(), out.stride(0), m, n, kk, activation=activation, isa=isa)
    return out


def unfused(x: torch.Tensor, packed: torch.Tensor, n: int, bias: torch.Tensor | None, activation: str,
            isa: str = "amx") -> torch.Tensor:
    m, kk = x.shape
    y = torch.empty(m, n, dtype=torch.bfloat16)
    k.bf16_gemm(x.data_ptr(), x.stride(0), packed.data_ptr(), 0 if bias is None else bias.data_ptr(), y.data_ptr(),
                n, m, n, kk, isa=isa)
    return ACTIVATIONS[activation](y)


def operands(m: int, n: int, kk: int, bias: bool, seed: int):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, kk, generator=g).bfloat16()
    w = (torch.randn(n, kk, generator=g) / kk**0.5).bfloat16()
    b = torch.randn(n, generator=g).bfloat16() if bias else None
    return x, w, b


@fused_isas
@pytest.mark.parametrize("activation", ["silu", "gelu_tanh"])
@pytest.mark.parametrize("m", [1, 2, 7, 12, 15, 16, 17, 31, 32, 33, 64, 130, 300])
@pytest.mark.parametrize("n, kk, bias", [(64, 96, False), (128, 70, True), (3072, 576, False), (192, 1536, True)])
def test_fused_pass_is_the_gemm_then_the_activation_bit_for_bit(m, n, kk, bias, activation, isa):
    x, w, b = operands(m, n, kk, bias, seed=m * n + kk)
    packed = pack(w)
    want = unfused(x, packed, n, b, activation, isa)
    assert torch.equal(gated(x, packed, n, b, activation, isa=isa), want)
    # and near the float64 reference: act(g) * u of the rounded halves
    y = torch.nn.functional.linear(x.double(), w.double(), None if b is None else b.double()).bfloat16().double()
    gate, up = y[:, : n // 2], y[:, n // 2 :]
    act = torch.nn.functional.silu(gate) if activation == "silu" else torch.nn.functional.gelu(gate, approximate="tanh")
    torch.testing.assert_close(want.double(), act * up, atol=0.05, rtol=0.02)


@fused_isas
def test_several_row_chunks_strided_x_and_out_and_rows_independent_of_the_batch(isa):
    m, n, kk = 1400, 256, 576  # 576-wide rows: chunks of at most 672 rows (amx), 128 (the vector paths)
    x, w, b = operands(m, n, kk, True, seed=7)
    packed = pack(w)
    wide_x = torch.zeros(m, kk + 32, dtype=torch.bfloat16)
    wide_x[:, :kk] = x
    out = torch.full((m, n // 2 + 48), 7.0, dtype=torch.bfloat16)
    gated(wide_x[:, :kk], packed, n, b, "silu", out=out[:, : n // 2], isa=isa)
    assert torch.equal(out[:, : n // 2], unfused(x, packed, n, b, "silu", isa))
    assert torch.all(out[:, n // 2 :] == 7.0)  # nothing written past the row's d columns
    for row in (0, 33, 700, m - 1):
        assert torch.equal(gated(x[row : row + 1], packed, n, b, "silu", isa=isa), out[row : row + 1, : n // 2])


def test_paths_and_shapes_without_the_fused_pass_are_refused_naming_them():
    assert not k.bf16_gemm_gated_fused(3072, isa="avx2")
    x, w, _ = operands(4, 96, 64, False, seed=1)
    packed = pack(w)
    with pytest.raises(ValueError, match="no fused pass on the avx2 path for n=96"):
        gated(x, packed, 96, None, "silu", isa="avx2")
    for isa in FUSED_ISAS:
        assert k.bf16_gemm_gated_fused(3072, isa=isa)
        assert not k.bf16_gemm_gated_fused(96, isa=isa)  # halves of 48 columns: not whole panels
        with pytest.raises(ValueError, match=f"no fused pass on the {isa} path for n=96"):
            gated(x, packed, 96, None, "silu", isa=isa)
    with pytest.raises(ValueError, match="activation must be 'silu', 'gelu_tanh' or 'gelu', got 'relu'"):
        gated(x, packed, 96, None, "relu")


@needs_amx
@pytest.mark.parametrize("m", [511, 512, 700, 1400])
def test_rows_split_between_the_threads_give_the_same_bits(m):
    """x_rows="by_thread" (x's rows written by the team, row-parallel): from 256 rows a thread the
    amx path splits the rows instead of the panels; every row's bits stay the same."""
    n, kk = 3072, 576
    x, w, b = operands(m, n, kk, True, seed=m)
    packed = pack(w)
    by_thread = torch.empty(m, n // 2, dtype=torch.bfloat16)
    k.bf16_gemm_gated(x.data_ptr(), kk, packed.data_ptr(), b.data_ptr(), by_thread.data_ptr(), n // 2, m, n, kk,
                      isa="amx", x_rows="by_thread")
    assert torch.equal(by_thread, gated(x, packed, n, b, "silu"))
    y_anywhere, y_by_thread = (torch.empty(m, n, dtype=torch.bfloat16) for _ in range(2))
    for y, where in ((y_anywhere, "anywhere"), (y_by_thread, "by_thread")):
        k.bf16_gemm(x.data_ptr(), kk, packed.data_ptr(), b.data_ptr(), y.data_ptr(), n, m, n, kk, isa="amx",
                    x_rows=where)
    assert torch.equal(y_by_thread, y_anywhere)
    with pytest.raises(ValueError, match="x_rows must be 'anywhere' or 'by_thread', got 'mine'"):
        k.bf16_gemm(x.data_ptr(), kk, packed.data_ptr(), 0, y_anywhere.data_ptr(), n, m, n, kk, x_rows="mine")


@pytest.mark.parametrize("n, bias", [(256, False), (128, True), (96, False)])  # 96: no fused pass (48 a half)
def test_linear_gated_is_the_linear_then_the_activation(n, bias):
    """Linear.gated (an encoder's SwiGLU: Nomic BERT; GeGLU: ModernBERT) on a packed bf16 weight: the fused pass
    where the process's path has one, else the GEMM then ops.silu_and_mul; the same bits either way."""
    from corellm.model.layers import Linear

    x, w, b = operands(37, n, 64, bias, seed=5)
    linear = Linear(n, 64, bias, torch.bfloat16, torch.device("cpu"))
    linear.load(0, w)
    if bias:
        linear.bias.copy_(b)
    linear.finalize()
    assert linear.packed is not None
    assert torch.equal(linear.gated(x, "silu"), ops.silu_and_mul(linear(x)))
    assert torch.equal(linear.gated(x, "gelu_tanh"), ops.gelu_tanh_and_mul(linear(x)))


@fused_isas
@pytest.mark.parametrize("m", [1, 16, 33, 300])
@pytest.mark.parametrize("n, kk, bias", [(128, 70, True), (2304, 768, False)])  # 2304: ModernBERT-base's Wi
def test_the_erf_gelu_pass_is_gelu_of_the_rounded_gate_times_up(m, n, kk, bias, isa):
    """activation "gelu" (ModernBERT's GeGLU, GELU's erf form; no unfused kernel has it): each value
    within one bf16 step of float64's gelu(g) * u, g and u bf16_gemm's own rounded halves; a row
    the same alone as in the batch."""
    x, w, b = operands(m, n, kk, bias, seed=m + n)
    packed = pack(w)
    y = torch.empty(m, n, dtype=torch.bfloat16)
    k.bf16_gemm(x.data_ptr(), x.stride(0), packed.data_ptr(), 0 if b is None else b.data_ptr(), y.data_ptr(),
                n, m, n, kk, isa=isa)
    g, u = y[:, :n // 2].double(), y[:, n // 2:].double()
    want = torch.nn.functional.gelu(g) * u
    got = gated(x, packed, n, b, "gelu", isa=isa).double()
    step = want.abs().clamp(min=1e-30) * 2.0**-7  # one bf16 step of the value (8 bits of mantissa)
    assert ((got - want).abs() <= step + 1e-6).all(), (got - want).abs().max()
    assert torch.equal(gated(x[-1:], packed, n, b, "gelu", isa=isa), gated(x, packed, n, b, "gelu", isa=isa)[-1:])
